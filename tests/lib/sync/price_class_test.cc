// Auto's choice shared by alike moves (lib/sync/price_class.h): the class's laws, and what
// sharing costs. A move that takes another's choice is priced (strategy_price) under it and
// under its own best: over random meshes, specs, extents and topologies the shared choice is
// within 10% of the best, and mostly equal to it.
#include "lib/sync/price_class.h"

#include <gtest/gtest.h>

#include <bit>
#include <map>

#include "lib/plan/planner.h"
#include "lib/plan/task_ops.h"
#include "meshcast/sync.h"
#include "support/strategy_price.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;

Layout with_shape(const Layout& l, const Shape& shape) {
  return Layout(shape, l.dtype(), l.mesh(), l.spec());
}

bool alike(const Layout& src, const Layout& dst, const Shape& a, const Shape& b) {
  return detail::alike(with_shape(src, a), with_shape(dst, a), with_shape(src, b),
                       with_shape(dst, b));
}

TEST(PriceClass, EqualMovesAreAlikeAndExtentsApartAreNot) {
  const Layout src = Layout::parse({4096, 512}, DType::f32, "4x2@0-7:S0S1");
  const Layout dst = Layout::parse({4096, 512}, DType::f32, "8@8-15:RS0");
  EXPECT_TRUE(alike(src, dst, {4096, 512}, {4096, 512}));
  // Within a bucket (4096 + [0, 128) at 32 per octave), dividing alike: alike.
  EXPECT_TRUE(alike(src, dst, {4096, 512}, {4096 + 120, 512 + 8}));
  // The next bucket.
  EXPECT_FALSE(alike(src, dst, {4096, 512}, {4096 + 128, 512}));
  // One split (4 at the source) divides one extent and not the other.
  EXPECT_FALSE(alike(src, dst, {4096, 512}, {4097, 512}));
  // Below 32, every extent is its own bucket; below a split, tiles are empty.
  EXPECT_FALSE(alike(src, dst, {30, 512}, {31, 512}));
  EXPECT_FALSE(alike(src, dst, {4096, 8}, {4096, 7}));
  // Another mesh, spec or dtype: never alike.
  const Shape s{4096, 512};
  EXPECT_FALSE(detail::alike(src, dst, src, Layout::parse(s, DType::f32, "8@0-7:RS0")));
  EXPECT_FALSE(detail::alike(src, dst, src, Layout::parse(s, DType::f32, "8@8-15:S0R")));
  EXPECT_FALSE(detail::alike(src, dst, src, Layout::parse(s, DType::bf16, "8@8-15:RS0")));
}

// The extents of `shape` moved at random within their class (their bucket, divisibility and
// being below either side's splits kept): retried until alike, else `shape` itself.
Shape alike_shape(Rng& rng, const Layout& src, const Layout& dst) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    Shape b = src.shape();
    for (std::size_t d = 0; d < b.size(); ++d)
      b[d] = std::max<std::int64_t>(1, b[d] + rng.between(-b[d] / 32, b[d] / 32));
    if (alike(src, dst, src.shape(), b)) return b;
  }
  return src.shape();
}

// What the move `src` -> `dst` built with `shared` costs over built with `own` (its own choice),
// by the cost model: 0.02 is 2% more.
double regret(const Layout& src, const Layout& dst, const Topology& topo, Strategy shared,
              Strategy own) {
  const auto price = [&](Strategy st) {
    return testing::strategy_price(src, dst, topo, st, Balance::Local, PlanOptions{}.chunk_bytes);
  };
  return price(shared) / price(own) - 1;
}

