// reshard() on the in-process backend: random layouts, every dtype and strategy, buffers the
// test allocates and fills with its own values, checked element by element by its own reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "lib/exec/chain_world.h"
#include "meshcast/meshcast.h"
#include "meshcast/testing.h"
#include "support/tensor_data.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;

constexpr int kWorld = 12;  // device ids 0..11
using testing::Buffers;

Buffers make_buffers(const Layout& src, const Layout& dst) {
  return testing::make_buffers(src, dst, kWorld);
}

// Runs the plan on every device of either mesh; a device with an empty (or no) tile passes
// nullptr.
void execute(const Plan& p, Buffers& b) {
  LocalWorld world(kWorld);
  world.run(
      [&](Communicator& comm) {
        const auto me = static_cast<std::size_t>(comm.rank());
        const void* s = b.src[me].empty() ? nullptr : b.src[me].data();
        void* d = b.dst[me].empty() ? nullptr : b.dst[me].data();
        reshard(p, comm, s, d);
      },
      p.devices());
}

using testing::check;

// The random cases' bounds: meshes within the world, tensors small enough to check by element.
testing::Limits random_limits() {
  testing::Limits lim;
  lim.pool = kWorld;
  lim.max_mesh_size = 8;
  lim.max_volume = 200;
  lim.max_extent = 9;
  return lim;
}

constexpr Strategy kStrategies[] = {Strategy::Broadcast, Strategy::SendRecv, Strategy::AllGather,
                                    Strategy::Auto};

TEST(Reshard, RandomCasesMatchTheReference) {
  Rng rng(0x7e5a);
  const testing::Limits lim = random_limits();
  const Topology topos[] = {Topology::single_host(), testing::three_hosts(),
                            testing::three_hosts(4)};
  const int n = testing::scaled(560);
  for (int i = 0; i < n; ++i) {
    const DType t = testing::dtype_at(i);
    const auto c = testing::random_case(rng, lim, t);
    PlanOptions opt;
    opt.strategy = kStrategies[(i / testing::kDTypeCount) % 4];
    opt.balance = static_cast<Balance>(rng.below(3));
    opt.search_moves = 200;
    const Topology& topo = topos[rng.below(3)];
    const std::string ctx = "case " + std::to_string(i) + ": " + c.str() + " strategy " +
                            to_string(opt.strategy) + " balance " + to_string(opt.balance) +
                            " topology " + topo.name();
    Plan p = plan(c.src, c.dst, topo, opt);
    if (i % 5 == 0) p = Plan::from_json(p.to_json());  // a reloaded plan runs the same
    Buffers b = make_buffers(c.src, c.dst);
    const auto src_before = b.src;
    ASSERT_NO_THROW(execute(p, b)) << ctx;
    std::string first;
    const std::int64_t wrong = check(c.dst, b, first);
    ASSERT_EQ(wrong, 0) << ctx << "\n" << first << "\n" << p.str(64);
    ASSERT_TRUE(b.src == src_before) << ctx << ": a source buffer changed";
    // The same plan through run_local and the library's own fill/check, on a subset.
    if (i % 10 == 0) {
      const LocalRun r = run_local(p, 1, true);
      ASSERT_EQ(r.mismatches, 0) << ctx;
      ASSERT_EQ(r.seconds.size(), 1u) << ctx;
    }
  }
}

