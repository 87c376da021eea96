// LocalWorld: the in-process backend. Point-to-point matching, strided regions, broadcasts over
// groups, barriers, and failure propagation (no hangs).
#include "meshcast/local.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "meshcast/error.h"
#include "meshcast/plan.h"
#include "meshcast/reshard.h"

namespace meshcast {
namespace {

using Clock = std::chrono::steady_clock;

Region ints(std::vector<int>& v) {
  return Region{v.data(),
                sizeof(int),
                {static_cast<std::int64_t>(v.size())},
                {0},
                {static_cast<std::int64_t>(v.size())}};
}

TEST(LocalWorld, Basics) {
  LocalWorld w(3);
  EXPECT_EQ(w.size(), 3);
  std::atomic<int> ran{0};
  w.run([&](Communicator& c) {
    EXPECT_EQ(c.size(), 3);
    EXPECT_EQ(c.backend(), "local");
    EXPECT_TRUE(c.rank() >= 0 && c.rank() < 3);
    ++ran;
  });
  EXPECT_EQ(ran.load(), 3);
  // A subset of the devices.
  std::mutex m;
  std::vector<int> who;
  w.run(
      [&](Communicator& c) {
        std::lock_guard<std::mutex> g(m);
        who.push_back(c.rank());
      },
      {2, 0});
  std::sort(who.begin(), who.end());
  EXPECT_EQ(who, (std::vector<int>{0, 2}));
  EXPECT_THROW(LocalWorld(0), ValidationError);
  EXPECT_THROW(w.run([](Communicator&) {}, {0, 3}), ValidationError);
}

TEST(LocalWorld, SendRecvBetweenThreads) {
  LocalWorld w(2);
  std::vector<int> got(100, -1);
  w.run([&](Communicator& c) {
    if (c.rank() == 0) {
      std::vector<int> data(100);
      std::iota(data.begin(), data.end(), 1000);
      Request r = c.isend(ints(data), 1, 5);
      c.wait(r);
      EXPECT_FALSE(r.valid());
    } else {
      Request r = c.irecv(ints(got), 0, 5);
      c.wait(r);
    }
  });
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], 1000 + i);
}

// Messages of one (peer, tag) match in posting order, whether the sends or the receives are
// posted first; other tags and peers do not interfere.
TEST(LocalWorld, SamePeerAndTagMatchInPostingOrder) {
  for (bool sends_first : {true, false}) {
    LocalWorld w(3);
    std::vector<std::vector<int>> got(6, std::vector<int>(4, -1));
    std::vector<std::vector<int>> other(2, std::vector<int>(4, -1));
    w.run([&](Communicator& c) {
      std::vector<std::vector<int>> data;
      std::vector<Request> reqs;
      if (c.rank() == 0) {
        if (!sends_first) c.barrier();
        for (int k = 0; k < 6; ++k) data.push_back(std::vector<int>(4, 10 * k + 1));
        data.push_back(std::vector<int>(4, 777));  // another tag
        for (int k = 0; k < 3; ++k)
          reqs.push_back(c.isend(ints(data[static_cast<std::size_t>(k)]), 1, 9));
        reqs.push_back(c.isend(ints(data[6]), 1, 8));
        for (int k = 3; k < 6; ++k)
          reqs.push_back(c.isend(ints(data[static_cast<std::size_t>(k)]), 1, 9));
        if (sends_first) c.barrier();
      } else if (c.rank() == 2) {
        if (!sends_first) c.barrier();
        data.push_back(std::vector<int>(4, 555));
        reqs.push_back(c.isend(ints(data[0]), 1, 9));  // same tag, another peer
        if (sends_first) c.barrier();
      } else {
        if (sends_first) c.barrier();
        reqs.push_back(c.irecv(ints(other[0]), 0, 8));
        reqs.push_back(c.irecv(ints(other[1]), 2, 9));
        for (auto& g : got) reqs.push_back(c.irecv(ints(g), 0, 9));
        if (!sends_first) c.barrier();
      }
      c.wait_all(reqs);
    });
    for (int k = 0; k < 6; ++k)
      EXPECT_EQ(got[static_cast<std::size_t>(k)], std::vector<int>(4, 10 * k + 1))
          << "message " << k << (sends_first ? " (sends first)" : " (receives first)");
    EXPECT_EQ(other[0], std::vector<int>(4, 777));
    EXPECT_EQ(other[1], std::vector<int>(4, 555));
  }
}

