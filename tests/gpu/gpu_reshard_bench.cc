// One-GPU benchmark of the NCCL transport's data paths against cudaMemcpy, in nccl-tests' table
// format. On a world of one rank (a TcpBootstrap of size 1, no launcher):
//   copy     comm.copy of a strided box (the left half of a row-major matrix's columns) into the
//            right half of another: the copy kernel
//   self     the same boxes sent and received by the rank itself in one batch: pack kernel,
//            NCCL, unpack kernel
//   reshard  reshard() of a one-device plan (a local copy of the whole tile)
// Each row: bytes moved, elements (f32), mean time per operation, algbw = busbw (a copy moves
// each byte once), #wrong (every element of the target buffer checked on the host, outside the
// box included), and the time of cudaMemcpy (device to device, contiguous) of the same bytes
// over the operation's. Operations and baselines are timed alike: launch, then wait for the
// stream, per iteration.
//   gpu_reshard_bench [--max-bytes N] [--cols C]   sizes from 64 KiB by 4x up to N (default
//   1 GiB); boxes of C columns (default 1024: rows of 4 KiB) in matrices of 2C. Narrow boxes
//   (C = 1: one f32 per row) are the kernels' worst case: no access wider than an element.
// MESHCAST_BENCH_SMOKE=1 (bench/smoke.h): sizes up to 1 MiB, few iterations. Exit status 1 on any
// wrong element, 77 where no GPU can be used.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "args.h"
#include "meshcast/bootstrap.h"
#include "meshcast/error.h"
#include "meshcast/nccl.h"
#include "meshcast/plan.h"
#include "meshcast/reshard.h"
#include "meshcast/testing.h"
#include "smoke.h"

using namespace meshcast;

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw InternalError("cuda", std::string(what) + ": " + cudaGetErrorString(e));
}

// Mean seconds of `op` over `iters` runs after `warmup` ones.
double seconds_per(const std::function<void()>& op, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) op();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) op();
  return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
}

float value(std::int64_t i) { return static_cast<float>(i % 16000057); }  // exact in f32
constexpr float kUntouched = -1;

struct Row {
  const char* op;
  double seconds;
  std::int64_t wrong;
};

class Bench {
 public:
  Bench(NcclSession& nccl, int iters, std::int64_t cols)
      : nccl_(nccl), comm_(nccl.world()), iters_(iters), cols_(cols) {
    check(cudaStreamCreate(&stream_), "cudaStreamCreate");
  }
  ~Bench() { (void)cudaStreamDestroy(stream_); }  // teardown: nothing to report

  // Rows for boxes of `rows` x cols_ f32, inside matrices of rows x 2 cols_.
  std::vector<Row> run(std::int64_t rows, double& memcpy_seconds) {
    const std::int64_t kCols = cols_;
    const std::int64_t elems = rows * kCols, whole = 2 * elems;
    const std::size_t bytes = static_cast<std::size_t>(elems) * sizeof(float);
    std::vector<float> src(static_cast<std::size_t>(whole)), init(src.size(), kUntouched);
    for (std::int64_t i = 0; i < whole; ++i) src[static_cast<std::size_t>(i)] = value(i);
    auto dsrc = nccl_.allocate(src.size() * sizeof(float));
    auto ddst = nccl_.allocate(src.size() * sizeof(float));
    nccl_.upload(src.data(), dsrc.get(), src.size() * sizeof(float));
    const Region from{dsrc.get(), sizeof(float), {rows, 2 * kCols}, {0, 0}, {rows, kCols}};
    const Region to{ddst.get(), sizeof(float), {rows, 2 * kCols}, {0, kCols}, {rows, kCols}};
    // Each element of the target's right half holds the source's left-half element of its row.
    auto wrong_in_box = [&] {
      std::vector<float> out(src.size());
      nccl_.download(ddst.get(), out.data(), out.size() * sizeof(float));
      std::int64_t wrong = 0;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < 2 * kCols; ++c) {
          const float want = c < kCols ? kUntouched : value(r * 2 * kCols + c - kCols);
          wrong += out[static_cast<std::size_t>(r * 2 * kCols + c)] != want;
        }
      return wrong;
    };
    auto reset = [&] { nccl_.upload(init.data(), ddst.get(), init.size() * sizeof(float)); };

    std::vector<Row> out;
    reset();
    const double copy = time([&] { comm_.copy(from, to); });
    out.push_back({"copy", copy, wrong_in_box()});