// Every device plans its own part alone (plan_rank), as the devices of a job do, and runs it; on
// some cases half of the devices run the whole plan instead (the two forms mix).
TEST(Reshard, PerRankPlansMatchTheReference) {
  Rng rng(0x9e2b);
  const testing::Limits lim = random_limits();
  const Topology topos[] = {Topology::single_host(), testing::three_hosts(),
                            testing::three_hosts(4)};
  const int n = testing::scaled(300);
  for (int i = 0; i < n; ++i) {
    const auto c = testing::random_case(rng, lim, testing::dtype_at(i));
    PlanOptions opt;
    opt.strategy = kStrategies[rng.below(4)];
    opt.balance = rng.chance(1, 4) ? Balance::None : Balance::Local;
    const Topology& topo = topos[rng.below(3)];
    const bool mixed = rng.chance(1, 3);
    const std::string ctx = "case " + std::to_string(i) + ": " + c.str() + " strategy " +
                            to_string(opt.strategy) + " balance " + to_string(opt.balance) +
                            " topology " + topo.name() + (mixed ? " (mixed)" : "");
    const Plan whole = plan(c.src, c.dst, topo, opt);
    Buffers b = make_buffers(c.src, c.dst);
    LocalWorld world(kWorld);
    ASSERT_NO_THROW(world.run(
        [&](Communicator& comm) {
          const auto me = static_cast<std::size_t>(comm.rank());
          const void* s = b.src[me].empty() ? nullptr : b.src[me].data();
          void* d = b.dst[me].empty() ? nullptr : b.dst[me].data();
          if (mixed && me % 2)
            reshard(whole, comm, s, d);
          else
            reshard(plan_rank(c.src, c.dst, comm.rank(), topo, opt), comm, s, d);
        },
        whole.devices()))
        << ctx;
    std::string first;
    ASSERT_EQ(check(c.dst, b, first), 0) << ctx << "\n" << first << "\n" << whole.str(64);
  }
}

TEST(Reshard, AnotherDevicesPartIsRefused) {
  const Layout src = Layout::parse({4}, DType::f32, "2@0-1:S0");
  const Layout dst = Layout::parse({4}, DType::f32, "2@0-1:R");
  LocalWorld world(2);
  std::vector<float> a(2), b(4);
  try {
    world.run([&](Communicator& comm) {
      reshard(plan_rank(src, dst, 1 - comm.rank()), comm, a.data(), b.data());
    });
    FAIL() << "a device ran another device's part";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan") << e.what();
    EXPECT_NE(std::string(e.what()).find("is device"), std::string::npos) << e.what();
  }
}

// A transfer whose peer failed throws on every wait() and test() after, not only the first: a
// second wait() that returned would say the data arrived. Moved onto itself it stays in flight.
TEST(Reshard, AFailedTransferThrowsOnEveryWait) {
  const Layout src = Layout::parse({4}, DType::f32, "2@0-1:S0");
  const Layout dst = Layout::parse({4}, DType::f32, "2@0-1:R");
  const Plan p = plan(src, dst);
  LocalWorld world(2);
  std::vector<std::vector<float>> a(2, std::vector<float>(2, 1.0f)), b(2, std::vector<float>(4));
  int thrown = 0;
  bool done = false;
  std::atomic<bool> started{false};  // device 1 fails once the transfer is in flight, not before
  try {
    world.run([&](Communicator& comm) {
      if (comm.rank() == 1) {
        while (!started) std::this_thread::yield();
        throw std::runtime_error("device 1 gives up");
      }
      Transfer t = ireshard(p, comm, a[0].data(), b[0].data());
      started = true;
      Transfer& same = t;
      t = std::move(same);  // a self-move keeps it: nothing abandoned
      for (int i = 0; i < 3; ++i) try {
          if (i == 2)
            (void)t.test();
          else
            t.wait();
        } catch (const CommError&) {
          ++thrown;
        }
      done = t.done();
    });
    ADD_FAILURE() << "run() returned";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "device 1 gives up");
  }
  EXPECT_EQ(thrown, 3);
  EXPECT_TRUE(done) << "a failed transfer has nothing in flight";
}

// A device's interrupt check (Communicator::set_interrupt: Python's Ctrl-C) that throws ends its
// blocked wait with that exception, and its peer's wait fails naming it: without the check the
// wait would last until the peer came.
TEST(Reshard, AnInterruptEndsAWaitAndItsPeersFailNamingTheDevice) {
  const Layout src = Layout::parse({64}, DType::f32, "1@0:R");
  const Layout dst = Layout::parse({64}, DType::f32, "1@1:R");
  const Plan p = plan(src, dst);
  LocalWorld world(2);
  std::vector<float> a(64, 1.0f), b(64);
  std::atomic<bool> interrupted{false};
  std::string mine, theirs;
  int checks = 0;
  world.run([&](Communicator& comm) {
    try {
      if (comm.rank() == 0) {
        comm.set_interrupt([&] {
          if (++checks == 3) throw std::runtime_error("stop");
        });
        reshard(p, comm, a.data(), nullptr);
      } else {
        while (!interrupted) std::this_thread::yield();  // arrives only once device 0 gave up
        reshard(p, comm, nullptr, b.data());
      }
    } catch (const std::exception& e) {
      (comm.rank() == 0 ? mine : theirs) = e.what();
    }
    if (comm.rank() == 0) interrupted = true;
  });
  EXPECT_EQ(mine, "stop");
  EXPECT_EQ(checks, 3) << "one check per 50 ms, none after it threw";
  EXPECT_EQ(theirs, "device 0: failed: stop");
}

