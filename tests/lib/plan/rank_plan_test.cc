// Per-rank plans: what a device computes alone (plan_rank) is exactly its part of the whole
// plan (Plan::rank) — the same ops, in the same order, with the same streams — over random
// layouts, meshes, strategies and topologies; and the whole plan under the local rule is valid.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "meshcast/error.h"
#include "meshcast/multicast_tree.h"
#include "meshcast/plan.h"
#include "meshcast/plan_size.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;

// Hosts of `per_host` devices (0, 1, ... in order), a NIC per device.
Topology nic_per_device(int hosts, int per_host) {
  std::vector<Topology::Host> h;
  for (int k = 0; k < hosts; ++k) {
    h.push_back({"host" + std::to_string(k), {}});
    for (int d = 0; d < per_host; ++d) h.back().devices.push_back(k * per_host + d);
  }
  return Topology::from_hosts("nics", h, LinkClass{"intra", 100e9, 1e-6},
                              LinkClass{"network", 1.25e9 * per_host, 1e-5}, per_host);
}

std::vector<Topology> topologies() {
  return {Topology::single_host(),
          Topology::uniform("four", 4, 4, LinkClass{"intra", 100e9, 1e-6},
                            LinkClass{"network", 1.25e9, 1e-5}),
          Topology::uniform("pairs", 8, 2, LinkClass{"intra", 50e9, 2e-6},
                            LinkClass{"network", 10e9, 5e-6}),
          nic_per_device(4, 4)};
}

TEST(RankPlan, EqualsTheDevicesPartOfTheWholePlan) {
  Rng rng(0x7a11);
  testing::Limits lim;
  lim.max_volume = 96;
  const auto topos = topologies();
  const Strategy strategies[] = {Strategy::Broadcast, Strategy::SendRecv, Strategy::AllGather,
                                 Strategy::Auto};
  const int n = testing::scaled(3000);
  for (int i = 0; i < n; ++i) {
    const auto c = testing::random_case(rng, lim);
    const Topology& topo = topos[static_cast<std::size_t>(i) % topos.size()];
    PlanOptions opt;
    opt.strategy = strategies[rng.below(4)];
    opt.balance = rng.chance(1, 3) ? Balance::None : Balance::Local;
    // A bound the whole plan just fits: no device's part may be refused under it.
    if (opt.strategy != Strategy::Auto && rng.chance(1, 2))
      opt.max_plan_bytes = static_cast<std::int64_t>(
          std::ceil(with_hosts(estimate_plan_size(c.src, c.dst, opt.strategy, opt.balance),
                               host_bytes(topo, c.src, c.dst))
                        .bytes));
    const Plan whole = plan(c.src, c.dst, topo, opt);
    const std::string ctx = "case " + std::to_string(i) + ": " + c.str() + " strategy " +
                            to_string(opt.strategy) + " balance " + to_string(opt.balance) +
                            " topology " + topo.name();
    ASSERT_NO_THROW(whole.validate()) << ctx << "\n" << whole.str(64);
    ASSERT_EQ(whole.balance(), opt.balance) << ctx;
    // Every device of either mesh, and one outside both (it takes part in nothing).
    std::vector<int> devices = whole.devices();
    devices.push_back(99);
    std::size_t listed = 0;
    // The bound plan_rank checks first holds every device's part: its ops, and its peer lists
    // at 8 bytes each within the bytes.
    const PlanSize part = estimate_part_size(c.src, c.dst, whole.strategy(), opt.balance);
    for (int d : devices) {
      const RankPlan mine = plan_rank(c.src, c.dst, d, topo, opt);
      double peers = 0;
      for (const Op& op : mine.ops()) peers += static_cast<double>(op.peers.size());
      ASSERT_LE(static_cast<double>(mine.ops().size()), part.ops) << ctx << " device " << d;
      ASSERT_LE(8 * peers, part.bytes) << ctx << " device " << d;
      const RankPlan cut = whole.rank(d);
      ASSERT_TRUE(mine == cut) << ctx << "\ndevice " << d << " alone:\n"
                               << mine.str(64) << "cut from the whole plan:\n"
                               << cut.str(64) << "whole:\n"
                               << whole.str(64);
      for (const Op& op : mine.ops()) listed += op.root == d ? 1 : 0;
    }
    // Each op has a root among the devices, so the parts cover the plan.
    ASSERT_EQ(listed, whole.ops().size()) << ctx;
  }
}