// A strided box of a 3-D buffer sent into a differently shaped box of a 2-D buffer: the elements
// arrive in row-major order of the boxes; nothing else is written.
TEST(LocalWorld, StridedRegionsOfDifferentShapes) {
  struct Case {
    Region from, to;  // bases filled in below
  };
  const Case cases[] = {
      {{nullptr, 4, {4, 5, 6}, {1, 1, 2}, {2, 3, 2}}, {nullptr, 4, {3, 8}, {1, 2}, {2, 6}}},
      {{nullptr, 4, {4, 5, 6}, {1, 1, 2}, {2, 3, 2}},
       {nullptr, 4, {5, 4, 3}, {2, 0, 1}, {2, 3, 2}}},
      {{nullptr, 4, {4, 5, 6}, {0, 0, 0}, {4, 5, 6}}, {nullptr, 4, {130}, {5}, {120}}},
      {{nullptr, 4, {9}, {3}, {6}}, {nullptr, 4, {4, 4}, {1, 1}, {2, 3}}},
  };
  for (const Case& cs : cases) {
    auto elems = [](const Region& r) {
      return std::accumulate(r.extent.begin(), r.extent.end(), std::int64_t{1},
                             std::multiplies<>());
    };
    std::vector<int> src(static_cast<std::size_t>(elems(cs.from)));
    std::iota(src.begin(), src.end(), 0);
    std::vector<int> dst(static_cast<std::size_t>(elems(cs.to)), -1);
    Region from = cs.from, to = cs.to;
    from.base = src.data();
    to.base = dst.data();
    LocalWorld w(2);
    w.run([&](Communicator& c) {
      Request r = c.rank() == 0 ? c.isend(from, 1, 3) : c.irecv(to, 0, 3);
      c.wait(r);
    });
    // Row-major element offsets of a box in its buffer.
    auto offsets = [](const Region& r) {
      std::vector<std::int64_t> out;
      std::vector<std::int64_t> idx(r.count.size(), 0);
      const std::size_t n = r.count.size();
      while (true) {
        std::int64_t off = 0;
        for (std::size_t d = 0; d < n; ++d) off = off * r.extent[d] + r.offset[d] + idx[d];
        out.push_back(off);
        std::size_t d = n;
        while (d-- > 0) {
          if (++idx[d] < r.count[d]) break;
          idx[d] = 0;
        }
        if (d == static_cast<std::size_t>(-1)) return out;
      }
    };
    const auto fo = offsets(from), to_off = offsets(to);
    ASSERT_EQ(fo.size(), to_off.size());
    std::vector<int> want(dst.size(), -1);
    for (std::size_t k = 0; k < fo.size(); ++k)
      want[static_cast<std::size_t>(to_off[k])] = src[static_cast<std::size_t>(fo[k])];
    EXPECT_EQ(dst, want);
  }
}

TEST(LocalWorld, UnequalMessageSizesFailCleanly) {
  LocalWorld w(2);
  std::vector<int> a(3, 1), b(4, 0);
  EXPECT_THROW(w.run([&](Communicator& c) {
    Request r = c.rank() == 0 ? c.isend(ints(a), 1, 0) : c.irecv(ints(b), 0, 0);
    c.wait(r);
  }),
               CommError);
  EXPECT_EQ(b, std::vector<int>(4, 0)) << "nothing written";
}

TEST(LocalWorld, BroadcastOverGroups) {
  LocalWorld w(8);
  std::vector<std::vector<int>> buf(8, std::vector<int>(16, -1));
  for (int d = 0; d < 8; ++d)
    std::iota(buf[static_cast<std::size_t>(d)].begin(), buf[static_cast<std::size_t>(d)].end(),
              100 * d);
  // Each chain starts with its root (Communicator::ibcast).
  const std::vector<int> g1 = {3, 1, 5, 6}, g2 = {7, 0, 2, 4};
  w.run([&](Communicator& c) {
    const int me = c.rank();
    auto& mine = buf[static_cast<std::size_t>(me)];
    // Two concurrent broadcasts over disjoint groups, with different roots and tags; then one
    // over everybody, a strided half of the buffer.
    Request r;
    if (std::find(g1.begin(), g1.end(), me) != g1.end())
      r = c.ibcast(ints(mine), 3, g1, 1);
    else
      r = c.ibcast(ints(mine), 7, g2, 2);
    c.wait(r);
    c.barrier();
    const std::vector<int> all = {5, 0, 1, 2, 3, 4, 6, 7};
    Region half{mine.data(), sizeof(int), {4, 4}, {0, 2}, {4, 2}};
    Request s = c.ibcast(half, 5, all, 3);
    c.wait(s);
  });
  for (int d = 0; d < 8; ++d) {
    const int root = std::find(g1.begin(), g1.end(), d) != g1.end() ? 3 : 7;
    for (int k = 0; k < 16; ++k) {
      // columns 2-3 of each 4x4 buffer come from device 5 (which holds group-1 data from root 3)
      const int want = (k % 4 >= 2) ? 300 + k : 100 * root + k;
      EXPECT_EQ(buf[static_cast<std::size_t>(d)][static_cast<std::size_t>(k)], want)
          << "device " << d << " element " << k;
    }
  }
}

