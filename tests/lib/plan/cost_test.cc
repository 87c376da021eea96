// The cost model and the simulator: hand-computed times for single ops, chains and fair sharing
// of contended links; laws over random plans (predict() is the planner's estimate, nothing is
// faster than the busiest link, phases are respected, runs are deterministic); bad input.
#include "meshcast/cost.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>

#include "lib/plan/links.h"
#include "meshcast/error.h"
#include "support/testing.h"

namespace meshcast {
namespace {

// 4 hosts of 2 devices; round numbers so that expected times are easy to write down.
constexpr double kIntraBw = 10e9, kIntraLat = 1e-6, kNetBw = 1e9, kNetLat = 1e-3;

Topology hosts4() {
  return Topology::uniform("h4", 4, 2, LinkClass{"intra", kIntraBw, kIntraLat},
                           LinkClass{"network", kNetBw, kNetLat});
}

// A plan with hand-written ops over a 1-D f32 tensor of `n` elements on devices 0-7.
Plan hand_plan(std::int64_t n, std::vector<Op> ops) {
  const Layout l = Layout::parse({n}, DType::f32, "8@0-7:R");
  return Plan(l, l, Strategy::Broadcast, Balance::None, "h4", std::move(ops), PlanStats{});
}

Op send(std::int64_t lo, std::int64_t hi, int root, std::vector<int> peers, int phase = 0) {
  return Op{OpKind::Multicast, phase, Box({{lo, hi}}), root, std::move(peers), false};
}

constexpr std::int64_t kN = 1 << 22;                      // elements
constexpr double kBytes = 4.0 * static_cast<double>(kN);  // 16 MiB
constexpr double kChunk = static_cast<double>(kDefaultChunkBytes);

// The simulator bounds its memory by hop_links() before it builds any flow: the count must be
// what hop() appends.
TEST(Cost, HopLinksCountsTheLinksAHopAdds) {
  const Topology topo = hosts4();  // (Links keeps a pointer to it)
  const detail::Links links(topo, {0, 1, 2, 3, 4, 5, 6, 7});
  for (int from = 0; from < 8; ++from)
    for (int to = 0; to < 8; ++to) {
      detail::Links::Flow f{{}, {}, 1024};
      links.hop(from, to, 1, f);
      EXPECT_EQ(f.links.size(), static_cast<std::size_t>(links.hop_links(from, to)))
          << from << " -> " << to;
    }
}

TEST(Cost, OneSendAcrossHostsIsLatencyPlusBytesOverBandwidth) {
  const Plan p = hand_plan(kN, {send(0, kN, 0, {2})});
  const double want = kNetLat + kBytes / kNetBw;
  EXPECT_NEAR(predict(p, hosts4()).seconds, want, want * 1e-12);
  EXPECT_NEAR(simulate(p, hosts4()).seconds, want, want * 1e-12);
  EXPECT_NEAR(predict(p, hosts4()).bound_seconds, kBytes / kNetBw, 1e-12);
}

TEST(Cost, ChainPaysEveryHopsLatencyAndOneChunkPerHop) {
  // 0 -> 1 (same host) -> 2 -> 4 -> 6 (three more hosts): 1 intra hop, 3 network hops.
  const Plan p = hand_plan(kN, {send(0, kN, 0, {1, 2, 4, 6})});
  const double want = 3 * kNetLat + kIntraLat + 3 * kChunk / kNetBw + kChunk / kIntraBw +
                      (kBytes - kChunk) / kNetBw;
  EXPECT_NEAR(predict(p, hosts4()).seconds, want, want * 1e-12);
  EXPECT_NEAR(simulate(p, hosts4()).seconds, want, want * 1e-12);
  // A smaller chunk fills the pipeline sooner.
  EXPECT_LT(predict(p, hosts4(), 4096).seconds, want);
  EXPECT_NEAR(simulate(p, hosts4(), 4096).seconds, predict(p, hosts4(), 4096).seconds, 1e-12);
}

TEST(Cost, AChainHopPaysTheChainLatencyAndOneMessageItsLatency) {
  // A transport that sends a chain's small chunks without a handshake: chain hops pay 0.2 ms on
  // the network, a single message still pays kNetLat. Intra-host links give no chain latency.
  constexpr double kChainLat = 2e-4;
  const Topology t = Topology::uniform("h4", 4, 2, LinkClass{"intra", kIntraBw, kIntraLat},
                                       LinkClass{"network", kNetBw, kNetLat, kChainLat});
  const Plan one = hand_plan(kN, {send(0, kN, 0, {2})});
  EXPECT_NEAR(predict(one, t).seconds, kNetLat + kBytes / kNetBw, 1e-12);
  const Plan chain = hand_plan(kN, {send(0, kN, 0, {1, 2, 4, 6})});
  const double want = 3 * kChainLat + kIntraLat + 3 * kChunk / kNetBw + kChunk / kIntraBw +
                      (kBytes - kChunk) / kNetBw;
  EXPECT_NEAR(predict(chain, t).seconds, want, want * 1e-12);
  EXPECT_NEAR(simulate(chain, t).seconds, want, want * 1e-12);
}

TEST(Cost, ChainLatencyInTopologyFiles) {
  const std::string file = R"({"name": "c", "links": {"intra": {"bandwidth_gbyte_s": 1,
      "latency_us": 2}, "network": {"bandwidth_gbit_s": 1, "latency_us": 12000,
      "chain_latency_us": 2500, "nics_per_host": 1}}, "uniform": {"hosts": 2, "devices_per_host": 2}})";
  const Topology t = Topology::from_json(file);
  ASSERT_TRUE(t.network().chain_latency.has_value());
  EXPECT_NEAR(*t.network().chain_latency, 2.5e-3, 1e-15);
  EXPECT_FALSE(t.intra().chain_latency.has_value());
  EXPECT_EQ(t.network().hop_latency(true), *t.network().chain_latency);
  EXPECT_EQ(t.network().hop_latency(false), t.network().latency);
  const Topology again = Topology::from_json(t.to_json());
  EXPECT_EQ(again.network().chain_latency, t.network().chain_latency);
  EXPECT_EQ(again.to_json(), t.to_json());
  std::string bad = file;
  bad.replace(bad.find("2500"), 4, "-1");
  try {
    (void)Topology::from_json(bad);
    ADD_FAILURE() << "a negative chain latency was accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "topology.links.network.chain_latency_us");
  }
}