// A device's part is bounded before it is built: gathering a tensor on every one of n devices
// is a chain of n - 1 receivers per box under broadcast, n^2 peers at each device (at 65,536
// devices that ran out of memory), while sendrecv's part is two sends per box. Auto, whose whole
// plans fit no bound here, takes the smallest part. (4,096 devices under a 64 MiB bound stand
// in for 65,536 under 8 GiB.)
TEST(RankPlan, APartTooLargeIsRefusedBeforeItIsBuilt) {
  const int n = 4096;
  const std::string mesh = std::to_string(n) + "@0-" + std::to_string(n - 1);
  const Layout src = Layout::parse({std::int64_t{4} * n}, DType::f32, mesh + ":S0");
  const Layout dst = Layout::parse({std::int64_t{4} * n}, DType::f32, mesh + ":R");
  PlanOptions o;
  o.max_plan_bytes = std::int64_t{64} << 20;
  PlanOptions broadcast = o;
  broadcast.strategy = Strategy::Broadcast;
  try {
    (void)plan_rank(src, dst, 5, Topology::single_host(), broadcast);
    ADD_FAILURE() << "a broadcast part of n^2 peers was built";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "plan memory") << e.what();
    EXPECT_NE(std::string(e.what()).find("strategy broadcast"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)plan(src, dst, Topology::single_host(), o), ValidationError);
  const RankPlan mine = plan_rank(src, dst, 5, Topology::single_host(), o);
  EXPECT_EQ(mine.strategy(), Strategy::SendRecv);
  std::size_t peers = 0;
  for (const Op& op : mine.ops()) peers += op.peers.size();
  EXPECT_LE(peers, 2u * n);
  EXPECT_EQ(mine.ops().size(), 2u * n - 1);  // a send to each other, a receive from each, a copy
}

// Greedy and search need the whole plan: a device alone uses the local rule, and says so.
TEST(RankPlan, GlobalBalancersGiveWayToTheLocalRule) {
  const Layout src = Layout::parse({8, 8}, DType::f32, "2x2@0-3:S0R");
  const Layout dst = Layout::parse({8, 8}, DType::f32, "4@4-7:RS0");
  const auto topo = topologies()[1];
  for (Balance b : {Balance::Greedy, Balance::Search}) {
    PlanOptions opt;
    opt.balance = b;
    opt.strategy = Strategy::Broadcast;
    PlanOptions local = opt;
    local.balance = Balance::Local;
    const Plan whole = plan(src, dst, topo, local);
    for (int d = 0; d < 8; ++d) {
      const RankPlan mine = plan_rank(src, dst, d, topo, opt);
      EXPECT_EQ(mine.balance(), Balance::Local);
      EXPECT_TRUE(mine == whole.rank(d)) << mine.str();
    }
  }
}

// The local rule spreads a replicated source's boxes over its replicas and keeps a transfer
// inside a host when a replica lives there.
TEST(RankPlan, LocalRulePrefersAHolderOnTheReceiversHost) {
  // Source replicated on hosts 0 and 1 (devices 0-3, 4-7 of "four"); target on hosts 0 and 2.
  const auto topo = topologies()[1];
  const Layout src = Layout::parse({16, 4}, DType::f32, "2x4@0-7:RS1");
  const Layout dst = Layout::parse({16, 4}, DType::f32, "8@[0-3,8-11]:S0R");
  PlanOptions opt;
  opt.strategy = Strategy::Broadcast;
  opt.balance = Balance::Local;
  const Plan p = plan(src, dst, topo, opt);
  std::set<int> roots;
  for (const Op& op : p.ops()) {
    if (op.kind != OpKind::Multicast) continue;
    roots.insert(op.root);
    if (topo.host_of(op.peers[0]) == 0) {
      EXPECT_EQ(topo.host_of(op.root), 0) << p.str(64);
    }
  }
  EXPECT_GT(roots.size(), 2u) << p.str(64);  // more than one replica serves
}

// The bytes each device's NIC sends out of its host, over a plan's multicasts (a NIC per device).
std::map<int, std::int64_t> sent_out(const Plan& p, const Topology& t) {
  std::map<int, std::int64_t> out;
  for (const Op& op : p.ops()) {
    if (op.kind != OpKind::Multicast) continue;
    const auto n = static_cast<std::int64_t>(op.peers.size());
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t from = multicast_parent(k, n, op.group, op.fork);
      const int a = from < 0 ? op.root : op.peers[static_cast<std::size_t>(from)];
      if (t.host_of(a) != t.host_of(op.peers[static_cast<std::size_t>(k)]))
        out[a] += op.box.volume() * 4;
    }
  }
  return out;
}