TEST(LocalWorld, Barrier) {
  constexpr int kDevices = 8, kRounds = 25;
  LocalWorld w(kDevices);
  std::atomic<int> arrived{0};
  std::atomic<int> errors{0};
  w.run([&](Communicator& c) {
    for (int round = 0; round < kRounds; ++round) {
      ++arrived;
      c.barrier();
      if (arrived.load() != kDevices * (round + 1)) ++errors;
      c.barrier();
    }
  });
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(arrived.load(), kDevices * kRounds);
}

// A device that throws: the others' waits (on it, on third parties, in a barrier) fail with a
// CommError naming it, and run() rethrows the original exception, quickly.
// Bounded before anything is allocated: every device's node segment (SIZE_MAX wrapped the
// allocation and crashed); and each device runs on one thread only (two shared an inbox).
TEST(LocalWorld, SegmentsAndDevicesAreCheckedBeforeTheyRun) {
  for (const std::size_t bytes : {SIZE_MAX, std::size_t{1} << 40}) try {
      LocalWorld w(2, bytes);
      ADD_FAILURE() << bytes << " bytes of node segment accepted";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "node_segment_bytes") << e.what();
    }
  LocalWorld w(3);
  try {
    w.run([](Communicator&) {}, {0, 0, 1});
    ADD_FAILURE() << "a device named twice accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "devices") << e.what();
    EXPECT_NE(std::string(e.what()).find("device 0 is named twice"), std::string::npos);
  }
}

