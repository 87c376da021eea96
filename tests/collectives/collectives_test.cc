// Collectives on the in-process backend: every collective, dtype, reduction and algorithm at
// 1-8 devices against the naive reference of support/collectives_check.h; sub-groups in any
// order; hosts (hierarchical); several collectives in flight at once, progressed by test();
// random floats within summation-order tolerance; bad arguments.
#include "meshcast/collectives.h"

#include <gtest/gtest.h>

#include <mutex>
#include <numeric>
#include <random>

#include "meshcast/error.h"
#include "meshcast/local.h"
#include "support/collectives_check.h"

namespace meshcast {
namespace {

// Runs the check on every device of `group` in a world of `world` devices.
std::vector<std::string> run_check(int world, const std::vector<int>& group,
                                   const std::vector<std::int64_t>& counts,
                                   const Topology* topology = nullptr) {
  std::mutex m;
  std::vector<std::string> errors;
  const auto cases = testing::collective_cases(counts);
  LocalWorld w(world);
  w.run(
      [&](Communicator& comm) {
        auto e = testing::check_collectives(comm, group, cases, topology);
        std::lock_guard<std::mutex> lock(m);
        errors.insert(errors.end(), e.begin(), e.end());
      },
      group);
  return errors;
}

std::string first(const std::vector<std::string>& e) { return e.empty() ? "" : e.front(); }

TEST(Collectives, EveryCollectiveAt1To8Devices) {
  // Sizes 0, 1, primes, and past the small-message threshold (64 KiB) for the ring.
  const std::vector<std::int64_t> counts{0, 1, 2, 3, 7, 13, 101, 1009, 40013};
  for (int n = 1; n <= 8; ++n) {
    std::vector<int> group(static_cast<std::size_t>(n));
    std::iota(group.begin(), group.end(), 0);
    const auto errors = run_check(n, group, counts);
    EXPECT_TRUE(errors.empty()) << n << " devices: " << errors.size()
                                << " errors, first: " << first(errors);
  }
}

TEST(Collectives, SubGroupsInAnyOrder) {
  const auto errors = run_check(8, {5, 2, 7}, {0, 5, 333, 20011});
  EXPECT_TRUE(errors.empty()) << first(errors);
  const auto more = run_check(8, {6, 1, 4, 3, 0}, {17, 20011});
  EXPECT_TRUE(more.empty()) << first(more);
}

TEST(Collectives, HierarchicalOverHosts) {
  // 2 hosts x 4 and 3 hosts x 2: auto picks hierarchical above 64 KiB, and the cases that ask
  // for it get it; a group in an order that interleaves the hosts.
  const Topology two = Topology::uniform("2x4", 2, 4, {"intra", 1e10, 0}, {"net", 1e9, 0});
  auto errors = run_check(8, {0, 4, 1, 5, 2, 6, 3, 7}, {1, 999, 40013}, &two);
  EXPECT_TRUE(errors.empty()) << first(errors);
  const Topology three = Topology::uniform("3x2", 3, 2, {"intra", 1e10, 0}, {"net", 1e9, 0});
  errors = run_check(6, {0, 1, 2, 3, 4, 5}, {5, 40013}, &three);
  EXPECT_TRUE(errors.empty()) << first(errors);
}

TEST(Collectives, SeveralInFlightProgressedByTest) {
  // Three all-reduces started back to back (default tags: a sequence), then polled with test()
  // between slices of "compute" until all are done.
  constexpr std::int64_t kCount = 50000;
  std::mutex m;
  std::vector<std::string> errors;
  LocalWorld w(4);
  w.run([&](Communicator& comm) {
    const std::vector<int> group{0, 1, 2, 3};
    std::vector<std::vector<float>> bufs(3, std::vector<float>(kCount));
    std::vector<Collective> cs;
    for (std::size_t k = 0; k < 3; ++k) {
      for (std::int64_t i = 0; i < kCount; ++i)
        bufs[k][static_cast<std::size_t>(i)] = static_cast<float>(comm.rank() + k + i % 7);
      cs.push_back(iall_reduce(comm, group, bufs[k].data(), bufs[k].data(), kCount, DType::f32,
                               ReduceOp::Sum));
    }
    volatile double sink = 0;
    for (int spins = 0; spins < 1000000; ++spins) {
      bool all = true;
      for (Collective& c : cs) all = c.test() && all;
      if (all) break;
      for (int i = 0; i < 1000; ++i) sink = sink + i;  // compute between polls
    }
    for (Collective& c : cs) {
      c.wait();
      // Each member sent its ring pieces: 2 (n - 1) / n of the vector.
      if (!c.done() || c.bytes_sent() != 2 * 3 * kCount * 4 / 4) {
        std::lock_guard<std::mutex> lock(m);
        errors.push_back("done " + std::to_string(c.done()) + ", bytes_sent " +
                         std::to_string(c.bytes_sent()));
        return;
      }
    }
    for (std::size_t k = 0; k < 3; ++k)
      for (std::int64_t i = 0; i < kCount; ++i) {
        const float want = static_cast<float>(6 + 4 * (k + i % 7));
        if (bufs[k][static_cast<std::size_t>(i)] != want) {
          std::lock_guard<std::mutex> lock(m);
          errors.push_back("collective " + std::to_string(k) + " element " + std::to_string(i));
          return;
        }
      }
  });
  EXPECT_TRUE(errors.empty()) << first(errors);
}

TEST(Collectives, RandomFloatsWithinSummationOrderTolerance) {
  constexpr std::int64_t kCount = 30011;
  for (Algorithm a : {Algorithm::Ring, Algorithm::RecursiveDoubling}) {
    std::mutex m;
    double worst = 0;
    LocalWorld w(5);
    w.run([&](Communicator& comm) {
      const std::vector<int> group{0, 1, 2, 3, 4};
      auto value = [](int r, std::int64_t i) {
        std::mt19937_64 g(static_cast<std::uint64_t>(r) * 1000003 + static_cast<std::uint64_t>(i));
        return std::uniform_real_distribution<double>(-1, 1)(g);
      };
      std::vector<float> x(kCount);
      for (std::int64_t i = 0; i < kCount; ++i)
        x[static_cast<std::size_t>(i)] = static_cast<float>(value(comm.rank(), i));
      CollectiveOptions o;
      o.algorithm = a;
      all_reduce(comm, group, x.data(), x.data(), kCount, DType::f32, ReduceOp::Sum, o);
      double err = 0;
      for (std::int64_t i = 0; i < kCount; ++i) {
        double want = 0;
        for (int r = 0; r < 5; ++r) want += static_cast<float>(value(r, i));
        err = std::max(err, std::abs(x[static_cast<std::size_t>(i)] - want));
      }
      std::lock_guard<std::mutex> lock(m);
      worst = std::max(worst, err);
    });
    EXPECT_LT(worst, 5e-6) << to_string(a);
  }
}

TEST(Collectives, BadArgumentsNameTheField) {
  LocalWorld w(2);
  std::mutex m;
  std::vector<std::string> fields;
  w.run([&](Communicator& comm) {
    float x[4] = {};
    const std::int64_t counts[2] = {1, 1}, three[3] = {1, 1, 1}, other[2] = {2, 2};
    auto field = [&](auto&& f) {
      try {
        f();
        return std::string("none");
      } catch (const ValidationError& e) {
        return e.field();
      }
    };
    const std::vector<int> both{0, 1}, dup{0, 0}, missing{1 - comm.rank()};
    std::vector<std::string> got{
        field([&] { all_reduce(comm, missing, x, x, 4, DType::f32, ReduceOp::Sum); }),
        field([&] { all_reduce(comm, dup, x, x, 4, DType::f32, ReduceOp::Sum); }),
        field([&] { all_reduce(comm, both, x, x, -1, DType::f32, ReduceOp::Sum); }),
        field([&] { broadcast(comm, both, 7, x, 4, DType::f32); }),
        field([&] { all_to_allv(comm, both, x, three, x, counts, DType::f32); }),
        field([&] { all_to_allv(comm, both, x, counts, x, other, DType::f32); }),
    };
    std::lock_guard<std::mutex> lock(m);
    if (fields.empty()) fields = got;
  });
  const std::vector<std::string> want{"group", "group",       "count",
                                      "root",  "send_counts", "recv_counts"};
  EXPECT_EQ(fields, want);
  EXPECT_EQ(parse_algorithm("ring"), Algorithm::Ring);
  EXPECT_THROW(parse_algorithm("tree"), ParseError);
  EXPECT_EQ(parse_reduce_op("max"), ReduceOp::Max);
  EXPECT_THROW(parse_reduce_op("min"), ParseError);
}

}  // namespace
}  // namespace meshcast