// Random moves of large extents (so that a bucket holds many), each with an alike move: the
// alike move priced under the first's choice costs at most 10% more than under its own best
// (MESHCAST_TEST_SCALE=20: choices differ in 21 of 36,070 pairs, by 0.3% on average and 4.4% at
// most, where a split's remainder moved from 2 to 3; by default none differ, and
// AlikeTensorsTakeTheFirstOnesChoice prices a pair that does), and class_digest agrees wherever
// alike does.
TEST(PriceClass, SharedChoiceCostsLittle) {
  Rng rng(0xa11ce);
  testing::Limits lim;
  lim.max_ndim = 3;
  lim.max_mesh_size = 32;
  lim.max_mesh_extent = 8;
  lim.pool = 64;
  double worst = 0, sum = 0;
  int differ = 0, pairs = 0;
  const int n = testing::scaled(3000);
  for (int i = 0; i < n; ++i) {
    const auto rel = static_cast<testing::Devices>(i % 4);
    const auto [sm, dm] = testing::random_meshes(rng, lim, rel);
    Shape shape(static_cast<std::size_t>(rng.between(1, lim.max_ndim)));
    for (auto& e : shape) e = rng.between(1, std::int64_t{1} << rng.between(0, 16));
    const DType dtype = testing::dtype_at(i);
    const Layout src(shape, dtype, sm, testing::random_spec(rng, shape.size(), sm.ndim(), false));
    const Layout dst(shape, dtype, dm,
                     testing::random_spec(rng, shape.size(), dm.ndim(), rng.chance(1, 4)));
    const Topology topo =
        i % 5 == 0 ? Topology::single_host() : testing::random_topology(rng, lim.pool);
    const Shape other = alike_shape(rng, src, dst);
    if (other == shape) continue;  // none found
    ++pairs;
    const Layout src_b = with_shape(src, other), dst_b = with_shape(dst, other);
    ASSERT_EQ(detail::class_digest(src, dst), detail::class_digest(src_b, dst_b));
    const PlanOptions options{.balance = Balance::Local};
    const Strategy shared = detail::tensor_strategy(src, dst, topo, options);
    const Strategy own = detail::tensor_strategy(src_b, dst_b, topo, options);
    if (shared == own) continue;
    ++differ;
    const double r = regret(src_b, dst_b, topo, shared, own);
    sum += r;
    worst = std::max(worst, r);
    EXPECT_LT(r, 0.1) << "case " << i << ": " << src.str() << " -> " << dst.str() << " "
                      << shape_str(shape) << " and " << shape_str(other) << "\n"
                      << topo.to_json();
  }
  EXPECT_GE(pairs * 3, n);  // most moves have alike others to try
  std::printf(
      "%d pairs of alike moves (of %d moves); choices differ in %d; regret mean %.4f, worst %.4f\n",
      pairs, n, differ, differ ? sum / differ : 0.0, worst);
}

std::vector<Strategy> strategies(const std::vector<TensorMove>& tensors, const Topology& topo,
                                 const PlanOptions& options,
                                 std::int64_t budget = detail::kPricingWork) {
  std::vector<const Layout*> src, dst;
  for (const TensorMove& t : tensors) {
    src.push_back(&t.src);
    dst.push_back(&t.dst);
  }
  return detail::tensor_strategies(src, dst, topo, options, budget);
}

// Two alike moves whose own choices differ (where auto's choice turns, from broadcast for a
// large all-gather to sendrecv for a small one): each takes the choice of whichever comes first.
// A tensor of another class keeps its own.
TEST(PriceClass, AlikeTensorsTakeTheFirstOnesChoice) {
  // Two hosts of 8 (NVLink-like within, 200 Gbit/s between).
  const Topology topo =
      Topology::uniform("two", 2, 8, LinkClass("nvlink", 300e9, 2e-6), LinkClass("ib", 25e9, 5e-6));
  const PlanOptions options{.balance = Balance::Local};
  const auto move = [](std::int64_t e) {
    const Shape s{e, 3};
    return TensorMove{"w" + std::to_string(e), Layout::parse(s, DType::f32, "16@0-15:S0R"),
                      Layout::parse(s, DType::f32, "16@0-15:RR")};
  };
  const auto choice = [&](std::int64_t e) {
    const TensorMove m = move(e);
    return detail::tensor_strategy(m.src, m.dst, topo, options);
  };
  std::int64_t lo = 64, hi = std::int64_t{1} << 20;  // where the choice turns
  ASSERT_NE(choice(lo), choice(hi));
  while (hi - lo > 1) (choice((lo + hi) / 2) == choice(lo) ? lo : hi) = (lo + hi) / 2;
  std::int64_t a = 0;
  for (std::int64_t e = std::max<std::int64_t>(64, lo - lo / 32); e <= lo && a == 0; ++e) {
    const TensorMove x = move(e), y = move(hi);
    if (detail::alike(x.src, x.dst, y.src, y.dst)) a = e;
  }
  ASSERT_NE(a, 0) << "no extent alike " << hi << " below it";
  const Strategy below = choice(a), above = choice(hi);
  ASSERT_NE(below, above);
  // What hi pays for a's choice: little, as the choice turns where the two cost alike.
  EXPECT_LT(regret(move(hi).src, move(hi).dst, topo, below, above), 0.1);
  const TensorMove bias{"bias", Layout::parse({64, 3}, DType::f32, "16@0-15:S0R"),
                        Layout::parse({64, 3}, DType::f32, "16@0-15:RR")};
  EXPECT_EQ(strategies({move(a), move(hi), bias}, topo, options),
            (std::vector<Strategy>{below, below, choice(64)}));
  EXPECT_EQ(strategies({move(hi), move(a)}, topo, options), (std::vector<Strategy>{above, above}));
  // A fixed strategy is every tensor's.
  PlanOptions fixed = options;
  fixed.strategy = Strategy::SendRecv;
  EXPECT_EQ(strategies({move(a), bias}, topo, fixed),
            (std::vector<Strategy>{Strategy::SendRecv, Strategy::SendRecv}));
}

