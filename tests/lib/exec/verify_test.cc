// fill_source / count_mismatches: exactly predictable data, addends that sum exactly.
#include "meshcast/verify.h"

#include <gtest/gtest.h>

#include <cstring>

#include "meshcast/error.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;
using Bytes = std::vector<std::byte>;

Bytes filled(const Layout& l, std::int64_t index) {
  const Box tile = testing::ref_tile(l, index);
  Bytes b(static_cast<std::size_t>(tile.volume()) * dtype_size(l.dtype()));
  fill_source(l, l.mesh().device(index), b.data());
  return b;
}

TEST(Verify, TestValuesAreExactSmallIntegers) {
  for (DType t : kAllDTypes)
    for (std::int64_t i : {std::int64_t{0}, std::int64_t{1}, std::int64_t{255}, std::int64_t{4097},
                           std::int64_t{1} << 20, (std::int64_t{1} << 33) + 5}) {
      const std::int64_t v = test_value(i, t);
      EXPECT_EQ(test_value(i, t), v) << "deterministic";
      EXPECT_GE(v, 0);
      // Exact in the dtype, with room for 64 addends of magnitude 1 either way.
      const std::int64_t limit = t == DType::i8     ? 127 - 64
                                 : t == DType::bf16 ? 256 - 64
                                 : t == DType::f16  ? 2048 - 64
                                 : t == DType::f32  ? (std::int64_t{1} << 24) - 64
                                 : t == DType::i32  ? 2147483647 - 64
                                                    : std::int64_t{1} << 53;
      EXPECT_LE(v, limit) << to_string(t) << " i=" << i;
    }
}

TEST(Verify, FilledLayoutCheckedAgainstItselfHasNoMismatches) {
  Rng rng(0x7e21);
  testing::Limits lim;
  lim.partial_src = false;
  for (int i = 0; i < testing::scaled(400); ++i) {
    const auto c = testing::random_case(rng, lim, kAllDTypes[i % 7]);
    const Layout& l = c.src;
    SCOPED_TRACE("layout " + shape_str(l.shape()) + " " + to_string(l.dtype()) + " " + l.str());
    const std::size_t elem = dtype_size(l.dtype());
    for (std::int64_t k = 0; k < l.mesh().size(); ++k) {
      Bytes b = filled(l, k);
      const int dev = l.mesh().device(k);
      // Each element holds test_value of its global row-major index.
      std::size_t at = 0;
      testing::ref_for_each(l.shape(), testing::ref_tile(l, k), [&](const auto&, std::int64_t g) {
        EXPECT_EQ(testing::load_element(l.dtype(), b.data() + at),
                  static_cast<double>(test_value(g, l.dtype())))
            << "device " << dev << " element " << g;
        at += elem;
      });
      ASSERT_EQ(at, b.size());
      EXPECT_EQ(count_mismatches(l, dev, b.data()), 0) << "device " << dev;
      if (b.empty()) continue;
      // One flipped element: exactly one mismatch.
      const std::size_t e =
          static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(b.size() / elem)));
      b[e * elem + elem - 1] ^= std::byte{0x40};
      b[e * elem] ^= std::byte{0x01};
      EXPECT_EQ(count_mismatches(l, dev, b.data()), 1) << "device " << dev << " element " << e;
    }
  }
}