TEST(Cost, ConcurrentSendsShareTheirHostsLinkFairly) {
  // Three sends leave host 0 at once (to hosts 1, 2, 3): each gets a third of its link; one of
  // them is three times larger and finishes alone at full rate after the others.
  const Plan p = hand_plan(
      5 * kN, {send(0, kN, 0, {2}), send(kN, 2 * kN, 1, {4}), send(2 * kN, 5 * kN, 0, {6})});
  const Simulation s = simulate(p, hosts4());
  const double t = kBytes / kNetBw;
  EXPECT_NEAR(s.op_end[0], kNetLat + 3 * t, 1e-9);
  EXPECT_NEAR(s.op_end[1], kNetLat + 3 * t, 1e-9);
  EXPECT_NEAR(s.op_end[2], kNetLat + 5 * t, 1e-9);  // 3t alongside the others, 2t alone
  EXPECT_NEAR(s.seconds, kNetLat + 5 * t, 1e-9);
  // The list schedule runs them one after another: the same link-bound total.
  EXPECT_NEAR(predict(p, hosts4()).seconds, kNetLat + 5 * t, 1e-9);
}

TEST(Cost, SendsThroughDifferentNicsDoNotShare) {
  // Two NICs per host (of 2 devices): devices 0 and 1 leave host 0 through NICs of their own,
  // each at half the host's rate; two sends from device 0 share its NIC.
  const Topology t = Topology::from_json(R"({"name": "n2", "links": {"intra": {"bandwidth_gbyte_s":
      10, "latency_us": 1}, "network": {"bandwidth_gbit_s": 8, "latency_us": 1000,
      "nics_per_host": 2}}, "uniform": {"hosts": 4, "devices_per_host": 2}})");
  const double nic = t.nic_bandwidth(), t1 = kBytes / nic;
  ASSERT_DOUBLE_EQ(nic, 1e9);
  const Plan apart = hand_plan(2 * kN, {send(0, kN, 0, {2}), send(kN, 2 * kN, 1, {5})});
  EXPECT_NEAR(simulate(apart, t).seconds, kNetLat + t1, 1e-9);
  EXPECT_NEAR(predict(apart, t).seconds, kNetLat + t1, 1e-9);
  const Plan shared = hand_plan(2 * kN, {send(0, kN, 0, {2}), send(kN, 2 * kN, 0, {5})});
  EXPECT_NEAR(simulate(shared, t).seconds, kNetLat + 2 * t1, 1e-9);
  EXPECT_NEAR(predict(shared, t).seconds, kNetLat + 2 * t1, 1e-9);
  bool named = false;
  for (const LinkLoad& l : predict(apart, t).links) named |= l.name == "host host0 nic 1 out";
  EXPECT_TRUE(named);
}