// A hand-built part with an empty box is refused, not run as a move that writes nothing.
TEST(Reshard, AnEmptyBoxInAHandBuiltPartIsRefused) {
  const Layout l = Layout::parse({8}, DType::f32, "2@0-1:S0");
  const RankPlan good = plan_rank(l, l, 0);
  ASSERT_EQ(good.ops().size(), 1u);
  for (const Box& empty : {Box({{2, 2}}), Box({{3, 1}})}) {
    std::vector<Op> ops = good.ops();
    ops[0].box = empty;
    const RankPlan bad(l, l, good.strategy(), good.balance(), 0, ops, good.streams());
    std::vector<float> a(4, 1.0f), b(4, 0.0f);
    LocalWorld world(2);
    try {
      world.run([&](Communicator& comm) { reshard(bad, comm, a.data(), b.data()); }, {0});
      ADD_FAILURE() << "ran " << empty.str();
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "plan") << e.what();
      EXPECT_NE(std::string(e.what()).find("empty box"), std::string::npos) << e.what();
    }
  }
}

// ireshard(): two reshards in flight at once between the same devices, on one group (each takes
// tags of its own from it), moved on only by test(), first one then the other on even devices
// and the other way round on odd ones; multi-phase plans included.
TEST(Reshard, ConcurrentTransfersOnOneGroupMatchTheReference) {
  Rng rng(0x1e5a);
  testing::Limits lim;
  lim.pool = kWorld;
  lim.max_mesh_size = 8;
  lim.max_volume = 200;
  lim.max_extent = 9;
  const int n = testing::scaled(120);
  for (int i = 0; i < n; ++i) {
    // Half the time the second reshard moves the same layouts (as i32): every message then has
    // a twin between the same devices, and only the tags tell them apart.
    const auto a = testing::random_case(rng, lim, DType::f32);
    auto c = testing::random_case(rng, lim, DType::i32);
    if (i % 4 < 2) {
      c.src = Layout(a.src.shape(), DType::i32, a.src.mesh(), a.src.spec());
      c.dst = Layout(a.dst.shape(), DType::i32, a.dst.mesh(), a.dst.spec());
    }
    PlanOptions opt;
    opt.strategy = i % 2 ? Strategy::AllGather : Strategy::Broadcast;
    const Plan pa = plan(a.src, a.dst, Topology::single_host(), opt);
    const Plan pc = plan(c.src, c.dst, Topology::single_host(), opt);
    Buffers ba = make_buffers(a.src, a.dst), bc = make_buffers(c.src, c.dst);
    auto ptrs = [](Buffers& b, std::size_t me) {
      return std::pair<const void*, void*>{b.src[me].empty() ? nullptr : b.src[me].data(),
                                           b.dst[me].empty() ? nullptr : b.dst[me].data()};
    };
    LocalWorld world(kWorld);
    ASSERT_NO_THROW(world.run([&](Communicator& comm) {
      const auto me = static_cast<std::size_t>(comm.rank());
      const auto [sa, da] = ptrs(ba, me);
      const auto [sc, dc] = ptrs(bc, me);
      Transfer ta = ireshard(pa, comm.world(), sa, da);
      Transfer tc = ireshard(pc, comm.world(), sc, dc);
      Transfer& first = me % 2 ? tc : ta;
      Transfer& second = me % 2 ? ta : tc;
      for (;;) {
        const bool one = first.test();
        if (second.test() && one) break;
        std::this_thread::yield();
      }
      EXPECT_TRUE(ta.done() && tc.done());
    })) << "case "
        << i;
    std::string first;
    ASSERT_EQ(check(a.dst, ba, first), 0) << "case " << i << " " << a.str() << "\n" << first;
    ASSERT_EQ(check(c.dst, bc, first), 0) << "case " << i << " " << c.str() << "\n" << first;
  }
}

