// A device that fails mid-reshard or mid-collective: every other rank must end with a CommError
// naming it, in bounded time, and not hang. reshard: device 1 is the root of a chain broadcast
// to all other ranks; collective: an all-reduce over every rank. Device 1 either throws (passes a
// null source buffer to reshard; failure.sh runs the collective only with `exit`) or exits
// without a word.
//   failure_mpi mpi|ucx throw|exit TIMEOUT_SECONDS [reshard|collective]
// Prints one line per surviving rank: "rank R: CommError after S s: WHAT".
#include <meshcast/meshcast.h>
#include <meshcast/mpi.h>
#ifdef MESHCAST_HAS_UCX
#include <meshcast/ucx.h>
#endif

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace meshcast;

namespace {

// Device 1's part: gone without a word, or `bad` throws and is reported.
int fail(const std::string& mode, const std::function<void()>& bad) {
  if (mode == "exit") _exit(3);
  try {
    bad();
  } catch (const Error& e) {
    std::printf("rank 1: threw %s\n", e.what());
  }
  return 3;
}

// A survivor's part: `good` must end with a CommError naming device 1, reported with its delay.
int survive(int me, const std::function<void()>& good) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    good();
    std::printf("rank %d: no error\n", me);
  } catch (const CommError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank %d: CommError after %.2f s: %s\n", me, s, e.what());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "mpi";
  const std::string mode = argc > 2 ? argv[2] : "throw";
  MpiOptions opt;
  opt.timeout_seconds = argc > 3 ? std::stod(argv[3]) : 5;
  opt.chunk_bytes = 1 << 16;
  MpiSession mpi(&argc, &argv, opt);
  Communicator* chosen = &mpi.world();
#ifdef MESHCAST_HAS_UCX
  std::unique_ptr<UcxSession> ucx;
  if (backend == "ucx")
    chosen =
        &(ucx = std::make_unique<UcxSession>(mpi, UcxOptions{opt.timeout_seconds, opt.chunk_bytes}))
             ->world();
#endif
  if (chosen->backend() != backend) return 2;
  Communicator& comm = *chosen;
  const int me = comm.rank(), n = comm.size();
  const std::string op = argc > 4 ? argv[4] : "reshard";
  if (op == "collective") {
    std::vector<float> buf(1 << 20, 1.0f);
    auto run = [&](std::int64_t count) {
      all_reduce(comm.world(), buf.data(), buf.data(), count, DType::f32, ReduceOp::Sum);
    };
    if (me == 1) return fail(mode, [&] { run(-1); });  // a negative count: refused
    return survive(me, [&] { run(static_cast<std::int64_t>(buf.size())); });
  }
  const Shape shape{1 << 20};  // 4 MiB of f32
  const Layout src = Layout::parse(shape, DType::f32, "1@1:R");
  const Layout dst = Layout::parse(
      shape, DType::f32,
      std::to_string(n - 1) + "@[0," + (n > 2 ? "2-" + std::to_string(n - 1) : "") + "]:R");
  PlanOptions po;
  po.strategy = Strategy::Broadcast;
  const Plan p = plan(src, dst, Topology::single_host(), po);
  std::vector<float> out(me == 1 ? 0 : static_cast<std::size_t>(shape[0]));
  // Device 1 passes no source buffer: the executor throws.
  if (me == 1) return fail(mode, [&] { reshard(p, comm, nullptr, nullptr); });
  return survive(me, [&] { reshard(p, comm, nullptr, out.data()); });
}