TEST(Cost, MaxMinFairnessGivesWhatABottleneckLeavesToOthers) {
  // Host 0's out link carries A (0->2), B (0->4), D (1->6): a third each. Host 1's in link
  // carries A and C (6->3): C gets the two thirds that A leaves, and ends first; after it, A, B
  // and D keep their thirds.
  const Plan p = hand_plan(4 * kN, {send(0, kN, 0, {2}), send(kN, 2 * kN, 0, {4}),
                                    send(2 * kN, 3 * kN, 1, {6}), send(3 * kN, 4 * kN, 6, {3})});
  const Simulation s = simulate(p, hosts4());
  const double t = kBytes / kNetBw;
  EXPECT_NEAR(s.op_end[3], kNetLat + 1.5 * t, 1e-9);
  for (int i : {0, 1, 2}) EXPECT_NEAR(s.op_end[static_cast<std::size_t>(i)], kNetLat + 3 * t, 1e-9);
}

TEST(Cost, PhasesWaitForTheirDevices) {
  // Phase 1's op from device 2 starts only when device 2 has received in phase 0; device 6's
  // unrelated phase-1 op does not wait for anything.
  const Plan p =
      hand_plan(2 * kN, {send(0, kN, 0, {2}), send(0, kN, 2, {4}, 1), send(kN, 2 * kN, 6, {7}, 1)});
  const Simulation s = simulate(p, hosts4());
  const double hop = kNetLat + kBytes / kNetBw;
  EXPECT_NEAR(s.op_end[0], hop, 1e-9);
  EXPECT_NEAR(s.op_start[1], hop, 1e-9);
  EXPECT_NEAR(s.op_end[1], 2 * hop, 1e-9);
  EXPECT_EQ(s.op_start[2], 0);
}

TEST(Cost, LinkLoadsCountEveryHop) {
  const Plan p = hand_plan(kN, {send(0, kN, 0, {1, 2, 3})});
  std::map<std::string, std::int64_t> bytes;
  for (const LinkLoad& l : predict(p, hosts4()).links) bytes[l.name] = l.bytes;
  const auto b = static_cast<std::int64_t>(kBytes);
  EXPECT_EQ(bytes, (std::map<std::string, std::int64_t>{{"device 0 send", b},
                                                        {"device 1 recv", b},
                                                        {"device 1 send", b},
                                                        {"device 2 recv", b},
                                                        {"device 2 send", b},
                                                        {"device 3 recv", b},
                                                        {"host host0 out", b},
                                                        {"host host1 in", b}}));
}

TEST(Cost, BadInputIsRefusedNamingTheField) {
  const Plan p = hand_plan(16, {send(0, 16, 0, {2})});
  try {
    predict(p, hosts4(), 0);
    FAIL() << "chunk 0 accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "chunk_bytes");
  }
  EXPECT_THROW(simulate(p, hosts4(), -5), ValidationError);
  const Topology small =
      Topology::uniform("small", 1, 4, LinkClass{"intra", 1e9, 0}, LinkClass{"network", 1e9, 0});
  try {
    simulate(p, small);
    FAIL() << "a topology without device 7 accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "topology");
  }
}

// A hand-built plan's ops are checked before they index anything: a negative or far phase, a
// box of another ndim or past the tensor crashed predict() and simulate(). One need not write
// every element (the scenarios above do not).
TEST(Cost, AnOpThatIsNotValidIsRefusedBeforeItIsPriced) {
  const std::vector<Plan> bad = {
      hand_plan(16, {send(0, 16, 0, {2}, -3)}),
      hand_plan(16, {send(0, 16, 0, {2}, std::numeric_limits<int>::max())}),
      hand_plan(16, {send(0, 32, 0, {2})}),
      hand_plan(16, {Op{OpKind::Multicast, 0, Box({{0, 4}, {0, 4}}), 0, {2}, false}}),
      hand_plan(16, {send(0, 16, 0, {9})}),
  };
  for (const Plan& p : bad) {
    EXPECT_THROW(predict(p, hosts4()), ValidationError) << p.str();
    EXPECT_THROW(simulate(p, hosts4()), ValidationError) << p.str();
  }
}

