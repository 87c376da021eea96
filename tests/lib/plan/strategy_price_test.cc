// strategy_price(): a strategy's price from the tasks equals the prediction of the plan built
// with that strategy and sender rule, over random layouts, meshes and topologies (several NICs
// per host, hosts of uneven size, per-message overheads); auto builds the least priced; the
// memory bound refuses in one line.
#include "lib/plan/strategy_price.h"

#include <gtest/gtest.h>

#include <limits>

#include "lib/plan/planner.h"
#include "meshcast/error.h"
#include "meshcast/plan.h"
#include "meshcast/plan_size.h"
#include "support/strategy_price.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;

// The price, the prediction of the plan built alike, and the two within rounding.
void expect_price_matches(const testing::Case& c, const Topology& topo, Strategy st, Balance rule,
                          std::int64_t chunk, const std::string& ctx, bool fork = true) {
  PlanOptions opt;
  opt.strategy = st;
  opt.balance = rule;
  opt.chunk_bytes = chunk;
  opt.fork = fork;
  const Plan p = plan(c.src, c.dst, topo, opt);
  const double want = p.stats().predicted_seconds;
  const double got = testing::strategy_price(c.src, c.dst, topo, st, rule, chunk, nullptr, fork);
  ASSERT_NEAR(got, want, 1e-9 * std::max(want, 1e-12))
      << ctx << " strategy " << to_string(st) << " rule " << to_string(rule) << " fork " << fork
      << "\n"
      << p.str(64);
}

TEST(StrategyPrice, EqualsThePredictionOfThePlanBuilt) {
  Rng rng(0x5717);
  testing::Limits lim;
  lim.max_volume = 96;
  lim.max_extent = 8;
  lim.max_mesh_size = 12;
  lim.max_mesh_extent = 6;
  lim.pool = 24;
  const int n = testing::scaled(1500);
  for (int i = 0; i < n; ++i) {
    const auto c = testing::random_case(rng, lim);
    const Topology topo = i % 7 == 0 ? Topology::single_host() : random_topology(rng, lim.pool);
    const std::int64_t chunk = rng.chance(1, 2) ? kDefaultChunkBytes : rng.between(1, 64);
    const std::string ctx = "case " + std::to_string(i) + ": " + c.str() + "\n" + topo.to_json();
    for (Strategy st : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv})
      for (Balance rule : {Balance::None, Balance::Local})
        ASSERT_NO_FATAL_FAILURE(expect_price_matches(c, topo, st, rule, chunk, ctx));
    // Chains that may not fork (PlanOptions::fork), priced as built.
    ASSERT_NO_FATAL_FAILURE(
        expect_price_matches(c, topo, Strategy::Broadcast, Balance::Local, chunk, ctx, false));
  }
}

// Wide all-gathers: many receivers over many hosts and NICs, where the closed form of the
// forwarding chains matters most (one task, r receivers, r^2 hops).
TEST(StrategyPrice, AllGatherClosedFormOnWideReplicas) {
  Rng rng(0xa11);
  for (int i = 0; i < testing::scaled(60); ++i) {
    const int pool = static_cast<int>(rng.between(8, 96));
    const Topology topo = random_topology(rng, pool);
    std::vector<int> ids(static_cast<std::size_t>(pool));
    for (int k = 0; k < pool; ++k) ids[static_cast<std::size_t>(k)] = k;
    rng.shuffle(ids);
    const auto ns = rng.between(1, pool / 4), nd = rng.between(2, pool - ns);
    const std::vector<int> s_dev(ids.begin(), ids.begin() + ns);
    const std::vector<int> d_dev(ids.begin() + ns, ids.begin() + ns + nd);
    const Shape shape{rng.between(1, 3 * nd), rng.between(1, 4)};
    testing::Case c{Layout(shape, DType::f32, Mesh({ns}, s_dev), ShardingSpec::parse("RR")),
                    Layout(shape, DType::f32, Mesh({nd}, d_dev), ShardingSpec::parse("RR")),
                    testing::Devices::Disjoint};
    const std::int64_t chunk = rng.chance(1, 2) ? kDefaultChunkBytes : rng.between(1, 32);
    const std::string ctx = "case " + std::to_string(i) + ": " + c.str() + "\n" + topo.to_json();
    for (Balance rule : {Balance::None, Balance::Local})
      ASSERT_NO_FATAL_FAILURE(expect_price_matches(c, topo, Strategy::AllGather, rule, chunk, ctx));
  }
}

