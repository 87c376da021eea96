// Trees of chains (meshcast/multicast_tree.h, lib/plan/multicast_tree.h): the edges form a tree;
// the model's closed form equals a brute-force walk of the tree's edges (per-link loads per
// message, every root-to-leaf path) on random small cases; the choice is never slower than one
// chain; huge multicasts become trees that cost about what one host's transfer costs.
#include "lib/plan/multicast_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <sstream>
#include <tuple>

#include "lib/plan/link_timeline.h"
#include "meshcast/cost.h"
#include "meshcast/plan.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using detail::MulticastTree;
using detail::OpTime;
using testing::Rng;

// chain_order against its definition (the root's host first, by id; then host by host, each
// from the rail of the root's NIC index, then by id): receivers given in any order (shuffled,
// host by host, hosts rotated, hosts permuted, each host's devices rotated), on hosts of 1 to 4
// NICs whose devices are numbered across hosts, not host by host.
TEST(ChainOrder, AnyOrderOfTheReceiversGivesTheDefinedChain) {
  Rng rng(0xc4a2);
  for (int iter = 0; iter < testing::scaled(400); ++iter) {
    const int hosts = static_cast<int>(rng.between(1, 9)),
              per = static_cast<int>(rng.between(1, 9));
    std::vector<Topology::Host> placed(static_cast<std::size_t>(hosts));
    for (int d = 0; d < hosts * per; ++d) {  // device d on host (d + d / hosts) % hosts
      auto& h = placed[static_cast<std::size_t>((d + d / hosts) % hosts)];
      h.devices.push_back(d);
    }
    for (int h = 0; h < hosts; ++h)
      placed[static_cast<std::size_t>(h)].name = "h" + std::to_string(h);
    int nics = static_cast<int>(rng.between(1, std::min(per, 4)));
    while (per % nics) --nics;  // NICs share a host's devices evenly
    const Topology t = Topology::from_hosts("t", placed, LinkClass{"intra", 1e9, 1e-6},
                                            LinkClass{"network", 1e9, 1e-5}, nics);
    std::vector<int> all(static_cast<std::size_t>(hosts * per));
    std::iota(all.begin(), all.end(), 0);
    const detail::LinkTimeline s(t, all, 4, 1 << 20);
    const int root = static_cast<int>(rng.below(hosts * per));
    std::vector<int> peers;
    for (int d : all)
      if (d != root && rng.chance(3, 4)) peers.push_back(d);
    // The definition.
    const auto key = [&](int d) {
      const bool away = s.host(d) != s.host(root);
      return std::make_tuple(away, s.host(d), away ? s.rail(s.slot(d), s.nic(root)) : 0, d);
    };
    std::vector<int> want = peers;
    std::sort(want.begin(), want.end(), [&](int a, int b) { return key(a) < key(b); });
    // The receivers as a caller may list them.
    std::vector<int> given = peers;
    switch (iter % 4) {
      case 0:
        rng.shuffle(given);
        break;
      case 1:  // host by host (in host order), then rotated
        std::stable_sort(given.begin(), given.end(),
                         [&](int a, int b) { return s.host(a) < s.host(b); });
        if (!given.empty())
          std::rotate(given.begin(),
                      given.begin() + rng.below(static_cast<std::int64_t>(given.size())),
                      given.end());
        break;
      default: {  // hosts permuted, each host's devices rotated
        std::vector<int> order(static_cast<std::size_t>(hosts));
        std::iota(order.begin(), order.end(), 0);
        rng.shuffle(order);
        given.clear();
        for (int h : order) {
          std::vector<int> mine;
          for (int d : peers)
            if (s.host(d) == h) mine.push_back(d);
          if (!mine.empty())
            std::rotate(mine.begin(),
                        mine.begin() + rng.below(static_cast<std::int64_t>(mine.size())),
                        mine.end());
          given.insert(given.end(), mine.begin(), mine.end());
        }
      }
    }
    detail::chain_order(given, root, s);
    ASSERT_EQ(given, want) << "iter " << iter << ": " << hosts << " hosts of " << per << ", "
                           << nics << " NICs, root " << root;
  }
}