TEST(Verify, PartialAddendsSumToTheTestValue) {
  Rng rng(0xadd5);
  for (int i = 0; i < testing::scaled(700); ++i) {
    const DType t = kAllDTypes[i % 7];
    // A tensor split over some axes with a pending sum over the others (up to 64 addends).
    testing::Limits lim;
    lim.max_mesh_size = rng.chance(1, 4) ? 64 : 16;
    lim.max_mesh_ndim = 4;
    const auto ms = testing::random_mesh_shape(rng, lim.max_mesh_ndim, 4, lim.max_mesh_size);
    std::vector<int> devs(static_cast<std::size_t>(testing::ref_volume(ms)));
    std::iota(devs.begin(), devs.end(), 0);
    const Mesh mesh(ms, devs);
    const Shape shape = testing::random_shape(rng, lim);
    auto spec = testing::random_spec(rng, shape.size(), mesh.ndim(), true);
    if (spec.partial().empty()) {  // make sure some axis holds addends
      auto dims = spec.dims();
      for (auto& d : dims) d.clear();
      spec = ShardingSpec(dims, {0});
    }
    const Layout l(shape, t, mesh, spec);
    SCOPED_TRACE("layout " + shape_str(shape) + " " + to_string(t) + " " + l.str());
    const std::int64_t groups = testing::ref_groups(l);
    // For every element: the addends of the holders of one replica, summed in addend order in
    // the dtype (as a reduction does), and in double.
    std::vector<Bytes> buf;
    for (std::int64_t k = 0; k < mesh.size(); ++k) buf.push_back(filled(l, k));
    const std::size_t elem = dtype_size(t);
    testing::ref_for_each(
        shape, Box::whole(shape), [&](const std::vector<std::int64_t>& x, std::int64_t g) {
          // addend value of each group, from the first holder in mesh order
          std::vector<double> addend(static_cast<std::size_t>(groups));
          std::vector<bool> seen(static_cast<std::size_t>(groups), false);
          for (std::int64_t k = 0; k < mesh.size(); ++k) {
            const Box tile = testing::ref_tile(l, k);
            if (!testing::ref_has(tile, x)) continue;
            const auto a = static_cast<std::size_t>(testing::ref_addend(l, k));
            // local row-major offset of x in the tile
            std::int64_t off = 0;
            for (std::size_t d = 0; d < x.size(); ++d)
              off = off * tile[d].size() + (x[d] - tile[d].lo);
            const double v = testing::load_element(
                t, buf[static_cast<std::size_t>(k)].data() + off * static_cast<std::int64_t>(elem));
            if (seen[a]) {
              EXPECT_EQ(addend[a], v) << "replicas of addend " << a << " differ at element " << g;
            }
            addend[a] = v;
            seen[a] = true;
          }
          double sum = 0;
          for (std::size_t a = 0; a < addend.size(); ++a) {
            ASSERT_TRUE(seen[a]) << "no holder of addend " << a;
            sum += addend[a];
            // Every partial sum stays exactly representable (so any order is exact).
            EXPECT_LE(std::abs(sum), t == DType::i8     ? 127.0
                                     : t == DType::bf16 ? 256.0
                                     : t == DType::f16  ? 2048.0
                                                        : 1e15);
          }
          EXPECT_EQ(sum, static_cast<double>(test_value(g, t))) << "element " << g;
        });
  }
}

TEST(Verify, PartialTargetsExpectZeroOutsideTheFirstAddend) {
  const Layout l = Layout::parse({6, 4}, DType::f32, "2x2@0-3:S0R+P1");
  for (int dev = 0; dev < 4; ++dev) {
    const auto k = *l.mesh().index_of(dev);
    Bytes zeros(static_cast<std::size_t>(testing::ref_tile(l, k).volume()) * 4, std::byte{0});
    // Values: what a first addend holds after the sum.
    Bytes values = zeros;
    std::size_t at = 0;
    std::int64_t nonzero = 0;
    testing::ref_for_each(l.shape(), testing::ref_tile(l, k), [&](const auto&, std::int64_t g) {
      const float f = static_cast<float>(test_value(g, DType::f32));
      std::memcpy(values.data() + at, &f, 4);
      nonzero += f != 0;
      at += 4;
    });
    if (testing::ref_addend(l, k) == 0) {
      EXPECT_EQ(count_mismatches(l, dev, values.data()), 0) << dev;
      EXPECT_EQ(count_mismatches(l, dev, zeros.data()), nonzero) << dev;
    } else {
      EXPECT_EQ(count_mismatches(l, dev, zeros.data()), 0) << dev;
      EXPECT_EQ(count_mismatches(l, dev, values.data()), nonzero) << dev;
    }
  }
}

TEST(Verify, DevicesOutsideTheMeshAreRefused) {
  const Layout l = Layout::parse({4}, DType::f32, "2@0-1:S0");
  float buf[4];
  EXPECT_THROW(fill_source(l, 5, buf), ValidationError);
  EXPECT_THROW(count_mismatches(l, 5, buf), ValidationError);
}

}  // namespace
}  // namespace meshcast