// Random complete-source moves of many tasks per tile (replicated sources and targets, several
// NICs, uneven hosts, trees of chains on wide replicas), priced by class where
// priced_by_class() says so: every price equals the built plan's prediction, under both sender
// rules, and with forks off. Returns how many of the n cases were priced by class.
int expect_by_class_matches(Rng& rng, int n, bool hosts_of_their_own) {
  testing::Limits lim;
  lim.max_volume = 600;
  lim.max_extent = 40;
  lim.max_mesh_size = 32;
  lim.max_mesh_extent = 8;
  lim.pool = 64;
  int classed = 0;
  for (int i = 0; i < n; ++i) {
    const auto rel =
        hosts_of_their_own ? testing::Devices::Disjoint : static_cast<testing::Devices>(i % 4);
    const auto [sm, dm] = testing::random_meshes(rng, lim, rel);
    const Shape shape = testing::random_shape(rng, lim);
    const DType dtype = testing::dtype_at(i);
    const testing::Case c{
        Layout(shape, dtype, sm, testing::random_spec(rng, shape.size(), sm.ndim(), false)),
        Layout(shape, dtype, dm,
               testing::random_spec(rng, shape.size(), dm.ndim(), rng.chance(1, 4))),
        rel};
    const Topology topo = hosts_of_their_own ? random_topology(rng, {sm.devices(), dm.devices()})
                                             : random_topology(rng, lim.pool);
    const std::int64_t chunk = rng.chance(1, 2) ? kDefaultChunkBytes : rng.between(1, 64);
    const std::string ctx = "case " + std::to_string(i) + ": " + c.str() + "\n" + topo.to_json();
    const TaskGrid grid(c.src, c.dst);
    const detail::LinkTimeline s(topo, detail::union_devices(c.src, c.dst), dtype_size(dtype),
                                 chunk);
    classed += detail::priced_by_class(grid, s, Balance::Local);
    for (Strategy st : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv})
      for (Balance rule : {Balance::None, Balance::Local}) {
        expect_price_matches(c, topo, st, rule, chunk, ctx);
        if (::testing::Test::HasFatalFailure()) return classed;
      }
    expect_price_matches(c, topo, Strategy::Broadcast, Balance::Local, chunk, ctx, false);
    if (::testing::Test::HasFatalFailure()) return classed;
  }
  return classed;
}

// A training mesh and an inference mesh on hosts of their own: a task's receivers are its
// tile's targets, every hop from its sender leaves the sender's host.
TEST(StrategyPrice, ByClassOnHostsOfTheirOwn) {
  Rng rng(0xc1a55);
  const int n = testing::scaled(300);
  const int classed = expect_by_class_matches(rng, n, true);
  EXPECT_GE(classed * 3, n) << classed << " of " << n << " cases priced by class";  // 153 of 300
}

// Meshes on shared hosts (the same devices, permuted, overlapping or disjoint): targets that hold
// the box copy it, the others are a group; a sender with receivers on its host starts its
// chain there and sends to them within the host.
TEST(StrategyPrice, ByClassOnSharedHosts) {
  Rng rng(0x5ba7ed);
  const int n = testing::scaled(400);
  const int classed = expect_by_class_matches(rng, n, false);
  EXPECT_GE(classed * 4, n) << classed << " of " << n << " cases priced by class";  // 177 of 400
}

// Auto builds the strategy of least price (ties to the earlier), and nothing else; under greedy
// and search, whatever PlanOptions::fork says.
TEST(StrategyPrice, AutoBuildsTheLeastPriced) {
  Rng rng(0xa070);
  testing::Limits lim;
  lim.max_volume = 64;
  lim.pool = 20;
  for (int i = 0; i < testing::scaled(400); ++i) {
    const auto c = testing::random_case(rng, lim);
    const Topology topo = random_topology(rng, lim.pool);
    PlanOptions opt;
    opt.balance = i % 2 ? Balance::None : Balance::Local;
    const Plan a = plan(c.src, c.dst, topo, opt);
    bool fans_out = true;
    std::optional<Strategy> best;
    double best_price = 0;
    for (Strategy st : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv}) {
      const double p =
          testing::strategy_price(c.src, c.dst, topo, st, opt.balance, opt.chunk_bytes, &fans_out);
      if (!best || p < best_price * (1 - 1e-9)) best = st, best_price = p;
    }
    const std::string ctx = "case " + std::to_string(i) + ": " + c.str();
    ASSERT_EQ(a.strategy(), fans_out ? *best : Strategy::Broadcast) << ctx;
    PlanOptions named = opt;
    named.strategy = a.strategy();
    ASSERT_TRUE(a == plan(c.src, c.dst, topo, named)) << ctx;
    ASSERT_NEAR(a.stats().predicted_seconds, best_price, 1e-9 * best_price) << ctx;
    // Greedy and search place plain chains: there PlanOptions::fork changes nothing, not even
    // auto's choice (which once priced forks that these balances then did not build).
    PlanOptions scheduled;
    scheduled.balance = i % 2 ? Balance::Greedy : Balance::Search;
    scheduled.search_moves = 50;
    const Plan forked = plan(c.src, c.dst, topo, scheduled);
    scheduled.fork = false;
    ASSERT_TRUE(forked == plan(c.src, c.dst, topo, scheduled)) << ctx << "\n" << forked.str(64);
  }
}