TEST(MulticastTree, EveryReceiverIsFedByTheRootOrAnEarlierOne) {
  for (std::int64_t n = 1; n <= 40; ++n)
    for (std::int64_t g = 0; g <= n + 1; ++g) {
      std::vector<int> children(static_cast<std::size_t>(n + 1), 0);  // per member
      for (std::int64_t k = 0; k < n; ++k) {
        const std::int64_t p = multicast_parent(k, n, g);
        ASSERT_GE(p, -1);
        ASSERT_LT(p, k) << "n " << n << " g " << g << " k " << k;
        ++children[static_cast<std::size_t>(p + 1)];
      }
      // A member forwards to at most two: its chain's next, and a leader the next leader.
      EXPECT_LE(*std::max_element(children.begin(), children.end()), g < 2 || g >= n ? 1 : 2);
    }
  // 10 receivers in groups of 4, counted from the end: {0,1} {2..5} {6..9}.
  const std::vector<std::int64_t> want{-1, 0, 0, 2, 3, 4, 2, 6, 7, 8};
  for (std::int64_t k = 0; k < 10; ++k)
    EXPECT_EQ(multicast_parent(k, 10, 4), want[static_cast<std::size_t>(k)]) << k;
}

// A fork: the first `fork` receivers a chain from the root, the others the tree they would be
// alone, also from the root; the root then feeds two, and only it.
TEST(MulticastTree, AForkHangsBothBranchesFromTheRoot) {
  for (std::int64_t n = 2; n <= 30; ++n)
    for (std::int64_t f = 1; f < n; ++f)
      for (std::int64_t g = 0; g <= n - f + 1; ++g) {
        std::vector<int> children(static_cast<std::size_t>(n + 1), 0);
        for (std::int64_t k = 0; k < n; ++k) {
          const std::int64_t p = multicast_parent(k, n, g, f);
          ASSERT_LT(p, k);
          if (k < f) {
            ASSERT_EQ(p, k - 1) << "n " << n << " f " << f << " k " << k;
          } else {
            const std::int64_t alone = multicast_parent(k - f, n - f, g);
            ASSERT_EQ(p, alone < 0 ? -1 : alone + f) << "n " << n << " f " << f << " k " << k;
          }
          ++children[static_cast<std::size_t>(p + 1)];
        }
        EXPECT_EQ(children[0], 2) << "n " << n << " f " << f << " g " << g;
        EXPECT_EQ(multicast_chains(n, g, f), 1 + multicast_chains(n - f, g));
      }
  // 6 receivers forked after 2: 0 <- root, 1 <- 0; 2 <- root, 3 <- 2, ...
  const std::vector<std::int64_t> want{-1, 0, -1, 2, 3, 4};
  for (std::int64_t k = 0; k < 6; ++k)
    EXPECT_EQ(multicast_parent(k, 6, 0, 2), want[static_cast<std::size_t>(k)]) << k;
  EXPECT_EQ(multicast_parent(3, 6, 0, 0), 2);  // fork 0 (or >= n): no split
  EXPECT_EQ(multicast_parent(3, 6, 0, 6), 2);
}

struct Place {
  int host;
  std::size_t nic;
};

