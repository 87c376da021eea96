// sync() on the in-process backend: random sets of tensors with random layouts, dtypes and casts,
// every device planning its own part, every element of every tensor checked by the tests' own
// reference; the plans' messages checked against the per-tensor plans they coalesce.
#include "meshcast/sync.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "lib/exec/chain_world.h"
#include "meshcast/meshcast.h"
#include "meshcast/plan_size.h"
#include "support/tensor_data.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;
constexpr int kSyncWorld = 12;

// 1..6 tensors of random cases; an f32 one is sometimes cast to bf16 or f16.
std::vector<TensorMove> random_tensors(Rng& rng) {
  testing::Limits lim;
  lim.pool = kSyncWorld;
  lim.max_mesh_size = 8;
  lim.max_volume = 200;
  lim.max_extent = 9;
  std::vector<TensorMove> out;
  const int n = 1 + static_cast<int>(rng.below(6));
  for (int i = 0; i < n; ++i) {
    const DType t = testing::dtype_at(rng.below(testing::kDTypeCount));
    auto c = testing::random_case(rng, lim, rng.chance(1, 2) ? DType::f32 : t);
    Layout dst = c.dst;
    if (c.src.dtype() == DType::f32 && rng.chance(1, 2))
      dst =
          Layout(dst.shape(), rng.chance(1, 2) ? DType::bf16 : DType::f16, dst.mesh(), dst.spec());
    out.push_back({"t" + std::to_string(i), c.src, dst});
  }
  return out;
}

std::string describe(const std::vector<TensorMove>& ts) {
  std::string s;
  for (const auto& t : ts)
    s += "\n  " + t.name + " " + shape_str(t.src.shape()) + " " + to_string(t.src.dtype()) + " " +
         t.src.str() + " -> " + to_string(t.dst.dtype()) + " " + t.dst.str();
  return s;
}

std::vector<int> devices_of(const std::vector<TensorMove>& ts) {
  std::vector<int> d;
  for (const auto& t : ts)
    for (const Mesh* m : {&t.src.mesh(), &t.dst.mesh()})
      d.insert(d.end(), m->devices().begin(), m->devices().end());
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  return d;
}

// Runs the device's part of a sync on its tiles of `bufs` (nullptr where a tile is empty).
void run_sync(const SyncPlan& p, Communicator& comm, std::vector<testing::Buffers>& bufs) {
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<const void*> src;
  std::vector<void*> dst;
  for (auto& b : bufs) {
    src.push_back(b.src[me].empty() ? nullptr : b.src[me].data());
    dst.push_back(b.dst[me].empty() ? nullptr : b.dst[me].data());
  }
  sync(p, comm.world(), src, dst);
}