// Many tasks sharing receivers (S0R>RS0-like grids of a few hundred tasks, uneven extents): the
// allgather's forwarding is priced once per class of tasks and added at flushes, sendrecv and
// allgather only until they reach broadcast's price. Every price still equals the built plan's
// prediction, and auto still builds the least priced.
TEST(StrategyPrice, ManyTasksOfRepeatedReceivers) {
  Rng rng(0xc1a5);
  for (int i = 0; i < testing::scaled(24); ++i) {
    const auto a = rng.between(3, 16), b = rng.between(2, 6), c = rng.between(2, 16);
    const auto rows = rng.between(a, 3 * a), cols = rng.between(c, 40);
    const std::string s_mesh =
        std::to_string(a) + "x" + std::to_string(b) + "@0-" + std::to_string(a * b - 1);
    const std::string d_mesh = std::to_string(c) + "x" + std::to_string(b) + "@" +
                               std::to_string(a * b) + "-" + std::to_string(a * b + c * b - 1);
    const auto src = Layout::parse({rows, cols}, DType::f32, s_mesh + ":S0R");
    const auto dst =
        Layout::parse({rows, cols}, DType::f32, d_mesh + (rng.chance(1, 2) ? ":RS0" : ":RS01"));
    const Topology topo = random_topology(rng, static_cast<int>(a * b + c * b));
    const testing::Case tc{src, dst, testing::Devices::Disjoint};
    const std::string ctx = "case " + std::to_string(i) + ": " + tc.str() + "\n" + topo.to_json();
    for (Strategy st : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv})
      ASSERT_NO_FATAL_FAILURE(
          expect_price_matches(tc, topo, st, Balance::Local, kDefaultChunkBytes, ctx));
    PlanOptions opt;
    opt.balance = Balance::Local;
    std::optional<Strategy> best;
    double best_price = 0;
    for (Strategy st : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv}) {
      const double p = testing::strategy_price(src, dst, topo, st, Balance::Local, opt.chunk_bytes);
      if (!best || p < best_price * (1 - 1e-9)) best = st, best_price = p;
    }
    ASSERT_EQ(plan(src, dst, topo, opt).strategy(), *best) << ctx;
  }
}

// A 4-byte tensor replicated on thousands of devices: a chain through them all pays a hop's
// latency per receiver, one send per receiver from holders in rotation pays about one. Auto
// prices allgather's r^2 hops without building them and builds the sends.
TEST(StrategyPrice, AutoOnAWideReplicaSendsInParallel) {
  const auto src = Layout::parse({1}, DType::f32, "4096@0-4095:R");
  const auto dst = Layout::parse({1}, DType::f32, "4096@4096-8191:R");
  const Topology topo =
      Topology::uniform("8-per-host", 1024, 8, LinkClass{"nvlink", 150e9, 2e-6, {}, 1e-6},
                        LinkClass{"network", 25e9, 5e-6, {}, 2e-6});
  PlanOptions opt;
  opt.balance = Balance::Local;
  const Plan p = plan(src, dst, topo, opt);
  EXPECT_EQ(p.strategy(), Strategy::SendRecv);
  ASSERT_EQ(p.ops().size(), 4096u);
  opt.strategy = Strategy::Broadcast;
  // (Broadcast's one multicast to 4,096 is a tree of chains: ~0.7 ms, ~100x the parallel sends.)
  EXPECT_LT(p.stats().predicted_seconds * 50, plan(src, dst, topo, opt).stats().predicted_seconds);
  // Under search, sendrecv's ops (a send per receiver, each kept twice) exceed a bound that
  // broadcast's fit: auto builds sendrecv with the local rule rather than the worse broadcast.
  opt = {};
  opt.max_plan_bytes =
      static_cast<std::int64_t>(estimate_plan_size(src, dst, Strategy::SendRecv).bytes) - 1;
  const Plan q = plan(src, dst, topo, opt);
  EXPECT_EQ(q.strategy(), Strategy::SendRecv);
  EXPECT_EQ(q.balance(), Balance::Local);
  EXPECT_TRUE(q == p);
}

