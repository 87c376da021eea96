// The NCCL transport on one GPU and one rank: the copy, zero and add kernels on strided boxes
// of every dtype, a send and a receive of strided boxes to itself in one batch (pack, NCCL,
// unpack), a broadcast, a barrier and single-device reshards, each checked element by element
// against the same operation on host memory. Skips where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "meshcast/bootstrap.h"
#include "meshcast/error.h"
#include "meshcast/nccl.h"
#include "meshcast/plan.h"
#include "meshcast/reshard.h"
#include "meshcast/testing.h"

namespace meshcast {
namespace {

// One session for the whole binary (a communicator takes a while to start), torn down before
// the CUDA runtime is: at the end of the test program, not in a static destructor.
struct Gpu {
  std::unique_ptr<TcpBootstrap> boot;
  std::unique_ptr<NcclSession> nccl;
  std::string why_not;  // set when there is no session
};

Gpu& gpu() {
  static Gpu g = [] {
    Gpu s;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      s.why_not = std::string("no usable GPU here (cudaGetDeviceCount: ") +
                  (e != cudaSuccess ? cudaGetErrorString(e) : "no device") + ")";
      return s;
    }
    try {
      s.boot = std::make_unique<TcpBootstrap>("127.0.0.1", 29500, 0, 1);  // size 1: no socket
      s.nccl = std::make_unique<NcclSession>(*s.boot, NcclOptions{30});
    } catch (const Error& err) {
      if (std::string_view(err.what()).find("no CUDA device") == std::string_view::npos) throw;
      s.nccl.reset();
      s.why_not = std::string("no usable GPU: ") + err.what();
    }
    return s;
  }();
  return g;
}

class GpuEnvironment : public testing::Environment {
 public:
  void TearDown() override {
    gpu().nccl.reset();
    gpu().boot.reset();
  }
};
[[maybe_unused]] const auto* const kEnvironment =
    testing::AddGlobalTestEnvironment(new GpuEnvironment);

// A GPU copy of host bytes (kept alive by the returned pointer), and bytes of one brought back.
std::shared_ptr<void> upload_to(NcclSession& nccl, const std::vector<std::byte>& host) {
  auto d = nccl.allocate(host.size());
  nccl.upload(host.data(), d.get(), host.size());
  return d;
}
std::vector<std::byte> download_from(NcclSession& nccl, const std::shared_ptr<void>& d,
                                     std::size_t bytes) {
  std::vector<std::byte> host(bytes);
  nccl.download(d.get(), host.data(), bytes);
  return host;
}

class NcclSingle : public testing::Test {
 protected:
  void SetUp() override {
    if (!gpu().nccl) GTEST_SKIP() << gpu().why_not;
  }
  NcclSession& nccl() { return *gpu().nccl; }
  Communicator& comm() { return nccl().world(); }