TEST(Sync, RandomTensorSetsMatchTheReference) {
  Rng rng(0x51c0);
  const Topology topos[] = {Topology::single_host(), testing::three_hosts(),
                            testing::three_hosts(4)};
  const Strategy strategies[] = {Strategy::Auto, Strategy::Broadcast, Strategy::SendRecv,
                                 Strategy::AllGather};
  const int n = testing::scaled(250);
  for (int i = 0; i < n; ++i) {
    const auto tensors = random_tensors(rng);
    SyncOptions opt;
    opt.plan.strategy = strategies[rng.below(4)];
    if (rng.chance(1, 4)) opt.plan.balance = Balance::None;
    // Small bounds split boxes, fill the window and leave messages unpacked.
    // At least 8 addends of the largest element (random partial sums have at most 8).
    opt.max_staging_bytes =
        rng.chance(1, 3) ? 64 << 20 : 64 + static_cast<std::int64_t>(rng.below(600));
    if (rng.chance(1, 3)) opt.bucket_bytes = 8 + static_cast<std::int64_t>(rng.below(300));
    const Topology& topo = topos[rng.below(3)];
    const std::string ctx =
        "case " + std::to_string(i) + " staging " + std::to_string(opt.max_staging_bytes) +
        " bucket " + std::to_string(opt.bucket_bytes) + " strategy " +
        to_string(opt.plan.strategy) + " topology " + topo.name() + describe(tensors);
    std::vector<testing::Buffers> bufs;
    for (const auto& t : tensors) bufs.push_back(testing::make_buffers(t.src, t.dst, kSyncWorld));
    const auto before = bufs;
    const auto run = [&](Communicator& comm) {
      run_sync(plan_sync(tensors, comm.rank(), topo, opt), comm, bufs);
    };
    // Half on the engine's chains (the local transport fans a multicast out), in small chunks.
    if (rng.chance(1, 2)) {
      const std::size_t chunk = 4 + rng.below(60);
      testing::ChainWorld world(kSyncWorld, chunk, 3 * chunk);
      ASSERT_NO_THROW(world.run(run, devices_of(tensors))) << ctx << " (chains)";
    } else {
      LocalWorld world(kSyncWorld);
      ASSERT_NO_THROW(world.run(run, devices_of(tensors))) << ctx;
    }
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      std::string first;
      ASSERT_EQ(testing::check(tensors[t].dst, bufs[t], first), 0)
          << ctx << "\ntensor " << tensors[t].name << ": " << first;
      ASSERT_TRUE(bufs[t].src == before[t].src) << ctx << ": a source buffer changed";
    }
  }
}

// Chains that fork at the root (Op::fork): sources on 2-3 devices of host 0, each with a NIC of
// its own, targets on one other device there and on the other hosts, so that a broadcast from
// host 0 feeds its receiver there and, through its own NIC, the others. On the engine's chains
// in small chunks, every device planning its own part: every element arrives, and most syncs
// fork.
TEST(Sync, ForkedChainsCarryEveryElement) {
  Rng rng(0xf02c);
  const Topology topo = testing::three_hosts(4);
  const int n = testing::scaled(120);
  int forked = 0;
  for (int i = 0; i < n; ++i) {
    std::vector<TensorMove> tensors;
    for (int t = 0, count = static_cast<int>(rng.between(1, 4)); t < count; ++t) {
      auto near = testing::sample(rng, {0, 1, 2, 3}, 4);
      const auto s = static_cast<std::size_t>(rng.between(2, 3));
      std::vector<int> from(near.begin(), near.begin() + static_cast<std::ptrdiff_t>(s));
      std::vector<int> to{near[s]};
      const auto far = testing::sample(rng, {4, 5, 6, 7, 8, 9, 10, 11},
                                       static_cast<std::size_t>(rng.between(1, 5)));
      to.insert(to.end(), far.begin(), far.end());
      rng.shuffle(to);
      testing::Limits lim;
      lim.max_volume = 200;
      lim.max_extent = 9;
      const Shape shape = testing::random_shape(rng, lim);
      const Mesh sm(testing::random_mesh_shape_of(rng, static_cast<std::int64_t>(s), 2), from);
      const Mesh dm(testing::random_mesh_shape_of(rng, static_cast<std::int64_t>(to.size()), 2),
                    to);
      const DType dtype = rng.chance(1, 2) ? DType::f32 : testing::dtype_at(rng.below(8));
      tensors.push_back(
          {"t" + std::to_string(t),
           Layout(shape, dtype, sm,
                  testing::random_spec(rng, shape.size(), sm.ndim(), rng.chance(1, 3))),
           Layout(shape, dtype, dm, testing::random_spec(rng, shape.size(), dm.ndim(), false))});
    }
    SyncOptions opt;
    opt.plan.strategy = Strategy::Broadcast;
    opt.plan.balance = Balance::Local;
    if (rng.chance(1, 3)) opt.bucket_bytes = 8 + static_cast<std::int64_t>(rng.below(300));
    const std::string ctx = "case " + std::to_string(i) + describe(tensors);
    std::vector<testing::Buffers> bufs;
    for (const auto& t : tensors) bufs.push_back(testing::make_buffers(t.src, t.dst, kSyncWorld));
    std::atomic<bool> forks = false;
    const std::size_t chunk = 4 + rng.below(60);
    testing::ChainWorld world(kSyncWorld, chunk, 3 * chunk);
    ASSERT_NO_THROW(world.run(
        [&](Communicator& comm) {
          const SyncPlan p = plan_sync(tensors, comm.rank(), topo, opt);
          for (const auto& m : p.messages())
            if (m.fork != 0) forks = true;
          run_sync(p, comm, bufs);
        },
        devices_of(tensors)))
        << ctx;
    forked += forks;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      std::string first;
      ASSERT_EQ(testing::check(tensors[t].dst, bufs[t], first), 0)
          << ctx << "\ntensor " << tensors[t].name << ": " << first;
    }
  }
  EXPECT_GT(forked, n / 4);
}