// The tree's time by brute force: every edge's links, each link's time per message summed over
// the edges that use it, a hop's stage its slowest link's, the deepest root-to-leaf path.
OpTime brute(const std::vector<Place>& m, std::int64_t g, std::int64_t bytes, std::int64_t chunk,
             const Topology& t, std::int64_t fork = 0) {
  const auto n = static_cast<std::int64_t>(m.size()) - 1;
  const std::int64_t msgs = std::max<std::int64_t>(1, (bytes + chunk - 1) / chunk);
  const double c = static_cast<double>(bytes) / static_cast<double>(msgs);
  const double copy = c / t.intra().bandwidth, wire = c / t.nic_bandwidth();
  // Edge k: member from(k) -> member k + 1; its links as (kind, member or host, NIC) keys.
  using Link = std::tuple<int, std::int64_t, std::size_t>;
  auto from = [&](std::int64_t k) { return multicast_parent(k, n, g, fork) + 1; };
  auto at = [&](std::int64_t i) { return m[static_cast<std::size_t>(i)]; };
  auto net = [&](std::int64_t k) { return at(from(k)).host != at(k + 1).host; };
  auto links = [&](std::int64_t k) {
    std::vector<Link> l{{0, from(k), 0}, {1, k + 1, 0}};  // the ports
    if (net(k)) {
      l.emplace_back(2, at(from(k)).host, at(from(k)).nic);
      l.emplace_back(3, at(k + 1).host, at(k + 1).nic);
    }
    return l;
  };
  std::map<Link, double> load;  // time per message, over every edge on the link
  for (std::int64_t k = 0; k < n; ++k) {
    const auto l = links(k);
    load[l[0]] += (net(k) ? t.network() : t.intra()).overhead + copy;
    load[l[1]] += copy;
    for (std::size_t j = 2; j < l.size(); ++j) load[l[j]] += wire;
  }
  std::vector<double> total(m.size(), 0), lat(m.size(), 0);
  double slowest = 0, deepest = 0, deepest_lat = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    double stage = 0;
    for (const Link& l : links(k)) stage = std::max(stage, load[l]);
    const double hop = (net(k) ? t.network() : t.intra()).hop_latency(n > 1);
    const auto to = static_cast<std::size_t>(k + 1), up = static_cast<std::size_t>(from(k));
    total[to] = total[up] + hop + stage;
    lat[to] = lat[up] + hop;
    slowest = std::max(slowest, stage);
    if (total[to] > deepest) {
      deepest = total[to];
      deepest_lat = lat[to];
    }
  }
  return {deepest_lat, deepest - deepest_lat + static_cast<double>(msgs - 1) * slowest};
}

Topology random_links(Rng& rng, int nics, int hosts = 2, int per_host = 1) {
  std::ostringstream os;
  auto link = [&](const char* bandwidth_key) {
    std::ostringstream l;
    l << "{\"" << bandwidth_key << "\": " << rng.between(1, 300)
      << ", \"latency_us\": " << rng.between(0, 20);
    if (rng.chance(1, 2)) l << ", \"chain_latency_us\": " << rng.between(0, 5);
    l << ", \"overhead_us\": " << (rng.chance(1, 3) ? 0 : rng.between(1, 4));
    return l.str();
  };
  os << "{\"name\": \"random\", \"links\": {\"intra\": " << link("bandwidth_gbyte_s")
     << "}, \"network\": " << link("bandwidth_gbit_s") << ", \"nics_per_host\": " << nics
     << "}}, \"uniform\": {\"hosts\": " << hosts << ", \"devices_per_host\": " << per_host << "}}";
  return Topology::from_json(os.str());
}