TEST(Cost, FlowsThatEndWithinRoundingOfEachOtherEnd) {
  // 1 GiB in three uneven slices (allgather): flows of the second phase end a few picoseconds
  // apart, below the clock's resolution at ~2 s; the simulation must still end.
  const Shape shape{std::int64_t{1} << 28};
  const Topology p3 = Topology::load(MESHCAST_SOURCE_DIR "/meshes/aws-p3.8xlarge.json");
  PlanOptions o;
  o.strategy = Strategy::AllGather;
  const Plan p = plan(Layout::parse(shape, DType::f32, "1@0:R"),
                      Layout::parse(shape, DType::f32, "1x3@[4,5,6]:R"), p3, o);
  const Simulation s = simulate(p, p3);
  EXPECT_GE(s.seconds, predict(p, p3).bound_seconds);
  EXPECT_LT(s.events, 20);
}

// 4 hosts of 2 devices with per-message overheads.
constexpr double kIntraOver = 5e-6, kNetOver = 2e-5;
Topology hosts4_overhead() {
  return Topology::uniform("h4", 4, 2, LinkClass{"intra", kIntraBw, kIntraLat, {}, kIntraOver},
                           LinkClass{"network", kNetBw, kNetLat, {}, kNetOver});
}

TEST(Cost, TinySendsFromOneDevicePayOneOverheadEach) {
  // Device 0 sends one f32 to each of devices 1-7 (1 inside its host, 6 to other hosts), all in
  // one phase. The analytic model: device 0's send port posts 7 messages (1 intra, 6 network
  // overheads, 28 bytes) and the longest latency follows. The simulator: the intra send ends
  // long before the network ones start (after kNetLat); those 6 share device 0's port, which
  // posts them one overhead each.
  std::vector<Op> ops;
  for (int d = 1; d < 8; ++d) ops.push_back(send(d, d + 1, 0, {d}));
  const Plan p = hand_plan(8, ops);
  const Topology t = hosts4_overhead();
  const double model = kNetLat + kIntraOver + 6 * kNetOver + 28 / kIntraBw;
  EXPECT_NEAR(predict(p, t).seconds, model, model * 1e-12);
  const double sim = kNetLat + 6 * (kNetOver + 4 / kIntraBw);
  EXPECT_NEAR(simulate(p, t).seconds, sim, sim * 1e-12);
  // Without overheads the same fan-out costs one latency and almost nothing more.
  EXPECT_LT(predict(p, hosts4()).seconds, kNetLat + 1e-7);
  // The port's least time counts the messages it posts.
  EXPECT_NEAR(predict(p, t).bound_seconds, kIntraOver + 6 * kNetOver + 28 / kIntraBw, 1e-15);
}

TEST(Cost, AChainPaysAnOverheadPerChunkAtEveryHop) {
  // 0 -> 1 -> 2 -> 4 -> 6 in 4 KiB chunks: 4,096 messages per hop. A network hop's stage is its
  // sender port's overhead + copy (20.41 us) or the NIC's 4.10 us, whichever is more; an intra
  // hop's is 5.41 us (overhead + copy): the slowest stage paces the rest.
  const Plan p = hand_plan(kN, {send(0, kN, 0, {1, 2, 4, 6})});
  const Topology t = hosts4_overhead();
  const double c = 4096, m = kBytes / c;
  const double intra = kIntraOver + c / kIntraBw;
  const double net = std::max(kNetOver + c / kIntraBw, c / kNetBw);
  const double want = 3 * kNetLat + kIntraLat + intra + 3 * net + (m - 1) * std::max(intra, net);
  EXPECT_NEAR(predict(p, t, 4096).seconds, want, want * 1e-12);
  EXPECT_NEAR(simulate(p, t, 4096).seconds, want, want * 1e-12);
  EXPECT_NEAR(chain_seconds(static_cast<std::int64_t>(kBytes), 3, 1, t, 4096), want, want * 1e-12);
  // A message between two devices of a host: latency, overhead, bytes over the port.
  EXPECT_NEAR(round_seconds(1000, 1, 0, t), kIntraLat + kIntraOver + 1000 / kIntraBw, 1e-18);
  // Three messages from each sender, 6 through the busiest NIC: the NIC or the ports.
  EXPECT_NEAR(round_seconds(1e6, 3, 6, t),
              kNetLat + std::max(3 * (kNetOver + 1e6 / kIntraBw), 6e6 / kNetBw), 1e-15);
}