TEST(Reshard, HandPickedCases) {
  struct Case {
    Shape shape;
    const char* src;
    const char* dst;
  };
  const Case cases[] = {
      {{1024}, "1@0:R", "2x4@4-11:R"},                         // one to many
      {{7, 5}, "2x2@0-3:S0S1", "3@[9,4,0]:RS0"},               // uneven, overlapping
      {{3}, "8@0-7:S0", "2x4@4-11:S10"},                       // mostly empty shards
      {{6, 6}, "2x3@0-5:S0R+P1", "2x3@[5,4,3,2,1,0]:RS1+P0"},  // partial to partial, permuted
      {{6, 6}, "2x2@0-3:RR+P01", "4@8-11:S0R"},                // four addends, disjoint
      {{0, 4}, "2@0-1:S0R", "2@2-3:RS0"},                      // empty tensor
      {{5, 5}, "2x2@0-3:S0S1", "2x2@0-3:S0S1"},                // identity
  };
  // Under MESHCAST_TEST_SCALE < 1 (the sanitizer presets), one dtype of each element size.
  std::vector<DType> dtypes;
  for (DType t : kAllDTypes)
    if (testing::test_scale() >= 1 || std::none_of(dtypes.begin(), dtypes.end(), [&](DType u) {
          return dtype_size(u) == dtype_size(t);
        }))
      dtypes.push_back(t);
  for (DType t : dtypes)
    for (const Case& c : cases)
      for (Strategy st : {Strategy::Broadcast, Strategy::SendRecv, Strategy::AllGather}) {
        const auto src = Layout::parse(c.shape, t, c.src), dst = Layout::parse(c.shape, t, c.dst);
        PlanOptions opt;
        opt.strategy = st;
        const Plan p = plan(src, dst, Topology::single_host(), opt);
        Buffers b = make_buffers(src, dst);
        execute(p, b);
        std::string first;
        EXPECT_EQ(check(dst, b, first), 0) << to_string(t) << " " << c.src << " -> " << c.dst << " "
                                           << to_string(st) << ": " << first;
      }
}