TEST(MulticastTree, ClosedFormEqualsTheTreesEdgesWalked) {
  Rng rng(0x7ee5);
  int trees = 0, forks = 0;
  for (int i = 0; i < testing::scaled(1500); ++i) {
    const int nics = static_cast<int>(rng.between(1, 3));
    const Topology t = random_links(rng, nics);
    // Chain order: the root's host's receivers first, then host by host.
    const auto nic = [&](int host) {
      return static_cast<std::size_t>(host * nics + rng.below(nics));
    };
    std::vector<Place> m{{0, nic(0)}};
    // Mostly a few receivers on the root's host; sometimes many (a fork's deep first branch).
    for (auto k = rng.between(0, rng.chance(1, 4) ? 20 : 3); k > 0; --k) m.push_back({0, nic(0)});
    const auto hosts = rng.between(rng.chance(1, 4) ? 0 : 1, 7);
    for (int h = 1; h <= hosts; ++h)
      for (auto k = rng.between(1, 5); k > 0; --k) m.push_back({h, nic(h)});
    if (m.size() < 2) m.push_back({0, 0});
    const std::int64_t bytes = rng.chance(1, 3) ? rng.between(1, 100) : rng.between(1, 1 << 24);
    const std::int64_t chunk = rng.chance(1, 2) ? kDefaultChunkBytes : rng.between(1, 1 << 16);
    MulticastTree tree;
    tree.reset(t, bytes, chunk);
    for (const Place& p : m) tree.add(p.host, p.nic);
    const auto n = static_cast<std::int64_t>(m.size()) - 1;
    for (std::int64_t g = 0; g < n; ++g) {
      if (g == 1 || !tree.whole(g)) continue;
      trees += g > 0;
      // (Two paths may tie with different latencies: the totals are compared.)
      const OpTime got = tree.time(g), want = brute(m, g, bytes, chunk, t);
      ASSERT_NEAR(got.total(), want.total(), 1e-9 * want.total() + 1e-18)
          << "case " << i << " g " << g;
      ASSERT_LE(got.latency, got.total()) << "case " << i << " g " << g;
    }
    // The choice: one whole() admits, never slower than one chain.
    const std::int32_t best = tree.best();
    ASSERT_TRUE(best == 0 || tree.whole(best)) << "case " << i;
    ASSERT_LE(tree.time(best).total(), tree.time(0).total()) << "case " << i;
    // Forked after the root's host's receivers (chain_fork), with every tree of the others.
    const auto fork = static_cast<std::int64_t>(
        std::find_if(m.begin() + 1, m.end(), [](const Place& p) { return p.host != 0; }) -
        m.begin() - 1);
    if (!multicast_forks(n, fork)) continue;
    // The choice, of the whole forked op: no slower than the forked chain or any other tree.
    const std::int32_t forked = tree.best(fork);
    ASSERT_TRUE(forked == 0 || tree.whole(forked, fork)) << "case " << i;
    const double chosen = tree.time(forked, fork).total();
    for (std::int64_t g = 0; g < n - fork; ++g) {
      if (g == 1 || !tree.whole(g, fork)) continue;
      forks += 1;
      const OpTime got = tree.time(g, fork), want = brute(m, g, bytes, chunk, t, fork);
      ASSERT_NEAR(got.total(), want.total(), 1e-9 * want.total() + 1e-18)
          << "case " << i << " g " << g << " fork " << fork;
      ASSERT_LE(chosen, got.total() * (1 + 1e-9)) << "case " << i << " g " << g << " fork " << fork;
    }
  }
  EXPECT_GT(trees, 500);
  EXPECT_GT(forks, 300);
}