    reset();
    const double self = time([&] {
      comm_.begin_batch();
      Request reqs[] = {comm_.isend(from, 0, 0), comm_.irecv(to, 0, 0)};
      comm_.end_batch();
      comm_.wait_all(reqs);
    });
    out.push_back({"self", self, wrong_in_box()});

    // The same bytes as one tile, resharded between two layouts of the one device.
    const Layout a = Layout::parse({rows, kCols}, DType::f32, "1@0:RR");
    const Layout b = Layout::parse({rows, kCols}, DType::f32, "1@0:RS0");
    const Plan p = plan(a, b);
    std::vector<std::byte> tile(bytes);
    fill_source(a, 0, tile.data());
    nccl_.upload(tile.data(), dsrc.get(), bytes);
    const double resh = time([&] { reshard(p, comm_, dsrc.get(), ddst.get()); });
    nccl_.download(ddst.get(), tile.data(), bytes);
    out.push_back({"reshard", resh, count_mismatches(b, 0, tile.data())});

    memcpy_seconds = time([&] {
      check(cudaMemcpyAsync(ddst.get(), dsrc.get(), bytes, cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync");
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    });
    return out;
  }

 private:
  double time(const std::function<void()>& op) { return seconds_per(op, 3, iters_); }

  NcclSession& nccl_;
  Communicator& comm_;
  int iters_;
  std::int64_t cols_;
  cudaStream_t stream_ = nullptr;
};

int run(int argc, char** argv) {
  const bool smoke = meshcast::bench::smoke_mode();
  std::size_t max_bytes = smoke ? std::size_t{1} << 20 : std::size_t{1} << 30;
  std::int64_t cols = 1024;
  meshcast::bench::Args("gpu_reshard_bench", "gpu_reshard_bench")
      .number("--max-bytes", max_bytes, 64 << 10, "the largest size (sizes from 64 KiB by 4x)")
      .number("--cols", cols, 1, "box columns, f32 (rows of 4*N bytes in rows of 8*N; 1 to 16384)")
      .parse(argc, argv);
  if (cols > 16384) {
    std::fprintf(stderr, "gpu_reshard_bench: --cols: at most 16384 (a row within 64 KiB)\n");
    return 2;
  }
  int gpus = 0;
  const cudaError_t e = cudaGetDeviceCount(&gpus);
  if (e != cudaSuccess || gpus == 0) {
    std::printf("gpu_reshard_bench: SKIP: no usable GPU (cudaGetDeviceCount: %s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    return 77;
  }
  TcpBootstrap boot("127.0.0.1", 29500, 0, 1);  // one rank: no socket
  std::unique_ptr<NcclSession> session;
  try {
    session = std::make_unique<NcclSession>(boot);
  } catch (const Error& err) {  // a GPU that NCCL cannot use: nothing to measure
    if (std::string_view(err.what()).find("no CUDA device") == std::string_view::npos) throw;
    std::printf("gpu_reshard_bench: SKIP: %s\n", err.what());
    return 77;
  }
  NcclSession& nccl = *session;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf(
      "# gpu_reshard_bench: %s, NCCL transport, 1 rank; f32 boxes of %lld columns in "
      "matrices of %lld\n",
      prop.name, static_cast<long long>(cols), static_cast<long long>(2 * cols));
  std::printf("# %12s %12s %8s %10s %12s %12s %8s %11s %10s\n", "size(B)", "count", "op",
              "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "memcpy(us)", "vs memcpy");
  Bench bench(nccl, smoke ? 3 : 20, cols);
  std::int64_t wrong = 0;
  double bw_sum = 0;
  int rows_printed = 0;
  for (std::size_t bytes = std::size_t{64} << 10; bytes <= max_bytes; bytes *= 4) {
    const auto rows = static_cast<std::int64_t>(bytes / (cols * sizeof(float)));
    const auto box = static_cast<std::size_t>(rows * cols) * sizeof(float);
    double memcpy_s = 0;
    for (const Row& r : bench.run(rows, memcpy_s)) {
      const double gbs = static_cast<double>(box) / r.seconds / 1e9;
      std::printf("  %12zu %12zu %8s %10.2f %12.2f %12.2f %8lld %11.2f %10.2f\n", box,
                  box / sizeof(float), r.op, r.seconds * 1e6, gbs, gbs,
                  static_cast<long long>(r.wrong), memcpy_s * 1e6, memcpy_s / r.seconds);
      wrong += r.wrong;
      bw_sum += gbs;
      ++rows_printed;
    }
  }
  std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong),
              wrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %.3f\n", rows_printed ? bw_sum / rows_printed : 0.0);
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_reshard_bench: %s\n", e.what());
    return 1;
  }
}