  std::shared_ptr<void> upload(const std::vector<std::byte>& host) {
    return upload_to(nccl(), host);
  }
  std::vector<std::byte> download(const std::shared_ptr<void>& d, std::size_t bytes) {
    return download_from(nccl(), d, bytes);
  }
};

std::int64_t volume(const std::vector<std::int64_t>& extent) {
  return std::accumulate(extent.begin(), extent.end(), std::int64_t{1}, std::multiplies<>());
}

// `elements` values of `t` starting at test_value(first): small integers, exact in every dtype.
std::vector<std::byte> values(DType t, std::int64_t elements, std::int64_t first) {
  const Layout whole = Layout::parse({elements + first}, t, "1@0:R");
  std::vector<std::byte> all(static_cast<std::size_t>(whole.bytes()));
  fill_source(whole, 0, all.data());
  const auto skip = static_cast<std::ptrdiff_t>(first * static_cast<std::int64_t>(dtype_size(t)));
  return {all.begin() + skip, all.end()};
}

Region with_base(Region r, void* base) {
  r.base = base;
  return r;
}

// A 3-D box inside a 3-D buffer and a box of the same counts in a differently shaped buffer:
// the kernels walk both strides.
const Region kFrom{nullptr, 1, {4, 5, 6}, {1, 1, 2}, {2, 3, 2}};
const Region kTo{nullptr, 1, {5, 4, 3}, {2, 0, 1}, {2, 3, 2}};

struct Buffers {
  Region from, to;  // on the host
  std::vector<std::byte> from_bytes, to_bytes;
};

// The add, copy and zero kernels on GPU copies of `host`'s buffers (its regions placed at the
// same offsets), each compared, every byte of both buffers, with the host's element-wise
// operation.
void add_copy_zero_as_on_host(NcclSession& nccl, Buffers& host, DType t) {
  auto download = [&](const std::shared_ptr<void>& d, std::size_t bytes) {
    return download_from(nccl, d, bytes);
  };
  auto from = upload_to(nccl, host.from_bytes), to = upload_to(nccl, host.to_bytes);
  auto on_device = [](const Region& r, const std::vector<std::byte>& bytes,
                      const std::shared_ptr<void>& d) {
    return with_base(r, static_cast<std::byte*>(d.get()) +
                            (static_cast<const std::byte*>(r.base) - bytes.data()));
  };
  const Region dfrom = on_device(host.from, host.from_bytes, from);
  const Region dto = on_device(host.to, host.to_bytes, to);
  Communicator& comm = nccl.world();
  comm.add(dfrom, dto, t);
  accumulate(host.from, host.to, t);
  EXPECT_EQ(download(to, host.to_bytes.size()), host.to_bytes) << "add";
  comm.copy(dfrom, dto);
  copy_region(host.from, host.to);
  EXPECT_EQ(download(to, host.to_bytes.size()), host.to_bytes) << "copy";
  comm.zero(dfrom);
  zero_region(host.from);
  EXPECT_EQ(download(from, host.from_bytes.size()), host.from_bytes) << "zero";
}

Buffers buffers(DType t) {
  Buffers b{kFrom, kTo, {}, {}};
  b.from.elem_size = b.to.elem_size = dtype_size(t);
  b.from_bytes = values(t, volume(kFrom.extent), 0);
  b.to_bytes = values(t, volume(kTo.extent), 11);  // other values than `from`'s
  b.from.base = b.from_bytes.data();
  b.to.base = b.to_bytes.data();
  return b;
}

TEST_F(NcclSingle, CopyZeroAddOnStridedBoxesOfEveryDtype) {
  for (DType t : kAllDTypes) {
    SCOPED_TRACE(to_string(t));
    Buffers host = buffers(t);
    add_copy_zero_as_on_host(nccl(), host, t);
  }
}

// Random boxes of random dtypes, ranks, extents, offsets and base alignments: the kernels pick
// the widest word the addresses allow (16 bytes down to one element), and each choice must give
// what the host's element-wise copy, sum and fill give, every byte of both buffers compared.
TEST_F(NcclSingle, RandomBoxesInEveryWordWidth) {
  std::mt19937_64 rng(20261128);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 300; ++trial) {
    const DType t = kAllDTypes[pick(0, std::size(kAllDTypes) - 1)];
    const auto es = static_cast<std::int64_t>(dtype_size(t));
    std::vector<std::int64_t> count(pick(1, 3));
    for (auto& c : count) c = pick(1, 9);
    if (pick(0, 1)) count.back() = (16 / es > 1 ? 16 / es : 1) * pick(1, 40);  // 16-byte rows
    auto region = [&](std::int64_t first, std::vector<std::byte>& bytes) {
      Region r{nullptr, static_cast<std::size_t>(es), {}, {}, count};
      for (std::int64_t c : count) {
        const std::int64_t extra = pick(0, 2) == 0 ? pick(1, 5) : 0;  // most merge
        r.extent.push_back(c + extra);
        r.offset.push_back(pick(0, extra));
      }
      const std::int64_t skip = pick(0, 3);  // base alignment: element, sometimes wider
      bytes = values(t, volume(r.extent) + skip, first);
      r.base = bytes.data() + skip * es;
      return r;
    };
    Buffers host;
    host.from = region(0, host.from_bytes);
    host.to = region(11, host.to_bytes);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " " << to_string(t));
    add_copy_zero_as_on_host(nccl(), host, t);
    if (HasFailure()) return;
  }
}