// Coalescing moves exactly what the per-tensor plans move: under Balance::None (the plans' own
// senders) per (tensor, sender, receivers, phase) the same elements; every device that takes
// part in a message sees the same message; its boxes lie inside every receiver's target tile;
// a packed message is never larger than the bucket.
TEST(Sync, MessagesCarryWhatPerTensorPlansMove) {
  Rng rng(0xc0a1);
  const Topology topo = testing::three_hosts();
  for (int i = 0; i < testing::scaled(200); ++i) {
    const auto tensors = random_tensors(rng);
    SyncOptions opt;
    opt.plan.balance = Balance::None;
    opt.max_staging_bytes = 64 + static_cast<std::int64_t>(rng.below(2000));
    const std::int64_t bucket = std::max<std::int64_t>(1, opt.max_staging_bytes / 4);
    using Key = std::tuple<int, int, std::vector<int>, int>;  // tensor, root, peers, phase
    std::map<Key, std::int64_t> want, got;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const Layout dst(tensors[t].dst.shape(), tensors[t].src.dtype(), tensors[t].dst.mesh(),
                       tensors[t].dst.spec());
      const Plan p = plan(tensors[t].src, dst, topo, opt.plan);
      for (const Op& op : p.ops())
        if (op.kind == OpKind::Multicast || op.kind == OpKind::Reduce)
          want[{static_cast<int>(t), op.root, op.peers, op.phase}] += op.box.volume();
    }
    std::map<std::int64_t, SyncPlan::Message> seen;  // by stream
    for (int d : devices_of(tensors)) {
      const SyncPlan sp = plan_sync(tensors, d, topo, opt);
      for (const auto& m : sp.messages()) {
        ASSERT_TRUE(m.root == d || std::count(m.peers.begin(), m.peers.end(), d)) << i;
        ASSERT_TRUE(!m.packed || m.kind == OpKind::Reduce || m.bytes <= bucket) << i;
        const auto [it, fresh] = seen.emplace(m.stream, m);
        if (!fresh) {
          ASSERT_EQ(it->second.root, m.root) << i;
          ASSERT_EQ(it->second.peers, m.peers) << i;
          ASSERT_EQ(it->second.bytes, m.bytes) << i;
          ASSERT_EQ(it->second.segments.size(), m.segments.size()) << i;
          for (std::size_t k = 0; k < m.segments.size(); ++k)
            ASSERT_EQ(it->second.segments[k].box, m.segments[k].box) << i;
        }
        std::int64_t bytes = 0;
        for (const auto& s : m.segments) {
          const TensorMove& t = tensors[static_cast<std::size_t>(s.tensor)];
          if (m.kind == OpKind::Multicast) {
            for (int r : m.peers) ASSERT_TRUE(t.dst.tile_of(r).contains(s.box)) << i;
          }
          const DType wire = m.kind == OpKind::Reduce ? t.src.dtype() : t.dst.dtype();
          bytes += s.box.volume() * static_cast<std::int64_t>(dtype_size(wire));
          if (m.root == d) got[{s.tensor, m.root, m.peers, m.phase}] += s.box.volume();
        }
        ASSERT_EQ(bytes, m.bytes) << i;
      }
    }
    ASSERT_EQ(got, want) << "case " << i << describe(tensors);
  }
}