TEST(Cost, OneChainAloneIsTheClosedFormInBothModels) {
  // Random chains over random topologies with overheads: the simulator (one weighted flow over
  // every hop), predict() and chain_seconds() agree on a lone multicast.
  testing::Rng rng(0xc4a1);
  for (int iter = 0; iter < testing::scaled(300); ++iter) {
    const Topology t =
        Topology::uniform("r", 4, 2,
                          LinkClass{"intra",
                                    1e8 * static_cast<double>(rng.between(1, 100)),
                                    1e-6,
                                    {},
                                    1e-7 * static_cast<double>(rng.below(50))},
                          LinkClass{"network", 1e7 * static_cast<double>(rng.between(1, 100)), 1e-5,
                                    rng.chance(1, 2) ? std::optional<double>(3e-6) : std::nullopt,
                                    1e-7 * static_cast<double>(rng.below(50))});
    // A chain enters each host once (as chain_order makes it): else a link carries it twice.
    std::vector<int> order{1, 2, 3, 4, 5, 6, 7};
    rng.shuffle(order);
    order.resize(static_cast<std::size_t>(rng.between(1, 7)));
    std::stable_sort(order.begin(), order.end(), [](int a, int b) { return a / 2 < b / 2; });
    const std::int64_t n = rng.between(1, 1 << 16), chunk = rng.between(1, 1 << 14);
    const Plan p = hand_plan(n, {send(0, n, 0, order)});
    int net = 0, prev = 0;
    for (int d : order) {
      net += d / 2 != prev / 2;
      prev = d;
    }
    const double want = chain_seconds(4 * n, net, static_cast<int>(order.size()) - net, t, chunk);
    ASSERT_NEAR(predict(p, t, chunk).seconds, want, want * 1e-9) << iter;
    ASSERT_NEAR(simulate(p, t, chunk).seconds, want, want * 1e-9) << iter;
  }
}

// A tree of chains (Op::group), by hand: 5 hosts of 2, device 0 to devices 2..9.
TEST(Cost, ATreeOfChainsPaysItsDeepestPathAndItsSlowestHop) {
  const Topology t = Topology::uniform("h5", 5, 2, LinkClass{"intra", kIntraBw, kIntraLat},
                                       LinkClass{"network", kNetBw, kNetLat});
  const Layout l = Layout::parse({kN}, DType::f32, "10@0-9:R");
  auto tree = [&](std::int32_t group) {
    Op op = send(0, kN, 0, {2, 3, 4, 5, 6, 7, 8, 9});
    op.group = group;
    return Plan(l, l, Strategy::Broadcast, Balance::None, "h5", {op}, PlanStats{});
  };
  // Groups of 2, one per host: the trunk 0 -> 2 -> 4 -> 6 -> 8 crosses the network, each leader
  // also feeds its host's other device (its port copies each chunk twice, within the network's
  // pace). Deepest path 0 -> 2 -> 4 -> 6 -> 8 -> 9: 4 network hops and 1 inside a host.
  const double pairs = 4 * kNetLat + kIntraLat + 4 * kChunk / kNetBw + kChunk / kIntraBw +
                       (kBytes - kChunk) / kNetBw;
  EXPECT_NEAR(predict(tree(2), t).seconds, pairs, pairs * 1e-12);
  EXPECT_NEAR(simulate(tree(2), t).seconds, pairs, pairs * 1e-12);
  // The chain pays 4 more hops inside hosts.
  EXPECT_NEAR(predict(tree(0), t).seconds, chain_seconds(4 * kN, 4, 4, t), pairs * 1e-12);
  EXPECT_LT(pairs, chain_seconds(4 * kN, 4, 4, t));
  // Groups of 4 (2 hosts each): leader 2 sends to leader 6 and its group's chain leaves host 1
  // from device 3 to 4, both through host 1's one NIC, which then carries the box twice.
  // Deepest path 0 -> 2 -> 6 -> 7 -> 8 -> 9; every chunk at the shared NIC's pace.
  const double quads = 3 * kNetLat + 2 * kIntraLat + 4 * kChunk / kNetBw + 2 * kChunk / kIntraBw +
                       2 * (kBytes - kChunk) / kNetBw;
  EXPECT_NEAR(predict(tree(4), t).seconds, quads, quads * 1e-12);
  EXPECT_NEAR(simulate(tree(4), t).seconds, quads, quads * 1e-12);
  // The planner takes the pairs.
  PlanOptions opt;
  opt.strategy = Strategy::Broadcast;
  const Plan p = plan(Layout::parse({kN}, DType::f32, "1@0:R"),
                      Layout::parse({kN}, DType::f32, "8@2-9:R"), t, opt);
  ASSERT_EQ(p.ops().size(), 1u);
  EXPECT_EQ(p.ops()[0].group, 2) << p.str();
  EXPECT_NEAR(p.stats().predicted_seconds, pairs, pairs * 1e-12);
  // Accounting: one hop per receiver, the leaders' two.
  EXPECT_EQ(p.stats().bytes_network, 4 * static_cast<std::int64_t>(kBytes));
  EXPECT_EQ(p.stats().sent.at(2), 2 * static_cast<std::int64_t>(kBytes));
  EXPECT_EQ(p.stats().sent.count(3), 0u);
}