// Over 2^32 words (one-byte words: the box starts at an odd address), where the kernels index
// with 64 bits: a 4.3 GB strided copy, every byte compared (in chunks: host memory).
TEST_F(NcclSingle, CopyOfMoreThanFourBillionWords) {
  const std::int64_t cols = 2'150'000'000;
  Region from{nullptr, 1, {2, cols + 3}, {0, 1}, {2, cols}};
  Region to{nullptr, 1, {2, cols + 1}, {0, 0}, {2, cols}};
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  const auto need = static_cast<std::size_t>(volume(from.extent) + volume(to.extent));
  if (free < need + (std::size_t{1} << 30))
    GTEST_SKIP() << "needs " << need / 1e9 << " GB of GPU memory free, has " << free / 1e9;
  std::vector<std::byte> from_bytes(static_cast<std::size_t>(volume(from.extent)));
  for (std::size_t i = 0; i < from_bytes.size(); ++i)
    from_bytes[i] = static_cast<std::byte>(i * 131 % 251);
  std::vector<std::byte> to_bytes(static_cast<std::size_t>(volume(to.extent)), std::byte{7});
  auto dfrom = upload(from_bytes), dto = upload(to_bytes);
  comm().copy(with_base(from, dfrom.get()), with_base(to, dto.get()));
  from.base = from_bytes.data();
  to.base = to_bytes.data();
  copy_region(from, to);
  from_bytes = {};
  std::vector<std::byte> chunk(std::size_t{1} << 28);
  for (std::size_t at = 0; at < to_bytes.size(); at += chunk.size()) {
    const std::size_t n = std::min(chunk.size(), to_bytes.size() - at);
    nccl().download(static_cast<std::byte*>(dto.get()) + at, chunk.data(), n);
    ASSERT_EQ(std::memcmp(chunk.data(), to_bytes.data() + at, n), 0) << "bytes from " << at;
  }
}

// NCCL to this very rank: the batch issues the pair as one group. The boxes differ in shape
// (elements go in row-major order of each), as a plan's may.
TEST_F(NcclSingle, SendAndReceiveStridedBoxesToItselfInOneBatch) {
  Buffers host = buffers(DType::f32);
  Region flat{nullptr, 4, {3, 8}, {1, 2}, {2, 6}};  // 12 elements, like kFrom's box
  std::vector<std::byte> flat_bytes = values(DType::f32, volume(flat.extent), 5);
  flat.base = flat_bytes.data();
  auto from = upload(host.from_bytes), to = upload(flat_bytes);
  comm().begin_batch();
  Request reqs[] = {comm().isend(with_base(host.from, from.get()), 0, 7),
                    comm().irecv(with_base(flat, to.get()), 0, 7)};
  comm().end_batch();
  comm().wait_all(reqs);
  std::vector<std::byte> packed(host.from.bytes());
  pack(host.from, packed.data());
  unpack(packed.data(), flat);
  EXPECT_EQ(download(to, flat_bytes.size()), flat_bytes);
}