TEST(Sync, ManySmallTensorsCoalesce) {
  // 200 replicated norms from one trainer device to four generators on two hosts: one message
  // per (sender, receivers) instead of one per tensor: one chain under broadcast, one send per
  // receiver under sendrecv.
  std::vector<TensorMove> ts;
  for (int i = 0; i < 200; ++i)
    ts.push_back({"norm" + std::to_string(i), Layout::parse({64}, DType::f32, "1@0:R"),
                  Layout::parse({64}, DType::f32, "4@4-7:R")});
  const Topology topo = Topology::uniform("two", 2, 4, LinkClass{"intra", 50e9, 1e-6},
                                          LinkClass{"network", 1e9, 2e-5});
  SyncOptions o;
  o.plan.strategy = Strategy::Broadcast;
  const SyncPlan p = plan_sync(ts, 0, topo, o);
  EXPECT_EQ(p.stats().boxes, 200);
  EXPECT_EQ(p.stats().messages, 1);
  o.plan.strategy = Strategy::SendRecv;
  const SyncPlan q = plan_sync(ts, 0, topo, o);
  EXPECT_EQ(q.stats().boxes, 800);
  EXPECT_EQ(q.stats().messages, 4);
  const SyncStats whole = predict_sync(ts, topo, o);
  EXPECT_EQ(whole.bytes_moved, 200 * 64 * 4 * 4);
  EXPECT_GT(whole.link_bound_seconds, 0);
  EXPECT_GE(whole.predicted_seconds, whole.link_bound_seconds);
}

// Devices that plan from different models (a tensor's dtype, f32 against i32: the same bytes),
// or whose plans differ, fail naming it, instead of leaving wrong data.
TEST(Sync, DevicesThatRunDifferentPlansFailNamingWhatDiffers) {
  const auto model = [](DType t) {
    return std::vector<TensorMove>{
        {"a", Layout::parse({8, 8}, DType::f32, "2@0-1:S0R"),
         Layout::parse({8, 8}, DType::f32, "2@0-1:RS0")},
        {"b", Layout::parse({6, 4}, t, "2@0-1:S0R"), Layout::parse({6, 4}, t, "2@0-1:RS0")}};
  };
  const auto run = [&](const std::vector<SyncPlan>& plans) {
    std::vector<std::string> out(2);
    std::vector<std::vector<std::byte>> bytes(8, std::vector<std::byte>(256));
    LocalWorld world(2);
    world.run([&](Communicator& comm) {
      const auto me = static_cast<std::size_t>(comm.rank());
      std::vector<const void*> src{bytes[4 * me].data(), bytes[4 * me + 1].data()};
      std::vector<void*> dst{bytes[4 * me + 2].data(), bytes[4 * me + 3].data()};
      try {
        sync(plans[me], comm.world(), src, dst);
      } catch (const Error& e) {
        out[me] = e.what();
      }
    });
    return out;
  };
  const SyncOptions o;
  auto out = run({plan_sync(model(DType::f32), 0, Topology::single_host(), o),
                  plan_sync(model(DType::i32), 1, Topology::single_host(), o)});
  EXPECT_TRUE(out[0].rfind("model: device 1 syncs another model than this device's 2 tensors", 0) ==
                  0 ||
              out[1].rfind("model: device 0 syncs another model", 0) == 0)
      << out[0] << "\n"
      << out[1];
  EXPECT_NE(out[0], "");
  EXPECT_NE(out[1], "");
  // The same model: both return.
  out = run({plan_sync(model(DType::f32), 0, Topology::single_host(), o),
             plan_sync(model(DType::f32), 1, Topology::single_host(), o)});
  EXPECT_EQ(out, (std::vector<std::string>{"", ""}));
}