// All-gathers over 16 devices whose source meshes each order the devices their own way, of
// extents from 65 up (no two alike), spend the pricing budget (kPricingWork): those before it
// take their own choices, sendrecv for the small ones and broadcast for the large; past it, a
// move akin to priced ones (its devices in an order no move has) takes the choice of the first
// priced in its octave of elements, and a move akin to none takes broadcast, unpriced.
TEST(PriceClass, PastItsBudgetAMoveTakesTheNearestAkinChoiceUnpriced) {
  const Topology topo =
      Topology::uniform("two", 2, 8, LinkClass("nvlink", 300e9, 2e-6), LinkClass("ib", 25e9, 5e-6));
  const PlanOptions options{.balance = Balance::Local};
  const auto gather = [](const std::string& devices, std::int64_t e) {
    const Shape s{e, 3};
    return TensorMove{"g" + std::to_string(e) + "@" + devices,
                      Layout::parse(s, DType::f32, "16@" + devices + ":S0R"),
                      Layout::parse(s, DType::f32, "16@0-15:RR")};
  };
  const auto octave = [](std::int64_t e) {
    return std::bit_width(static_cast<std::uint64_t>(3 * e));
  };
  // A budget of 1/32 of kPricingWork: the same code, in 1/32 of the time.
  const std::int64_t budget = detail::kPricingWork / 32;
  std::vector<TensorMove> moves;
  std::vector<Strategy> own;
  std::map<int, Strategy> first;  // per octave: its first priced move's choice
  std::int64_t spent = 0;
  std::size_t priced = 0;  // the moves priced: those until the budget is spent
  // Extents of an octave each (odd: every extent divides alike, by none), each over the 16
  // rotations of the devices.
  for (std::int64_t e = 65; e < (std::int64_t{1} << 28) && priced == moves.size(); e = 2 * e - 1) {
    for (int r = 0; r < 16 && priced == moves.size(); ++r) {
      const std::string devices =
          r == 0 ? "0-15" : "[" + std::to_string(r) + "-15,0-" + std::to_string(r - 1) + "]";
      moves.push_back(gather(devices, e));
      std::int64_t work = 0;
      own.push_back(
          detail::tensor_strategy(moves.back().src, moves.back().dst, topo, options, &work));
      if (spent < budget) {
        ++priced;
        first.try_emplace(octave(e), own.back());
      }
      spent += work;
    }
  }
  ASSERT_LT(priced, moves.size()) << "the budget outlasts " << moves.size() << " moves";
  ASSERT_GE(first.size(), 2u);
  const auto [small, small_choice] = *first.begin();
  const auto [large, large_choice] = *first.rbegin();
  ASSERT_NE(small_choice, large_choice)
      << "the choice does not turn over octaves " << small << " to " << large;
  const std::size_t last = moves.size();
  // Akin to the priced ones: the devices in an order no move has, in the least and greatest
  // octave priced.
  moves.push_back(gather("[1-1,0-0,2-15]", ((std::int64_t{1} << (small - 1)) / 3 + 2) | 1));
  moves.push_back(gather("[1-1,0-0,2-15]", ((std::int64_t{1} << (large - 1)) / 3 + 2) | 1));
  ASSERT_EQ(octave(moves[last].src.shape()[0]), small);
  ASSERT_EQ(octave(moves[last + 1].src.shape()[0]), large);
  // Akin to none: the source on a 4x4 mesh. Its own choice is not broadcast.
  const Shape s{64, 3};
  moves.push_back({"other", Layout::parse(s, DType::f32, "4x4@0-15:S01R"),
                   Layout::parse(s, DType::f32, "16@0-15:RR")});
  ASSERT_NE(detail::tensor_strategy(moves.back().src, moves.back().dst, topo, options),
            Strategy::Broadcast);

  const std::vector<Strategy> got = strategies(moves, topo, options, budget);
  for (std::size_t t = 0; t < priced; ++t) EXPECT_EQ(got[t], own[t]) << moves[t].name;
  EXPECT_EQ(got[last], small_choice);
  EXPECT_EQ(got[last + 1], large_choice);
  EXPECT_EQ(got[last + 2], Strategy::Broadcast);
}

}  // namespace
}  // namespace meshcast