// The engine's local work is queued (Transport::copy, no settle) and a send posted after it
// must read what it wrote: through the in-place path (a contiguous box) and the packed one (a
// strided box). 64 MiB, so that a send not ordered after the copy would read stale bytes.
TEST_F(NcclSingle, QueuedCopiesComeBeforeTheSendsThatReadThem) {
  const std::int64_t rows = 4096, cols = 4096;
  const std::vector<std::byte> a = values(DType::f32, rows * cols, 3);
  for (const bool strided : {false, true}) {
    SCOPED_TRACE(strided ? "strided" : "contiguous");
    const std::int64_t width = strided ? 2 * cols : cols;
    auto da = upload(a);
    auto db = upload(std::vector<std::byte>(a.size() * (strided ? 2 : 1)));
    auto dc = upload(std::vector<std::byte>(a.size()));
    const Region ra{da.get(), 4, {rows, cols}, {0, 0}, {rows, cols}};
    const Region rb{db.get(), 4, {rows, width}, {0, 0}, {rows, cols}};
    const Region rc{dc.get(), 4, {rows, cols}, {0, 0}, {rows, cols}};
    comm().transport().copy(ra, rb);  // queued
    comm().begin_batch();
    Request reqs[] = {comm().isend(rb, 0, 9), comm().irecv(rc, 0, 9)};
    comm().end_batch();
    comm().wait_all(reqs);
    comm().transport().settle();
    EXPECT_TRUE(download(dc, a.size()) == a);
  }
}

TEST_F(NcclSingle, BroadcastAndBarrierOnAWorldOfOne) {
  Buffers host = buffers(DType::i32);
  auto from = upload(host.from_bytes);
  const int group[] = {0};
  Request r = comm().ibcast(with_base(host.from, from.get()), 0, group, 3);
  comm().wait(r);
  comm().barrier();
  EXPECT_EQ(download(from, host.from_bytes.size()), host.from_bytes) << "the root's box is kept";
}

// A one-device plan is one local copy of the tile: every dtype, a few shapes.
TEST_F(NcclSingle, SingleDeviceReshards) {
  const Shape shapes[] = {{0}, {1}, {37}, {64, 48}, {3, 5, 7, 2}};
  for (const Shape& shape : shapes)
    for (DType t : kAllDTypes) {
      std::string spec = "1@0:";
      for (std::size_t d = 0; d < shape.size(); ++d) spec += d == 0 ? "S0" : "R";
      const Layout src = Layout::parse(shape, t, "1@0:" + std::string(shape.size(), 'R'));
      const Layout dst = Layout::parse(shape, t, spec);
      SCOPED_TRACE(shape_str(shape) + " " + to_string(t));
      std::vector<std::byte> in(static_cast<std::size_t>(src.bytes()));
      fill_source(src, 0, in.data());
      auto din = upload(in), dout = nccl().allocate(in.size());
      reshard(plan(src, dst), comm(), din.get(), dout.get());
      const auto out = download(dout, in.size());
      EXPECT_EQ(count_mismatches(dst, 0, out.data()), 0);
    }
}

TEST_F(NcclSingle, RefusesWhatItCannotDo) {
  std::vector<std::byte> one(4);
  auto d = upload(one);
  const Region r = Region::contiguous(d.get(), 4);
  EXPECT_THROW(comm().isend(r, 1, 0), ValidationError) << "a peer outside the world";
  Region deep{d.get(), 1, std::vector<std::int64_t>(9, 1), std::vector<std::int64_t>(9, 0),
              std::vector<std::int64_t>(9, 1)};
  EXPECT_THROW(comm().copy(deep, deep), ValidationError) << "rank 9";
  // Host memory, which the kernels and NCCL would fault on, refused before any of them runs.
  const Region host = Region::contiguous(one.data(), 4);
  const std::function<void()> calls[] = {
      [&] { comm().copy(r, host); }, [&] { comm().copy(host, r); },
      [&] { comm().add(host, r, DType::u8); }, [&] { comm().zero(host); },
      [&] {
        Request q = comm().isend(host, 0, 1);
        comm().wait(q);
      }};
  for (const auto& call : calls) {
    try {
      call();
      ADD_FAILURE() << "host memory accepted";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "buffer");
    }
  }
}

}  // namespace
}  // namespace meshcast