// A receiver whose model casts a tensor the others do not expects fewer bytes: the message of
// another length may complete before its sender's word is checked, and the failure is still
// named as the model's, not as a length ("sent 64 bytes where 48 were expected"), every time.
TEST(Sync, AModelThatDiffersIsNamedBeforeTheLengthsItsMessagesHave) {
  const auto model = [](DType a) {
    return std::vector<TensorMove>{{"a", Layout::parse({8, 4}, DType::f32, "2@0-1:S0R"),
                                    Layout::parse({8, 4}, a, "2@2-3:RS0")},
                                   {"b", Layout::parse({8, 4}, DType::f32, "2@0-1:S0R"),
                                    Layout::parse({8, 4}, DType::f32, "2@2-3:RS0")}};
  };
  for (int run = 0; run < testing::scaled(30); ++run) {
    std::vector<std::string> out(4);
    std::vector<std::vector<std::byte>> bytes(16, std::vector<std::byte>(256));
    LocalWorld world(4, 0, 10.0);
    world.run([&](Communicator& comm) {
      const auto me = static_cast<std::size_t>(comm.rank());
      const SyncPlan p = plan_sync(model(me == 2 ? DType::f16 : DType::f32), comm.rank(),
                                   Topology::single_host(), SyncOptions{});
      std::vector<const void*> src{bytes[4 * me].data(), bytes[4 * me + 1].data()};
      std::vector<void*> dst{bytes[4 * me + 2].data(), bytes[4 * me + 3].data()};
      try {
        sync(p, comm.world(), src, dst);
      } catch (const Error& e) {
        out[me] = e.what();
      }
    });
    int named = 0;
    for (const std::string& o : out) {
      EXPECT_EQ(o.find("bytes where"), std::string::npos) << "run " << run << ": " << o;
      named += o.find("syncs another model") != std::string::npos;
    }
    EXPECT_GE(named, 1) << "run " << run << ": " << out[2];
  }
}

// The model digest the devices compare is of the layouts' structure, not their text: names
// "ab"+"c" and "a"+"bc" differ, and so do axes 1,0 and 0,1. (A spec's "S10" could once read as
// axes 1 and 0 or axis 10; meshes now have at most 10 axes, mesh_test.)
TEST(Sync, TheModelDigestTellsApartWhatTextConfuses) {
  const Mesh m(std::vector<std::int64_t>(2, 1), {0});  // 2 axes of extent 1
  const auto layout = [&](std::vector<int> axes) {
    return Layout({4}, DType::f32, m, ShardingSpec({std::move(axes)}));
  };
  const Layout dst = Layout::parse({4}, DType::f32, "1@1:R");
  const auto digest = [&](std::vector<TensorMove> ts) {
    return plan_sync(std::move(ts), 1, Topology::single_host()).model_digest();
  };
  EXPECT_NE(digest({{"w", layout({1, 0}), dst}}), digest({{"w", layout({0, 1}), dst}}));
  EXPECT_NE(digest({{"ab", dst, layout({0})}, {"c", dst, layout({0})}}),
            digest({{"a", dst, layout({0})}, {"bc", dst, layout({0})}}));
  EXPECT_EQ(digest({{"w", layout({1, 0}), dst}}), digest({{"w", layout({1, 0}), dst}}));
}