std::int64_t busiest(const std::map<int, std::int64_t>& out) {
  std::int64_t most = 0;
  for (const auto& [d, b] : out) most = std::max(most, b);
  return most;
}

// Under the local rule a chain from a host whose source devices use more NICs than its
// receivers there forks at the root (Op::fork): what goes on to other hosts leaves through the
// roots' NICs, spread over the replicas, not through the one receiver of each tensor-parallel
// rank there. (Qwen3's sync on GB200 NVL72 in small: trainers on host 0, each holding a sixth,
// generators TP 2 x DP 3 with one replica on host 0.) A single source device does not fork: it
// would carry alone what the receivers on its host share, nor does a sum's root, nor any chain
// where PlanOptions::fork is off.
TEST(RankPlan, ChainsForkWhereTheSourcesNicsOutnumberTheReceivers) {
  const Topology t = nic_per_device(2, 8);
  PlanOptions opt;
  opt.strategy = Strategy::Broadcast;
  opt.balance = Balance::Local;
  const Layout src = Layout::parse({96, 16}, DType::f32, "6@0-5:S0R");
  const Layout dst = Layout::parse({96, 16}, DType::f32, "3x2@6-11:S1R");
  const Plan p = plan(src, dst, t, opt);
  ASSERT_NO_THROW(p.validate());
  std::vector<Op> chained = p.ops();
  std::int64_t forks = 0;
  for (Op& op : chained) {
    forks += op.fork != 0;
    if (op.fork != 0) {
      EXPECT_EQ(op.fork, 1) << p.str(64);  // after the one receiver on host 0
      EXPECT_EQ(t.host_of(op.root), 0);
    }
    op.fork = 0;
  }
  EXPECT_GT(forks, 0) << p.str(64);
  const Plan unforked(src, dst, p.strategy(), p.balance(), t.name(), chained, p.stats(),
                      p.streams());
  ASSERT_NO_THROW(unforked.validate());
  // Each TP rank's half leaves host 0 once: through device 6 or 7 alone, or spread over the
  // three source devices of that half.
  const std::int64_t half = 96 * 16 * 4 / 2;
  EXPECT_EQ(busiest(sent_out(unforked, t)), half);
  EXPECT_LE(busiest(sent_out(p, t)), half / 3 + 16 * 4) << p.str(64);
  for (int d : {0, 1}) EXPECT_EQ(plan_rank(src, dst, d, t, opt), p.rank(d));
  // PlanOptions::fork off: the same chains, none forked.
  PlanOptions chains = opt;
  chains.fork = false;
  EXPECT_EQ(plan(src, dst, t, chains).ops(), chained);

  // A sum's root sends on from its target tile, through a receiver's NIC as a chain would: no
  // fork.
  const Plan summed = plan(Layout::parse({96, 16}, DType::f32, "6@0-5:RR+P0"),
                           Layout::parse({96, 16}, DType::f32, "3@6-8:RR"), t, opt);
  std::int64_t onward = 0;
  for (const Op& op : summed.ops())
    if (op.kind == OpKind::Multicast && op.from_dst) {
      ++onward;
      EXPECT_EQ(op.fork, 0) << summed.str(64);
    }
  EXPECT_GT(onward, 0) << summed.str(64);

  const Plan one = plan(Layout::parse({96, 16}, DType::f32, "1@0:RR"),
                        Layout::parse({96, 16}, DType::f32, "15@1-15:RR"), t, opt);
  for (const Op& op : one.ops()) EXPECT_EQ(op.fork, 0) << one.str(64);
}

TEST(RankPlan, SaysWhoseItIs) {
  const Layout src = Layout::parse({4}, DType::f32, "2@0-1:S0");
  const Layout dst = Layout::parse({4}, DType::f32, "2@0-1:R");
  const RankPlan part = plan_rank(src, dst, 1);
  EXPECT_EQ(part.device(), 1);
  EXPECT_FALSE(part.ops().empty());
  EXPECT_NE(part.str().find("plan of device 1"), std::string::npos) << part.str();
}

}  // namespace
}  // namespace meshcast