// Multicasts to many hosts travel as trees of chains (Op::group): on 6 hosts of 2 devices, in
// many chunks, the planner sends each box along a trunk through the hosts, each leader feeding
// its host. Run on the
// engine's chains (ChainWorld; the local transport fans out) and on the local transport, as the
// planner builds them and with every other group size forced (trees whose groups straddle hosts
// included), and forked (Op::fork) after every receiver with a chain or groups of 2 after the
// fork, in chunks of 5 bytes: every element arrives.
TEST(Reshard, TreesOfChainsMatchTheReference) {
  const Topology pairs = Topology::uniform("pairs", 6, 2, LinkClass{"intra", 50e9, 1e-6},
                                           LinkClass{"network", 1e9, 2e-5});
  struct Case {
    Shape shape;
    DType dtype;
    const char* src;
    const char* dst;
  };
  const Case cases[] = {
      {{30, 17}, DType::i32, "1@0:RR", "11@1-11:RR"},
      {{9, 14}, DType::f64, "2@0-1:RS0", "2x5@2-11:RR"},   // two boxes, each to 10
      {{12, 8}, DType::i64, "2@0-1:RR+P0", "10@2-11:RR"},  // reduced at one, sent on
  };
  // Under MESHCAST_TEST_SCALE < 1 (the sanitizer presets), every k-th shape besides the
  // planner's own, another subset for each case.
  const auto every =
      static_cast<std::size_t>(std::lround(1 / std::min(1.0, testing::test_scale())));
  for (std::size_t ci = 0; ci < std::size(cases); ++ci) {
    const Case& c = cases[ci];
    const auto src = Layout::parse(c.shape, c.dtype, c.src);
    const auto dst = Layout::parse(c.shape, c.dtype, c.dst);
    PlanOptions opt;
    opt.strategy = Strategy::Broadcast;
    opt.balance = Balance::None;
    opt.chunk_bytes = 5;  // many chunks: a NIC that carried two hops would be the bottleneck
    const Plan planned = plan(src, dst, pairs, opt);
    std::size_t receivers = 0;
    std::int64_t most = 1;
    for (const Op& op : planned.ops())
      if (op.kind == OpKind::Multicast) {
        receivers = std::max(receivers, op.peers.size());
        most = std::max(
            most, multicast_chains(static_cast<std::int64_t>(op.peers.size()), op.group, op.fork));
      }
    ASSERT_GE(most, 3) << c.src << " -> " << c.dst << "\n" << planned.str();
    std::vector<std::pair<std::int32_t, std::int32_t>> shapes;  // (group, fork)
    for (std::size_t g = 0; g < receivers; ++g)
      if (g != 1) shapes.emplace_back(static_cast<std::int32_t>(g), 0);
    for (std::size_t f = 1; f < receivers; ++f)
      for (std::int32_t g : {0, 2}) shapes.emplace_back(g, static_cast<std::int32_t>(f));
    for (std::size_t si = 0; si < shapes.size(); ++si) {
      const auto [g, f] = shapes[si];
      if ((g != 0 || f != 0) && (si + ci) % every != 0) continue;
      std::vector<Op> ops = planned.ops();
      for (Op& op : ops) {
        const auto n = static_cast<std::int32_t>(op.peers.size());
        if (op.kind != OpKind::Multicast) continue;
        op.fork = f < n ? f : 0;
        op.group = g < n - op.fork ? g : 0;
      }
      const Plan p = g == 0 && f == 0
                         ? planned
                         : Plan(src, dst, planned.strategy(), planned.balance(), pairs.name(),
                                std::move(ops), planned.stats(), planned.streams());
      p.validate();
      const std::string ctx = std::string(c.src) + " -> " + c.dst + " group " + std::to_string(g) +
                              " fork " + std::to_string(f);
      for (bool chains : {true, false}) {
        Buffers b = make_buffers(src, dst);
        if (chains) {
          testing::ChainWorld world(kWorld, 5, 15);
          ASSERT_NO_THROW(world.run(
              [&](Communicator& comm) {
                const auto me = static_cast<std::size_t>(comm.rank());
                reshard(p, comm, b.src[me].empty() ? nullptr : b.src[me].data(),
                        b.dst[me].empty() ? nullptr : b.dst[me].data());
              },
              p.devices()))
              << ctx;
        } else {
          execute(p, b);
        }
        std::string first;
        ASSERT_EQ(check(dst, b, first), 0) << ctx << (chains ? " (chains)" : "") << ": " << first;
      }
    }
  }
}

// The checker itself: one corrupted element is one mismatch.
TEST(Reshard, CheckerCatchesACorruptedElement) {
  const auto src = Layout::parse({6, 6}, DType::i32, "2x2@0-3:S0R+P1");
  const auto dst = Layout::parse({6, 6}, DType::i32, "3@4-6:RS0");
  const Plan p = plan(src, dst);
  Buffers b = make_buffers(src, dst);
  execute(p, b);
  std::string first;
  ASSERT_EQ(check(dst, b, first), 0) << first;
  b.dst[5][7] ^= std::byte{1};
  EXPECT_EQ(check(dst, b, first), 1);
  EXPECT_NE(first.find("device 5"), std::string::npos) << first;
}

TEST(Reshard, NullBufferWhereATileIsNeededIsRefused) {
  const auto src = Layout::parse({8, 8}, DType::f32, "2@0-1:S0R");
  const auto dst = Layout::parse({8, 8}, DType::f32, "2@2-3:RS0");
  const Plan p = plan(src, dst);
  LocalWorld world(4);
  std::vector<std::vector<float>> buf(4, std::vector<float>(32, 1.0f));
  // A source device passing nullptr: refused before any communication.
  try {
    world.run([&](Communicator& comm) { reshard(p, comm, nullptr, nullptr); }, {0});
    ADD_FAILURE() << "accepted a null source";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "src_local") << e.what();
  }
  // A target device passing nullptr.
  try {
    world.run([&](Communicator& comm) { reshard(p, comm, nullptr, nullptr); }, {3});
    ADD_FAILURE() << "accepted a null target";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "dst_local") << e.what();
  }
  // All devices, one of them passing nullptr: the others fail too, run() rethrows the cause.
  EXPECT_THROW(world.run([&](Communicator& comm) {
    const int me = comm.rank();
    float* mine = buf[static_cast<std::size_t>(me)].data();
    reshard(p, comm, me < 2 ? mine : nullptr, me == 2 || me < 2 ? nullptr : mine);
  }),
               ValidationError);
}

