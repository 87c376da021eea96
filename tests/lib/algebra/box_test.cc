// Laws of shard_range (the uneven split of DESIGN.md) and of Range/Box intersection.
#include "meshcast/box.h"

#include <gtest/gtest.h>

#include <limits>

#include "meshcast/error.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::i128;
using testing::Rng;

// Shards of n split p ways cover [0, n) exactly once, in order, sizes differ by at most one, and
// each is [floor(k*n/p), floor((k+1)*n/p)).
void expect_shard_law(std::int64_t n, std::int64_t p) {
  std::int64_t expect_lo = 0, min_size = std::numeric_limits<std::int64_t>::max(), max_size = 0;
  std::int64_t empty = 0;
  for (std::int64_t k = 0; k < p; ++k) {
    const Range r = shard_range(n, p, k);
    ASSERT_EQ(r.lo, expect_lo) << "n=" << n << " p=" << p << " k=" << k;
    ASSERT_GE(r.hi, r.lo) << "n=" << n << " p=" << p << " k=" << k;
    ASSERT_EQ(r.lo, static_cast<std::int64_t>(i128{k} * n / p)) << "n=" << n << " p=" << p;
    ASSERT_EQ(r.hi, static_cast<std::int64_t>(i128{k + 1} * n / p)) << "n=" << n << " p=" << p;
    min_size = std::min(min_size, r.size());
    max_size = std::max(max_size, r.size());
    empty += r.empty();
    expect_lo = r.hi;
  }
  EXPECT_EQ(expect_lo, n) << "n=" << n << " p=" << p;
  EXPECT_LE(max_size - min_size, 1) << "n=" << n << " p=" << p;
  EXPECT_EQ(empty, p > n ? p - n : 0) << "n=" << n << " p=" << p;
}

TEST(ShardRange, WorkedExample) {
  EXPECT_EQ(shard_range(10, 4, 0), (Range{0, 2}));
  EXPECT_EQ(shard_range(10, 4, 1), (Range{2, 5}));
  EXPECT_EQ(shard_range(10, 4, 2), (Range{5, 7}));
  EXPECT_EQ(shard_range(10, 4, 3), (Range{7, 10}));
  EXPECT_EQ(shard_range(0, 3, 2), (Range{0, 0}));
  EXPECT_EQ(shard_range(2, 4, 0), (Range{0, 0}));
  EXPECT_EQ(shard_range(2, 4, 1), (Range{0, 1}));
}

TEST(ShardRange, CoversExactlyOnceSmall) {
  for (std::int64_t n = 0; n <= 70; ++n)
    for (std::int64_t p = 1; p <= 40; ++p) expect_shard_law(n, p);
}

TEST(ShardRange, EmptyShardsWhenMoreShardsThanElements) {
  for (std::int64_t n = 0; n < 8; ++n)
    for (std::int64_t p = n + 1; p <= 16; ++p) {
      std::int64_t nonempty = 0;
      for (std::int64_t k = 0; k < p; ++k) nonempty += !shard_range(n, p, k).empty();
      EXPECT_EQ(nonempty, n) << "n=" << n << " p=" << p;
    }
}

TEST(ShardRange, LargeExtentsDoNotOverflow) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  Rng rng(0xb0c5);
  const std::int64_t ns[] = {kMax,
                             kMax - 1,
                             std::int64_t{1} << 62,
                             (std::int64_t{1} << 62) + 12345,
                             (std::int64_t{1} << 40) + 7,
                             1000000007};
  const std::int64_t ps[] = {
      1,   2, 3, 7, 64, 1000, 65521, std::int64_t{1} << 20, (1 << 30) - 1, std::int64_t{1} << 40,
      kMax};  // k*r past 2^63 too
  for (auto n : ns)
    for (auto p : ps) {
      std::vector<std::int64_t> ks = {0, 1, p / 2, p - 2, p - 1};
      for (int i = 0; i < 20; ++i) ks.push_back(rng.below(p));
      for (auto k : ks) {
        if (k < 0 || k >= p) continue;
        const Range r = shard_range(n, p, k);
        EXPECT_EQ(r.lo, static_cast<std::int64_t>(i128{k} * n / p)) << n << '/' << p << " k=" << k;
        EXPECT_EQ(r.hi, static_cast<std::int64_t>(i128{k + 1} * n / p))
            << n << '/' << p << " k=" << k;
      }
      EXPECT_EQ(shard_range(n, p, p - 1).hi, n) << n << '/' << p;
    }
  expect_shard_law(kMax, 7);
  expect_shard_law(kMax - 3, 33);
}

TEST(ShardRange, ArgumentsOutsideTheirRangeAreRefused) {
  EXPECT_THROW(shard_range(10, 0, 0), ValidationError);  // was a division by zero
  EXPECT_THROW(shard_range(10, -2, 0), ValidationError);
  EXPECT_THROW(shard_range(-1, 2, 0), ValidationError);
  EXPECT_THROW(shard_range(10, 4, 4), ValidationError);
  EXPECT_THROW(shard_range(10, 4, -1), ValidationError);
  try {
    shard_range(10, 0, 0);
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "shard");
  }
}

TEST(ShardRange, RandomCover) {
  Rng rng(0x5a4d);
  for (int i = 0; i < testing::scaled(2000); ++i) {
    const std::int64_t n =
        rng.chance(1, 2) ? rng.below(1000) : static_cast<std::int64_t>(rng.next() >> 2);
    expect_shard_law(n, rng.between(1, 64));
  }
}