// Laws over random plans on a random small cluster.
TEST(Cost, LawsOverRandomPlans) {
  testing::Rng rng(0xc057);
  testing::Limits lim;
  lim.max_volume = 4096;
  lim.max_extent = 40;
  int checked = 0;
  for (int iter = 0; iter < testing::scaled(400); ++iter) {
    const auto c = testing::random_case(rng, lim);
    const Topology topo = Topology::uniform("r", 16, static_cast<int>(rng.between(1, 4)),
                                            LinkClass{"intra",
                                                      1e9 * static_cast<double>(rng.between(1, 50)),
                                                      1e-6,
                                                      {},
                                                      1e-7 * static_cast<double>(rng.below(30))},
                                            LinkClass{"network",
                                                      1e8 * static_cast<double>(rng.between(1, 20)),
                                                      1e-5,
                                                      {},
                                                      1e-7 * static_cast<double>(rng.below(30))});
    const auto devices = [&] {
      std::vector<int> d = c.src.mesh().devices();
      d.insert(d.end(), c.dst.mesh().devices().begin(), c.dst.mesh().devices().end());
      return d;
    }();
    if (*std::max_element(devices.begin(), devices.end()) >= topo.device_count()) continue;
    PlanOptions o;
    o.strategy = static_cast<Strategy>(rng.below(4));
    o.balance = static_cast<Balance>(rng.below(3));
    o.chunk_bytes = rng.between(1, 1 << 12);
    const Plan p = plan(c.src, c.dst, topo, o);
    const std::string ctx = c.str() + " strategy " + to_string(p.strategy());
    const Prediction pr = predict(p, topo, o.chunk_bytes);
    // predict() replays the planner's own estimate.
    ASSERT_DOUBLE_EQ(pr.seconds, p.stats().predicted_seconds) << ctx;
    const Simulation s = simulate(p, topo, o.chunk_bytes);
    // No link carries its bytes faster than its bandwidth.
    ASSERT_GE(s.seconds, pr.bound_seconds * (1 - 1e-9)) << ctx;
    // Each device runs its phases in order.
    for (std::size_t i = 0; i < p.ops().size(); ++i) {
      ASSERT_LE(s.op_start[i], s.op_end[i]) << ctx;
      ASSERT_LE(s.op_end[i], s.seconds) << ctx;
      for (std::size_t j = 0; j < p.ops().size(); ++j) {
        const Op &a = p.ops()[i], &b = p.ops()[j];
        if (a.phase >= b.phase) continue;
        auto devs = [](const Op& op) {
          std::vector<int> v = op.peers;
          v.push_back(op.root);
          return v;
        };
        const auto da = devs(a), db = devs(b);
        const bool shared = std::any_of(da.begin(), da.end(), [&](int d) {
          return std::find(db.begin(), db.end(), d) != db.end();
        });
        if (shared) {
          ASSERT_GE(s.op_start[j], s.op_end[i] - 1e-15) << ctx;
        }
      }
    }
    // The links that carry bytes are the same for both, and the runs are repeatable.
    ASSERT_EQ(s.links.size(), pr.links.size()) << ctx;
    const Simulation again = simulate(p, topo, o.chunk_bytes);
    ASSERT_EQ(again.seconds, s.seconds) << ctx;
    ASSERT_EQ(again.op_end, s.op_end) << ctx;
    ++checked;
  }
  EXPECT_GT(checked, testing::scaled(400) / 2);
}

}  // namespace
}  // namespace meshcast