// A corrupt plan (a device asked for a box it does not hold) is refused, never written out of
// bounds.
TEST(Reshard, PlanNamingADeviceForDataItLacksIsRefused) {
  const auto l = Layout::parse({8, 8}, DType::f32, "2@0-1:S0R");
  const Plan good = plan(l, l);
  std::vector<Op> ops = good.ops();
  ASSERT_EQ(ops.size(), 2u) << good.str();
  ASSERT_EQ(ops[0].kind, OpKind::Copy);
  ops[0].root = ops[1].root;
  const Plan bad(good.src(), good.dst(), good.strategy(), good.balance(), good.topology(), ops,
                 good.stats());
  std::vector<std::vector<float>> src(2, std::vector<float>(32, 1.0f)),
      dst(2, std::vector<float>(32, 0.0f));
  LocalWorld world(2);
  try {
    world.run([&](Communicator& comm) {
      const auto me = static_cast<std::size_t>(comm.rank());
      reshard(bad, comm, src[me].data(), dst[me].data());
    });
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "plan") << e.what();
  }
}

// What each device of a 2-device world ends with when device d runs plans[d]: "" (it
// returned) or its error.
std::vector<std::string> run_apart(const std::vector<Plan>& plans) {
  std::vector<std::string> out(2);
  std::vector<std::vector<std::byte>> src(2), dst(2);
  LocalWorld world(2);
  world.run([&](Communicator& comm) {
    const auto me = static_cast<std::size_t>(comm.rank());
    const Plan& p = plans[me];
    src[me].resize(static_cast<std::size_t>(p.src().tile_of(comm.rank()).volume()) * 8);
    dst[me].resize(static_cast<std::size_t>(p.dst().tile_of(comm.rank()).volume()) * 8);
    try {
      reshard(p, comm, src[me].data(), dst[me].data());
    } catch (const Error& e) {
      out[me] = e.what();
    }
  });
  return out;
}

// Both devices failed, and one of them (whichever checked first; the other may hear of it as
// the first one's failure) with `why[d]`.
void expect_named(const std::vector<std::string>& out, const std::vector<std::string>& why) {
  EXPECT_TRUE(out[0] == why[0] || out[1] == why[1]) << out[0] << "\n" << out[1];
  EXPECT_NE(out[0], "");
  EXPECT_NE(out[1], "");
}

// Devices whose plans differ fail naming what differs, at once: where their messages have the
// same sizes and tags (which the transports' checks cannot tell) instead of leaving wrong data,
// and where their tags differ instead of waiting for the timeout. Plans that agree pass however
// they were asked for.
TEST(Reshard, DevicesThatRunDifferentPlansFailNamingWhatDiffers) {
  const auto l = [](DType t, const char* text) { return Layout::parse({8, 8}, t, text); };
  const Plan f32 = plan(l(DType::f32, "2@0-1:S0R"), l(DType::f32, "2@0-1:RS0"));
  const Plan i32 = plan(l(DType::i32, "2@0-1:S0R"), l(DType::i32, "2@0-1:RS0"));
  expect_named(run_apart({f32, i32}),
               {"dtype: device 1 reshards i32 where this device reshards f32",
                "dtype: device 0 reshards f32 where this device reshards i32"});

  // Source and target swapped on one device: the same pairs and sizes, other boxes and tags.
  const Plan back = plan(f32.dst(), f32.src());
  expect_named(
      run_apart({f32, back}),
      {"src: device 1 has another source layout than this device's 2@0-1:S0R of shape 8,8",
       "src: device 0 has another source layout than this device's 2@0-1:RS0 of shape 8,8"});
  // The target mesh's devices in another order on one device.
  const Plan swapped = plan(f32.src(), l(DType::f32, "2@[1,0]:RS0"));
  expect_named(
      run_apart({f32, swapped}),
      {"dst: device 1 has another target layout than this device's 2@0-1:RS0 of shape 8,8",
       "dst: device 0 has another target layout than this device's 2@[1,0]:RS0 of shape 8,8"});

  // The same messages in another phase: the plans disagree on the ops (here harmlessly).
  std::vector<Op> later = f32.ops();
  for (Op& op : later) op.phase += op.kind == OpKind::Multicast;
  const Plan other(f32.src(), f32.dst(), f32.strategy(), f32.balance(), f32.topology(), later,
                   f32.stats(), f32.streams());
  const std::string why =
      "plan: device 0 exchanges other messages with this device than this "
      "device's plan says (a plan made with other options or another topology)";
  expect_named(run_apart({f32, other}), {"plan: device 1" + why.substr(14), why});

  // Plans that agree: one asked for auto, the other for the strategy auto chose.
  PlanOptions o;
  o.strategy = f32.strategy();
  const Plan chosen = plan(f32.src(), f32.dst(), Topology::single_host(), o);
  EXPECT_EQ(run_apart({f32, chosen}), (std::vector<std::string>{"", ""}));
}