// Pricing an all-gather is O(devices^2). Under a cap of 1/16 of kAutoWork (the same code, in
// a sixteenth of the time): over 256 devices auto prices it whole; over 1,024 it stops past the
// cap and takes the strategy of the smallest part, unpriced, not the one pricing it whole
// finds, and the same each time (every device of a job computes it alone).
TEST(StrategyPrice, AutoPastItsWorkTakesTheSmallestPartUnpriced) {
  const Topology topo =
      Topology::uniform("8-per-host", 128, 8, LinkClass{"nvlink", 150e9, 2e-6, {}, 1e-6},
                        LinkClass{"network", 25e9, 5e-6, {}, 2e-6});
  PlanOptions opt;
  opt.balance = Balance::Local;
  const std::int64_t cap = detail::kAutoWork / 16;
  const auto gather = [](int n) {
    const std::string mesh = std::to_string(n) + "@0-" + std::to_string(n - 1);
    return std::pair{Layout::parse({std::int64_t{1} << 22}, DType::f32, mesh + ":S0"),
                     Layout::parse({std::int64_t{1} << 22}, DType::f32, mesh + ":R")};
  };
  const auto choose = [&](int n, std::int64_t work_cap) {
    const auto [src, dst] = gather(n);
    const TaskGrid grid(src, dst);
    const detail::LinkTimeline s(topo, detail::union_devices(src, dst), dtype_size(src.dtype()),
                                 opt.chunk_bytes);
    return detail::auto_strategy(grid, s, opt, work_cap);
  };
  const detail::AutoChoice small = choose(256, cap);
  EXPECT_LT(small.work, cap);
  const auto [src, dst] = gather(256);
  Strategy least = Strategy::Auto;
  double least_price = 0;
  for (Strategy st : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv}) {
    const double p = testing::strategy_price(src, dst, topo, st, Balance::Local, opt.chunk_bytes);
    if (least == Strategy::Auto || p < least_price * (1 - 1e-9)) least = st, least_price = p;
  }
  EXPECT_EQ(small.strategy, least);

  const detail::AutoChoice whole = choose(1024, std::numeric_limits<std::int64_t>::max());
  const detail::AutoChoice large = choose(1024, cap);
  EXPECT_GE(large.work, cap);
  EXPECT_LT(large.work, whole.work / 2);  // it stopped
  const auto [src4, dst4] = gather(1024);
  const Strategy smallest = estimate_part_size(src4, dst4, Strategy::Auto).strategy;
  ASSERT_NE(whole.strategy, smallest) << "the test needs a move priced otherwise";
  EXPECT_EQ(large.strategy, smallest);
  EXPECT_EQ(large.balance, Balance::Local);
  const detail::AutoChoice again = choose(1024, cap);
  EXPECT_EQ(again.strategy, large.strategy);
  EXPECT_EQ(again.work, large.work);
}

TEST(StrategyPrice, TheMemoryBoundRefusesInOneLine) {
  // Two holders per tile: greedy and search have senders to choose, and keep the candidates.
  const auto src = Layout::parse({64, 64}, DType::f32, "32x2@0-63:S0R");
  const auto dst = Layout::parse({64, 64}, DType::f32, "64@64-127:RS0");
  PlanOptions opt;
  opt.strategy = Strategy::AllGather;
  opt.max_plan_bytes = 1000;
  try {
    (void)plan(src, dst, Topology::single_host(), opt);
    FAIL() << "no error";
  } catch (const ValidationError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_NE(what.find("plan memory"), std::string::npos) << what;
    EXPECT_NE(what.find("1000 B"), std::string::npos) << what;  // the bound
    EXPECT_NE(what.find("allgather"), std::string::npos) << what;
    EXPECT_NE(what.find("max_plan_bytes"), std::string::npos) << what;
  }
  // Auto leaves out what does not fit: at a bound of its smallest estimate it builds that
  // strategy under that balance (here broadcast with the local rule); below it, nothing.
  opt.strategy = Strategy::Auto;
  const PlanSize least = estimate_plan_size(src, dst, Strategy::Auto);
  EXPECT_EQ(least.strategy, Strategy::Broadcast);
  EXPECT_EQ(least.balance, Balance::Local);
  opt.max_plan_bytes = static_cast<std::int64_t>(
      with_hosts(least, host_bytes(Topology::single_host(), src, dst)).bytes);
  const Plan p = plan(src, dst, Topology::single_host(), opt);
  EXPECT_EQ(p.strategy(), least.strategy);
  EXPECT_EQ(p.balance(), least.balance);
  opt.max_plan_bytes -= 1;
  EXPECT_THROW((void)plan(src, dst, Topology::single_host(), opt), ValidationError);
  // One holder per tile: no choice, search plans as none does, and is estimated so.
  const auto one = Layout::parse({64, 64}, DType::f32, "64@0-63:S0R");
  EXPECT_EQ(estimate_plan_size(one, dst, Strategy::Broadcast, Balance::Search).bytes,
            estimate_plan_size(one, dst, Strategy::Broadcast, Balance::None).bytes);
}

}  // namespace
}  // namespace meshcast
