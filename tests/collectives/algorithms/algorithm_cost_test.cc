// What the collective algorithms cost by the one cost model (collectives/algorithms/program.h),
// against hand-computed round sums, and the choices `auto` makes from them: on one host (the
// emulated 2-core machine without a topology) recursive doubling for small vectors and the ring
// for large ones, as the hand-set 64 KiB threshold did; on the emulated cluster (5 hosts x 4)
// recursive doubling for small vectors and hierarchical for large ones (the thresholds took a
// host-order ring from 512 KiB, measured 1.16x faster at 1 MiB: the calibrated 12 ms per network
// message, a large message's handshake behind the tbf queue, makes the ring's 38 rounds dear).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "collectives/algorithms/program.h"
#include "meshcast/cost.h"
#include "support/testing.h"

namespace meshcast::detail {
namespace {

std::vector<int> iota(int n, int from = 0) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

// One round of one message per member inside a host: latency, overhead, bytes over the port.
double intra_round(const Topology& t, double bytes) {
  return t.intra().latency + t.intra().overhead + bytes / t.intra().bandwidth;
}

TEST(AlgorithmCost, OnOneHostTheRoundsAreHandCounted) {
  const Topology t = Topology::single_host();
  testing::Rng rng(0xa1c0);
  for (int iter = 0; iter < 200; ++iter) {
    const int n = static_cast<int>(rng.between(2, 40));
    const auto members = iota(n, static_cast<int>(rng.below(100)));
    const double b = static_cast<double>(rng.between(0, 1 << 26));
    const CostOf c{members, t, b};
    const double piece = b / n;
    EXPECT_NEAR(ring_all_reduce_cost(c), 2.0 * (n - 1) * intra_round(t, piece), 1e-12);
    EXPECT_NEAR(ring_all_gather_cost(c), (n - 1) * intra_round(t, piece), 1e-12);
    int log = 0, p2 = 1;
    while (p2 * 2 <= n) {
      p2 *= 2;
      ++log;
    }
    EXPECT_NEAR(recursive_doubling_all_reduce_cost(c), (log + (n > p2 ? 2 : 0)) * intra_round(t, b),
                1e-12);
    double bruck = 0;
    for (int k = 1; k < n; k *= 2) bruck += intra_round(t, b * std::min(k, n - k) / n);
    EXPECT_NEAR(bruck_all_gather_cost(c), bruck, 1e-12);
  }
}

TEST(AlgorithmCost, RoundsAcrossHostsShareTheNics) {
  // 3 hosts of 4, one NIC each: a ring in host order crosses each host's NIC once per round;
  // recursive doubling's rounds with partners 4 and 8 apart send all 4 devices of a host
  // through its NIC at once (and the 12 - 8 = 4 folded members once each way).
  const Topology t = Topology::uniform("u", 3, 4, LinkClass{"intra", 1e10, 1e-6, {}, 1e-6},
                                       LinkClass{"network", 1e9, 1e-4, {}, 5e-6});
  const auto members = iota(12);
  const double b = 12e6;
  const CostOf c{members, t, b};
  const auto net = [&](double bytes, double per_nic) {
    return t.network().latency +
           std::max(t.network().overhead + bytes / 1e10, per_nic * bytes / 1e9);
  };
  EXPECT_NEAR(ring_all_reduce_cost(c), 22 * net(1e6, 1), 1e-12);
  // Rounds with masks 1, 2 stay inside hosts; 4 crosses (devices 0-3 <-> 4-7: 4 per NIC). The
  // fold (8-11 -> 0-3) crosses with 4 per NIC, twice.
  EXPECT_NEAR(recursive_doubling_all_reduce_cost(c),
              2 * intra_round(t, b) + net(b, 4) + 2 * net(b, 4), 1e-12);
  std::vector<std::vector<std::size_t>> hosts{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}};
  // Rings inside hosts (3 + 3 rounds of b / 4); the 4 rails' rings across hosts (2 x 2 rounds of
  // b / 12, 4 per NIC).
  EXPECT_NEAR(hierarchical_all_reduce_cost(c, hosts),
              6 * intra_round(t, b / 4) + 4 * net(b / 12, 4), 1e-12);
}

TEST(AlgorithmCost, AutoPicksWhatTheThresholdsPickedAtSmallAndLargeSizes) {
  // One host (no topology: Topology::single_host()): recursive doubling at 4-16 KiB, the ring
  // from 1 MiB, for every group size the thresholds covered (n >= 3).
  const Topology one = Topology::single_host();
  for (int n = 3; n <= 32; ++n) {
    const auto members = iota(n);
    for (double small : {4096.0, 16384.0}) {
      const CostOf c{members, one, small};
      EXPECT_LT(recursive_doubling_all_reduce_cost(c), ring_all_reduce_cost(c)) << n;
    }
    for (double large : {1048576.0, 67108864.0}) {
      const CostOf c{members, one, large};
      EXPECT_GT(recursive_doubling_all_reduce_cost(c), ring_all_reduce_cost(c)) << n;
    }
  }
  // The emulated cluster: small vectors by recursive doubling, 4 MiB hierarchical.
  const Topology emu = Topology::load(MESHCAST_SOURCE_DIR "/meshes/emulated.json");
  const auto members = iota(20);
  std::vector<std::vector<std::size_t>> hosts(5);
  for (std::size_t i = 0; i < 20; ++i) hosts[i / 4].push_back(i);
  const CostOf small{members, emu, 4096}, large{members, emu, 4194304};
  EXPECT_LT(recursive_doubling_all_reduce_cost(small), hierarchical_all_reduce_cost(small, hosts));
  EXPECT_LT(recursive_doubling_all_reduce_cost(small), ring_all_reduce_cost(small));
  EXPECT_LT(hierarchical_all_reduce_cost(large, hosts), recursive_doubling_all_reduce_cost(large));
  EXPECT_LT(hierarchical_all_reduce_cost(large, hosts), ring_all_reduce_cost(large));
}

TEST(AlgorithmCost, CostsGrowWithBytes) {
  testing::Rng rng(0xb17e);
  const Topology emu = Topology::load(MESHCAST_SOURCE_DIR "/meshes/emulated.json");
  for (int iter = 0; iter < 100; ++iter) {
    auto members = iota(20);
    rng.shuffle(members);
    members.resize(static_cast<std::size_t>(rng.between(2, 20)));
    const double b = static_cast<double>(rng.between(0, 1 << 24));
    const CostOf c{members, emu, b}, more{members, emu, 2 * b + 1};
    EXPECT_LE(ring_all_reduce_cost(c), ring_all_reduce_cost(more));
    EXPECT_LE(recursive_doubling_all_reduce_cost(c), recursive_doubling_all_reduce_cost(more));
    EXPECT_LE(bruck_all_gather_cost(c), bruck_all_gather_cost(more));
  }
}

}  // namespace
}  // namespace meshcast::detail