TEST(Reshard, DeviceOutsideBothMeshesReturnsAtOnce) {
  const auto src = Layout::parse({8, 8}, DType::f32, "2@0-1:S0R");
  const auto dst = Layout::parse({8, 8}, DType::f32, "2@2-3:RS0");
  const Plan p = plan(src, dst);
  LocalWorld world(6);
  // Device 5 alone: nobody else runs, so any communication would hang.
  EXPECT_NO_THROW(world.run([&](Communicator& comm) { reshard(p, comm, nullptr, nullptr); }, {5}));
}

// A plan of more streams than the group's run of tags reuses them: device 1 forwards the chain
// 0 -> 1 -> 2 of stream 0 and sends 1 -> 2 directly on stream `later`, whose tag is the same
// (65,535 streams on: the run's tags but the words' wrap), or another (65,536, the old wrap).
// Every element is right, each in its order of calls: ireshard returns without waiting (device
// 1 holds the direct send back until the chain completed, and an all-reduce device 2 makes
// first is what completes it), then waits.
TEST(Reshard, APlanReusingTagsKeepsTheirMessagesApartWithoutBlockingIreshard) {
  const std::int64_t n = 512, k = 256;
  const Layout src = Layout::parse({n}, DType::f32, "2@[0,1]:R");
  const Layout dst = Layout::parse({n}, DType::f32, "2@[1,2]:R");
  for (const std::int64_t later : {65535, 65536}) {
    SCOPED_TRACE("stream " + std::to_string(later));
    std::vector<Op> ops(3);
    ops[0].kind = OpKind::Multicast;
    ops[0].box = Box({{0, k}});
    ops[0].root = 0;
    ops[0].peers = {1, 2};
    ops[1].kind = OpKind::Multicast;
    ops[1].box = Box({{k, n}});
    ops[1].root = 1;
    ops[1].peers = {2};
    ops[1].stream = later;
    ops[2].kind = OpKind::Copy;
    ops[2].box = Box({{k, n}});
    ops[2].root = 1;
    LocalWorld world(3, 0, 60.0);
    std::vector<std::vector<float>> got(3);
    world.run([&](Communicator& comm) {
      const int me = comm.rank();
      const Group g = comm.group({1, 2});
      std::vector<Op> mine;
      for (const Op& o : ops)
        if (o.root == me || std::find(o.peers.begin(), o.peers.end(), me) != o.peers.end())
          mine.push_back(o);
      const RankPlan part(src, dst, Strategy::Broadcast, Balance::Search, me, mine, 70000);
      std::vector<float> s(n), d(n, 0.0f), x(4, 1.0f), y(4);
      for (std::int64_t i = 0; i < n; ++i) s[static_cast<std::size_t>(i)] = float(i);
      if (me == 2) all_reduce(g, x.data(), y.data(), 4, DType::f32, ReduceOp::Sum);
      Transfer t =
          ireshard(part, comm.world(), me < 2 ? s.data() : nullptr, me > 0 ? d.data() : nullptr);
      if (me == 1) all_reduce(g, x.data(), y.data(), 4, DType::f32, ReduceOp::Sum);
      t.wait();
      got[static_cast<std::size_t>(me)] = d;
    });
    for (int me : {1, 2})
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[static_cast<std::size_t>(me)][static_cast<std::size_t>(i)], float(i))
            << "device " << me << ", element " << i;
  }
}

}  // namespace
}  // namespace meshcast