// TreeShapes keeps answers by shape (bytes, which members share a host, which a NIC): on random
// multicasts in chain order, many of one shape on different devices, its group and times equal
// a fresh MulticastTree's, whatever was asked before.
TEST(MulticastTree, ShapesKeptAnswerAsAFreshTree) {
  Rng rng(0x5ba9);
  for (int i = 0; i < testing::scaled(40); ++i) {
    const int nics = static_cast<int>(rng.between(1, 4)), hosts = 12, per_host = 4;
    const Topology t = random_links(rng, nics, hosts, per_host);
    std::vector<int> all(hosts * per_host);
    for (std::size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int>(d);
    const std::int64_t chunk = rng.chance(1, 2) ? kDefaultChunkBytes : rng.between(1, 1 << 16);
    const detail::LinkTimeline s(t, all, 4, chunk);
    detail::TreeShapes shapes(s);
    for (int k = 0; k < 200; ++k) {
      // A few shapes: the same host pattern moved to other hosts (by `shift`) repeats one.
      const int shift = static_cast<int>(rng.below(hosts)), kind = static_cast<int>(rng.below(3));
      Op op{OpKind::Multicast,
            0,
            Box({{0, 1}}),
            (shift * per_host) % static_cast<int>(all.size()),
            {},
            false,
            0};
      // Each host's members from a random one on (as rotate_chain): the same hosts, other NICs.
      for (int h = 1; h <= 3 + kind; ++h) {
        const int first = static_cast<int>(rng.below(per_host)), n = per_host - (h + kind) % 2;
        for (int m = 0; m < n; ++m)
          op.peers.push_back(((shift + h) % hosts) * per_host + (first + m) % per_host);
      }
      if (rng.chance(1, 4)) rng.shuffle(op.peers);  // not one run per host: still exact
      op.fork = rng.chance(1, 3) ? static_cast<std::int32_t>(rng.below(op.peers.size())) : 0;
      const std::int64_t bytes = rng.chance(3, 4) ? 1 << 20 : rng.between(1, 1 << 22);
      MulticastTree fresh;
      fresh.reset(t, bytes, chunk);
      fresh.add(s.host(op.root), s.nic(op.root));
      for (int p : op.peers) fresh.add(s.host(p), s.nic(p));
      const std::int32_t best = op.peers.size() < 4 ? 0 : fresh.best(op.fork);
      const std::string ctx = "case " + std::to_string(i) + " op " + std::to_string(k);
      ASSERT_EQ(shapes.best(op, bytes), best) << ctx;
      for (std::int32_t g : {best, std::int32_t{0}}) {
        op.group = g;
        const OpTime got = shapes.time(op, bytes), want = fresh.time(g, op.fork);
        ASSERT_EQ(got.latency, want.latency) << ctx << " group " << g;
        ASSERT_EQ(got.occupancy, want.occupancy) << ctx << " group " << g;
      }
    }
  }
}

TEST(MulticastTree, OneChainIsChainTime) {
  const Topology t = Topology::uniform("h", 5, 3, LinkClass{"intra", 40e9, 2e-6, {}, 1e-6},
                                       LinkClass{"network", 5e9, 9e-6, 4e-6, 2e-6});
  MulticastTree tree;
  tree.reset(t, 5 << 20, 1 << 16);
  tree.add(0, 0);
  for (int d = 1; d < 15; ++d) tree.add(d / 3, static_cast<std::size_t>(d / 3));
  // 14 receivers: 2 more on the root's host, 4 hosts entered.
  EXPECT_NEAR(tree.time(0).total(), chain_seconds(5 << 20, 4, 10, t, 1 << 16), 1e-15);
}

// One box of 1 GiB to the 8,184 other devices of 1,024 hosts: a tree costs about one transfer to
// one host (a chain pays 8,184 hops of latency and fill); planned and simulated in well under a
// second.
TEST(MulticastTree, AThousandHostsCostAboutOne) {
  const Topology t =
      Topology::load(std::string(MESHCAST_SOURCE_DIR) + "/meshes/cluster-1024x8.json");
  PlanOptions opt;
  opt.strategy = Strategy::Broadcast;
  const auto src = Layout::parse({268435456}, DType::f32, "1@0:R");
  const auto start = std::chrono::steady_clock::now();
  const Plan all = plan(src, Layout::parse({268435456}, DType::f32, "8184@8-8191:R"), t, opt);
  const double simulated = simulate(all, t).seconds;
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Plan one = plan(src, Layout::parse({268435456}, DType::f32, "8@8-15:R"), t, opt);
  ASSERT_EQ(all.ops().size(), 1u);
  EXPECT_GE(multicast_chains(8184, all.ops()[0].group), 3);
  EXPECT_LT(all.stats().predicted_seconds, 1.2 * one.stats().predicted_seconds);
  EXPECT_NEAR(simulated, all.stats().predicted_seconds, 1e-9);
  EXPECT_LT(took, 5.0);  // ~0.1 s in a Release build; sanitizers are slower
  Op chain = all.ops()[0];
  chain.group = 0;
  const Plan as_chain(all.src(), all.dst(), all.strategy(), all.balance(), t.name(), {chain},
                      all.stats());
  EXPECT_GT(predict(as_chain, t).seconds, 1.8 * all.stats().predicted_seconds);
}

// A 4-byte tensor replicated on 65,536 -> 65,536 devices of one host by broadcast: not a chain of
// 65,536 hops but a tree of a few hundred chains.
TEST(MulticastTree, ATinyBoxToManyDevicesIsATree) {
  PlanOptions opt;
  opt.strategy = Strategy::Broadcast;
  const auto start = std::chrono::steady_clock::now();
  const Plan p =
      plan(Layout::parse({1}, DType::f32, "65536@0-65535:R"),
           Layout::parse({1}, DType::f32, "65536@65536-131071:R"), Topology::single_host(), opt);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(p.ops().size(), 1u);
  const std::int64_t chains = multicast_chains(65536, p.ops()[0].group);
  EXPECT_GT(chains, 64);
  EXPECT_LT(chains, 1024);
  EXPECT_LT(p.stats().predicted_seconds, 0.01);  // a chain: ~0.2 s
  EXPECT_LT(took, 5.0);                          // ~0.3 s in a Release build
}

}  // namespace
}  // namespace meshcast