TEST(RangeIntersect, Laws) {
  Rng rng(0x1a7e);
  for (int i = 0; i < testing::scaled(5000); ++i) {
    const Range a{rng.between(-20, 20), rng.between(-20, 20)};
    const Range b{rng.between(-20, 20), rng.between(-20, 20)};
    const Range ab = intersect(a, b), ba = intersect(b, a);
    const std::string ctx = "a=[" + std::to_string(a.lo) + "," + std::to_string(a.hi) + ") b=[" +
                            std::to_string(b.lo) + "," + std::to_string(b.hi) + ")";
    EXPECT_EQ(ab.size(), ba.size()) << ctx;
    if (!ab.empty()) {
      EXPECT_EQ(ab, ba) << ctx;
    }
    // Contained in both, and exactly the common points.
    std::int64_t common = 0;
    for (std::int64_t x = -20; x <= 20; ++x) {
      const bool in_a = x >= a.lo && x < a.hi, in_b = x >= b.lo && x < b.hi;
      const bool in_ab = x >= ab.lo && x < ab.hi;
      EXPECT_EQ(in_ab, in_a && in_b) << ctx << " x=" << x;
      common += in_a && in_b;
    }
    EXPECT_EQ(ab.size(), common) << ctx;
    if (ab.empty()) {
      EXPECT_EQ(ab.lo, ab.hi) << ctx << ": empty intersections come back as [x, x)";
    }
  }
  EXPECT_EQ(intersect(Range{0, 4}, Range{2, 8}), (Range{2, 4}));
  EXPECT_TRUE(intersect(Range{0, 4}, Range{4, 8}).empty());
}

Box random_box(Rng& rng, std::size_t ndim) {
  std::vector<Range> r;
  for (std::size_t d = 0; d < ndim; ++d) {
    const auto lo = rng.between(-3, 5);
    r.push_back({lo, lo + rng.between(-1, 5)});
  }
  return Box(std::move(r));
}

TEST(BoxIntersect, Laws) {
  Rng rng(0xb0c);
  for (int i = 0; i < testing::scaled(3000); ++i) {
    const std::size_t ndim = static_cast<std::size_t>(rng.between(1, 4));
    const Box a = random_box(rng, ndim), b = random_box(rng, ndim);
    const Box ab = intersect(a, b), ba = intersect(b, a);
    const std::string ctx = "a=" + a.str() + " b=" + b.str();
    EXPECT_EQ(ab.volume(), ba.volume()) << ctx;
    if (!ab.empty()) {
      EXPECT_EQ(ab, ba) << ctx;
      EXPECT_TRUE(a.contains(ab)) << ctx;
      EXPECT_TRUE(b.contains(ab)) << ctx;
    }
    // Volume: the number of points in both, counted one by one over a bounding grid.
    std::int64_t common = 0;
    std::vector<std::int64_t> x(ndim, -3);
    while (true) {
      bool in_a = true, in_b = true, in_ab = true;
      for (std::size_t d = 0; d < ndim; ++d) {
        in_a = in_a && x[d] >= a[d].lo && x[d] < a[d].hi;
        in_b = in_b && x[d] >= b[d].lo && x[d] < b[d].hi;
        in_ab = in_ab && x[d] >= ab[d].lo && x[d] < ab[d].hi;
      }
      EXPECT_EQ(in_ab, in_a && in_b) << ctx;
      common += in_a && in_b;
      std::size_t d = ndim;
      while (d-- > 0) {
        if (++x[d] < 11) break;
        x[d] = -3;
      }
      if (d == static_cast<std::size_t>(-1)) break;
    }
    EXPECT_EQ(ab.volume(), common) << ctx;
    EXPECT_EQ(ab.empty(), common == 0) << ctx;
  }
}

TEST(Box, Accessors) {
  const Box b({{0, 4}, {2, 8}});
  EXPECT_EQ(b.str(), "[0:4,2:8]");
  EXPECT_EQ(b.ndim(), 2u);
  EXPECT_EQ(b.volume(), 24);
  EXPECT_EQ(b.extents(), (std::vector<std::int64_t>{4, 6}));
  EXPECT_EQ(b.origin(), (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(Box::whole({3, 0, 2}), Box({{0, 3}, {0, 0}, {0, 2}}));
  EXPECT_TRUE(Box::whole({3, 0, 2}).empty());
  EXPECT_TRUE(Box::whole({4, 8}).contains(b));
  EXPECT_FALSE(b.contains(Box::whole({4, 8})));
  EXPECT_TRUE(b.contains(Box({{1, 1}, {50, 60}}))) << "an empty box lies in every box";
  EXPECT_FALSE(b.contains(Box({{0, 4}}))) << "ndim differs";
  // A volume past 2^63 - 1 is refused, not wrapped (2^40 x 2^40 wrapped to 0: an empty box).
  const Box huge({{0, std::int64_t{1} << 40}, {0, std::int64_t{1} << 40}});
  EXPECT_THROW((void)huge.volume(), ValidationError);
  EXPECT_EQ(Box({{0, std::int64_t{1} << 40}, {0, 0}}).volume(), 0);
  std::ostringstream os;
  os << b;
  EXPECT_EQ(os.str(), "[0:4,2:8]");
}

}  // namespace
}  // namespace meshcast