// Auto prices each tensor alone; where its choices do not fit together in a device's part, the
// tensors that save the most take the strategy of their smallest part. Here allgather (each of
// 64 replicas takes part in every other's forward of every box) against broadcast's chain per box.
TEST(Sync, AutoTakesTheSmallestPartsWhereItsChoicesDoNotFitTogether) {
  const Layout src = Layout::parse({std::int64_t{1} << 24}, DType::f32, "8@0-7:S0");
  const Layout dst = Layout::parse({std::int64_t{1} << 24}, DType::f32, "64@8-71:R");
  ASSERT_EQ(plan(src, dst).strategy(), Strategy::AllGather);
  std::vector<TensorMove> ts;
  for (int i = 0; i < 128; ++i)
    ts.push_back({std::string("t").append(std::to_string(i)), src, dst});
  SyncOptions o;
  const SyncStats free = plan_sync(ts, 8, Topology::single_host(), o).stats();
  EXPECT_GT(free.messages, 128 * 64);  // its slice, its forward and the others' per tensor
  // A bound that 128 broadcast parts just fit, and one tensor's whole allgather plan too.
  const PlanSize chain = estimate_part_size(src, dst, Strategy::Broadcast);
  o.plan.max_plan_bytes =
      static_cast<std::int64_t>(std::ceil(128 * (chain.bytes - chain.transient) + chain.transient));
  ASSERT_LT(estimate_plan_size(src, dst, Strategy::AllGather, Balance::Local).bytes,
            static_cast<double>(o.plan.max_plan_bytes));
  const SyncStats bounded = plan_sync(ts, 8, Topology::single_host(), o).stats();
  EXPECT_EQ(bounded.messages, 128 * 8);  // a chain per box, every one through device 8
  EXPECT_EQ(bounded.bytes_moved, free.bytes_moved);
  // Twice that: only some tensors give way.
  o.plan.max_plan_bytes *= 2;
  const SyncStats some = plan_sync(ts, 8, Topology::single_host(), o).stats();
  EXPECT_GT(some.messages, bounded.messages);
  EXPECT_LT(some.messages, free.messages);
  o.plan.strategy = Strategy::AllGather;  // asked for: refused, not changed
  try {
    (void)plan_sync(ts, 8, Topology::single_host(), o);
    ADD_FAILURE() << "allgather's parts were built past the bound";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "plan memory") << e.what();
  }
}

// A partial sum's reduce splits into pieces whose addends fit a bucket together, each a message
// listing every contributor: a device's part and a prediction count them before any is built.
// Here 64 contributors in pieces of 16 elements: 2^24 elements make 2^20 messages listing 64
// devices each, 256 MiB of lists alone, refused under a bound of 200 MiB that the tensor's
// tasks fit many times over; 2^16 elements make 4,096 and are built.
TEST(Sync, APartialSumsPiecesAreBoundedBeforeTheyAreBuilt) {
  const auto sum = [](std::int64_t n) {
    return std::vector<TensorMove>{{"w", Layout::parse({n}, DType::f32, "64@0-63:R+P0"),
                                    Layout::parse({n}, DType::f32, "64@64-127:S0")}};
  };
  SyncOptions o;
  o.bucket_bytes = 4096;  // 16 elements of each of 64 addends
  o.plan.max_plan_bytes = std::int64_t{200} << 20;
  const Topology topo = Topology::uniform("two", 2, 64, LinkClass{"intra", 50e9, 1e-6},
                                          LinkClass{"network", 1e9, 2e-5});
  const auto big = sum(std::int64_t{1} << 24);
  ASSERT_LT(estimate_part_size(big[0].src, big[0].dst, Strategy::Auto).bytes, 50 << 20);
  for (int device : {0, -1}) {
    try {
      if (device < 0)
        (void)predict_sync(big, topo, o);
      else
        (void)plan_sync(big, device, topo, o);
      ADD_FAILURE() << "device " << device << ": 2^20 reduce pieces were built past the bound";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "plan memory") << e.what();
      EXPECT_NE(std::string(e.what()).find("the largest: tensors.w"), std::string::npos)
          << e.what();
    }
  }
  const SyncPlan small = plan_sync(sum(std::int64_t{1} << 16), 0, topo, o);
  EXPECT_EQ(small.stats().messages, 4096);
  for (const auto& m : small.messages()) EXPECT_EQ(m.peers.size(), 64u);
}