TEST(LocalWorld, FailingDeviceFailsTheOthersWaitsAndRunRethrows) {
  for (int delay_ms : {0, 50}) {
    LocalWorld w(5);
    std::mutex m;
    std::vector<std::string> seen;
    const auto t0 = Clock::now();
    try {
      w.run([&](Communicator& c) {
        std::vector<int> buf(8, 0);
        const int me = c.rank();
        try {
          if (me == 2) {
            std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
            throw std::runtime_error("boom on 2");
          }
          if (me == 0) {
            Request r = c.irecv(ints(buf), 2, 0);  // waits on the failed device
            c.wait(r);
          } else if (me == 1) {
            c.barrier();
          } else if (me == 3) {
            Request r = c.isend(ints(buf), 2, 0);
            c.wait(r);
          } else {
            Request r = c.irecv(ints(buf), 3, 1);  // a third party that never sends
            c.wait(r);
          }
        } catch (const CommError& e) {
          std::lock_guard<std::mutex> g(m);
          seen.push_back(e.what());
          throw;
        }
      });
      ADD_FAILURE() << "run() returned";
    } catch (const CommError& e) {
      ADD_FAILURE() << "run() rethrew a CommError, not the original: " << e.what();
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "boom on 2");
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_LT(secs, 10.0) << "failure propagation took " << secs << " s";
    EXPECT_EQ(seen.size(), 4u) << "delay " << delay_ms;
    for (const auto& what : seen) {
      EXPECT_NE(what.find("device 2"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    // The world is usable again afterwards.
    std::atomic<int> ok{0};
    w.run([&](Communicator& c) {
      c.barrier();
      ++ok;
    });
    EXPECT_EQ(ok.load(), 5);
  }
}

// Devices arriving at a barrier one after another, each within the timeout of the last but all
// over a longer span (a thousand threads filling their buffers on two cores): arriving is
// progress, so the first to arrive does not give up on the last. Each comes 1 s after the one
// before it arrived (not after its own start, which a busy machine delays): 3 s in all.
TEST(LocalWorld, ABarrierWaitsWhileDevicesKeepArriving) {
  LocalWorld w(4, 0, 2.0);
  std::array<std::atomic<bool>, 4> arrived{};
  w.run([&](Communicator& c) {
    const int k = c.rank();
    if (k > 0) {
      for (int i = 0; !arrived[k - 1] && i < 6000; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    arrived[k] = true;
    c.barrier();
  });
}

// A device that run() was not given never sends nor receives: a wait on it fails at once,
// naming it as not running; a barrier counts only the devices run.
TEST(LocalWorld, WaitsOnADeviceNotRunFailAtOnce) {
  LocalWorld w(3, 0, 30);
  const auto t0 = Clock::now();
  try {
    w.run(
        [&](Communicator& c) {
          c.barrier();
          std::vector<int> buf(8, 0);
          Request r = c.irecv(ints(buf), 0, 0);
          c.wait(r);
        },
        {2, 1});
    ADD_FAILURE() << "run() returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("device 0: is not running"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
}

// A device whose function returns while others wait on it (in a barrier, on its send, on its
// receive, polling a receive with test()): they fail at once with a CommError naming it, not
// after the timeout; a device that never reaches a barrier fails the others' wait after the
// timeout, named.
TEST(LocalWorld, WaitsOnADeviceThatReturnedFailAtOnce) {
  LocalWorld w(5, 0, 30);
  std::mutex m;
  std::vector<std::string> seen;
  const auto t0 = Clock::now();
  EXPECT_THROW(w.run([&](Communicator& c) {
    std::vector<int> buf(8, 0);
    const int me = c.rank();
    if (me == 3) return;  // leaves at once
    try {
      if (me == 0) {
        c.barrier();
      } else if (me == 1) {
        Request r = c.irecv(ints(buf), 3, 0);
        c.wait(r);
      } else if (me == 4) {
        Request r = c.irecv(ints(buf), 3, 1);
        while (!c.test(r)) std::this_thread::yield();
      } else {
        Request r = c.isend(ints(buf), 3, 0);
        c.wait(r);
      }
    } catch (const CommError& e) {
      std::lock_guard<std::mutex> g(m);
      seen.push_back(e.what());
      throw;
    }
  }),
               CommError);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  ASSERT_EQ(seen.size(), 4u);
  for (const auto& what : seen)  // directly, or through the first device that failed so
    EXPECT_NE(what.find("device 3: returned from its function"), std::string::npos) << what;

  // Device 1 comes once device 0 has given up (a flag, not a sleep a busy machine outlasts).
  LocalWorld slow(2, 0, 0.2);
  std::atomic<bool> gave_up{false};
  try {
    slow.run([&](Communicator& c) {
      for (int i = 0; c.rank() == 1 && !gave_up && i < 6000; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      try {
        c.barrier();
      } catch (const CommError&) {
        if (c.rank() == 0) gave_up = true;
        throw;
      }
    });
    ADD_FAILURE() << "run() returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("device 1: did not reach the barrier"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(w.run([](Communicator&) {}, std::vector<int>(2000, 0)), ValidationError);
}

// A device that fails a reshard (here: no source buffer) must not leave peers reading buffers
// that the others free as they unwind: run under ASan, this was a heap-use-after-free in most
// runs. The failing device's own ValidationError is what run() rethrows.
TEST(LocalWorld, FailedReshardLeavesNoPeerReadingFreedBuffers) {
  const Layout src = Layout::parse({256, 256}, DType::f32, "4@0-3:S0R");
  const Layout dst = Layout::parse({256, 256}, DType::f32, "4@4-7:RS0");
  const Plan plan = meshcast::plan(src, dst);
  for (int round = 0; round < 20; ++round) {
    const int culprit = round % 4;
    LocalWorld w(8);
    try {
      w.run([&](Communicator& c) {
        const int me = c.rank();
        std::vector<float> in, out;
        if (src.mesh().contains(me)) in.assign(static_cast<std::size_t>(src.local_elements(me)), 1);
        if (dst.mesh().contains(me)) out.resize(static_cast<std::size_t>(dst.local_elements(me)));
        reshard(plan, c, me == culprit || in.empty() ? nullptr : in.data(),
                out.empty() ? nullptr : out.data());
      });
      ADD_FAILURE() << "run() returned";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "src_local") << e.what();
    }
  }
}

TEST(LocalWorld, NonStandardExceptionsPropagateToo) {
  LocalWorld w(2);
  EXPECT_THROW(w.run([&](Communicator& c) {
    if (c.rank() == 1) throw 42;
    c.barrier();
  }),
               int);
}

}  // namespace
}  // namespace meshcast