// Any bound on staging up to 2^63 - 1 runs: the staging area rounds the bound up to whole
// lines, which passed 2^63 (a negative size, std::bad_alloc at the sender) above 2^63 - 64.
TEST(Sync, TheLargestStagingBoundsRun) {
  const Layout a = Layout::parse({64, 8}, DType::f32, "2@0-1:S0R");
  const Layout b = Layout::parse({64, 8}, DType::f32, "2@2-3:RS0");
  const std::vector<TensorMove> tensors = {{"w", a, b}};
  for (const std::int64_t bound :
       {std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max() - 63}) {
    SyncOptions opt;
    opt.max_staging_bytes = bound;
    std::vector<testing::Buffers> bufs = {testing::make_buffers(a, b, 4)};
    LocalWorld world(4);
    ASSERT_NO_THROW(world.run([&](Communicator& comm) {
      run_sync(plan_sync(tensors, comm.rank(), Topology::single_host(), opt), comm, bufs);
    })) << bound;
    std::string first;
    EXPECT_EQ(testing::check(b, bufs[0], first), 0) << bound << ": " << first;
  }
}

TEST(Sync, BadInputNamesTheField) {
  const Layout a = Layout::parse({8}, DType::f32, "2@0-1:S0");
  const Layout b = Layout::parse({8}, DType::f32, "2@2-3:R");
  auto field = [](const std::vector<TensorMove>& ts, SyncOptions o = {}) {
    try {
      plan_sync(ts, 0, Topology::single_host(), o);
    } catch (const ValidationError& e) {
      return std::string(e.field());
    }
    return std::string("no error");
  };
  EXPECT_EQ(field({{"w", a, b}, {"w", a, b}}), "tensors[1].name");
  EXPECT_EQ(field({{"", a, b}}), "tensors[0].name");
  // A name is copied into every device's part: at most kMaxTensorNameBytes.
  EXPECT_EQ(field({{std::string(kMaxTensorNameBytes, 'n'), a, b}}), "no error");
  EXPECT_EQ(field({{"w", a, b}, {std::string(kMaxTensorNameBytes + 1, 'n'), a, b}}),
            "tensors[1].name");
  EXPECT_EQ(field({{"w", a, Layout::parse({9}, DType::f32, "2@2-3:R")}}), "tensors[0].dst.shape");
  EXPECT_EQ(field({{"w", a, Layout::parse({8}, DType::i32, "2@2-3:R")}}), "tensors[0].dst.dtype");
  EXPECT_EQ(field({{"w", Layout::parse({8}, DType::bf16, "2@0-1:S0"),
                    Layout::parse({8}, DType::f32, "2@2-3:R")}}),
            "tensors[0].dst.dtype");
  SyncOptions o;
  o.max_staging_bytes = 7;
  EXPECT_EQ(field({{"w", a, b}}, o), "max_staging_bytes");
  o.max_staging_bytes = 64;
  o.bucket_bytes = 3;  // below one element of some dtype
  EXPECT_EQ(field({{"w", a, b}}, o), "bucket_bytes");
  o.bucket_bytes = 0;
  o.max_staging_bytes = 8;  // a sum of 4 f64 addends stages 32 bytes at least
  EXPECT_EQ(field({{"w", Layout::parse({8}, DType::f64, "2x2@0-3:R+P01"),
                    Layout::parse({8}, DType::f64, "2@4-5:R")}},
                  o),
            "max_staging_bytes");
  // Alike on a device that takes no part in the sum (device 0 only moves `v`): none is left
  // waiting for the others' refusal.
  EXPECT_EQ(field({{"v", a, b},
                   {"w", Layout::parse({8}, DType::f64, "2x2@4-7:R+P01"),
                    Layout::parse({8}, DType::f64, "2@8-9:R")}},
                  o),
            "max_staging_bytes");
}

}  // namespace
}  // namespace meshcast
