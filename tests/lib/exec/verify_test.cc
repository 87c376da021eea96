// fill_source / count_mismatches: exactly predictable data, addends that sum exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "meshcast/error.h"
#include "meshcast/testing.h"
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

// The largest integer that the dtype holds exactly.
std::int64_t exact_limit(DType t) {
  switch (t) {
    case DType::i8:
      return 127;
    case DType::u8:
      return 255;
    case DType::bf16:
      return 256;
    case DType::f16:
      return 2048;
    case DType::i16:
      return 32767;
    case DType::u16:
      return 65535;
    case DType::f32:
    case DType::c64:
      return std::int64_t{1} << 24;
    case DType::i32:
      return 2147483647;
    case DType::u32:
      return 4294967295;
    case DType::b8:
      return 1;
    case DType::f64:
    case DType::i64:
    case DType::u64:
    case DType::c128:
      return std::int64_t{1} << 53;
  }
  return 0;
}

bool is_unsigned(DType t) {
  return t == DType::u8 || t == DType::u16 || t == DType::u32 || t == DType::u64;
}

TEST(Verify, TestValuesAreExactSmallIntegers) {
  for (DType t : kAllDTypes)
    for (std::int64_t i : {std::int64_t{0}, std::int64_t{1}, std::int64_t{255}, std::int64_t{4097},
                           std::int64_t{1} << 20, (std::int64_t{1} << 33) + 5}) {
      const std::int64_t v = test_value(i, t);
      EXPECT_EQ(test_value(i, t), v) << "deterministic";
      EXPECT_GE(v, 0);
      // Exact in the dtype, with room for 64 addends of magnitude 1 either way (bool: 0 or 1,
      // its addends sum by or).
      EXPECT_LE(v, t == DType::b8 ? 1 : exact_limit(t) - 64) << to_string(t) << " i=" << i;
    }
}

// test_value's formula, written out here: i's place in its block of p elements offset by the
// block's hash (splitmix64's finalizer), mod p; bool the parity of i's bits; 64-bit and f64
// types i itself.
std::int64_t formula(std::int64_t i, DType t) {
  std::int64_t p = 0;
  switch (t) {
    case DType::i8:
      p = 61;
      break;
    case DType::bf16:
    case DType::u8:
      p = 191;
      break;
    case DType::f16:
      p = 1021;
      break;
    case DType::i16:
      p = 32693;
      break;
    case DType::u16:
      p = 65449;
      break;
    case DType::f32:
    case DType::c64:
      p = 16000057;
      break;
    case DType::i32:
      p = 2147483629;
      break;
    case DType::u32:
      p = 4294967231;
      break;
    case DType::b8:
      return __builtin_popcountll(static_cast<unsigned long long>(i)) & 1;
    default:
      return i;
  }
  std::uint64_t z = static_cast<std::uint64_t>(i / p) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return (i % p + static_cast<std::int64_t>((z ^ (z >> 31)) % static_cast<std::uint64_t>(p))) % p;
}

// Rows are filled and checked block by block (a division per block of p, not per element):
// rows that start inside a block and cross many, of every dtype, hold the formula's values, and
// one wrong element in any block is one mismatch.
TEST(Verify, RowsAcrossBlocksHoldTheFormula) {
  Rng rng(0xb10c);
  for (DType t : kAllDTypes) {
    for (std::int64_t i :
         {std::int64_t{0}, std::int64_t{60}, std::int64_t{190}, std::int64_t{1020},
          std::int64_t{16000056}, std::int64_t{4294967230}, (std::int64_t{1} << 40) + 3})
      EXPECT_EQ(test_value(i, t), formula(i, t)) << to_string(t) << " i=" << i;
    // 3 devices of 2 x 7,000 columns each: rows start at columns 0, 7,000 and 14,000.
    const Layout l = Layout::parse({3, 21000}, t, "3@0-2:RS0");
    const std::size_t elem = dtype_size(t);
    for (std::int64_t k = 0; k < 3; ++k) {
      Bytes b = filled(l, k);
      std::size_t at = 0;
      testing::ref_for_each(l.shape(), testing::ref_tile(l, k), [&](const auto&, std::int64_t g) {
        if (testing::load_element(t, b.data() + at) != static_cast<double>(formula(g, t)))
          ADD_FAILURE() << to_string(t) << " device " << k << " element " << g;
        at += elem;
      });
      ASSERT_EQ(count_mismatches(l, static_cast<int>(k), b.data()), 0) << to_string(t);
      const auto e =
          static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(b.size() / elem)));
      b[e * elem] ^= std::byte{1};
      EXPECT_EQ(count_mismatches(l, static_cast<int>(k), b.data()), 1) << to_string(t);
    }
  }
}

TEST(Verify, FilledLayoutCheckedAgainstItselfHasNoMismatches) {
  Rng rng(0x7e21);
  testing::Limits lim;
  lim.partial_src = false;
  for (int i = 0; i < testing::scaled(400); ++i) {
    const auto c = testing::random_case(rng, lim, testing::dtype_at(i));
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
    const DType t = testing::dtype_at(i);
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
          // addend value of each group, from the first holder in mesh order, and its bytes
          std::vector<double> addend(static_cast<std::size_t>(groups));
          std::vector<std::uint64_t> bits(static_cast<std::size_t>(groups), 0);
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
            std::uint64_t b = 0;  // little-endian: the element's bytes, zero-extended
            if (elem <= 8)
              std::memcpy(
                  &b,
                  buf[static_cast<std::size_t>(k)].data() + off * static_cast<std::int64_t>(elem),
                  elem);
            if (seen[a]) {
              EXPECT_TRUE(addend[a] == v || (std::isnan(addend[a]) && std::isnan(v)))
                  << "replicas of addend " << a << " differ at element " << g;
              EXPECT_EQ(bits[a], b) << "replicas of addend " << a << " differ at element " << g;
            }
            addend[a] = v;
            bits[a] = b;
            seen[a] = true;
          }
          for (std::size_t a = 0; a < addend.size(); ++a)
            ASSERT_TRUE(seen[a]) << "no holder of addend " << a;
          const std::int64_t want = test_value(g, t);
          if (t == DType::b8) {  // or of 0s and 1s
            double any = 0;
            for (double v : addend) {
              EXPECT_TRUE(v == 0 || v == 1) << "element " << g;
              any = std::max(any, v);
            }
            EXPECT_EQ(any, static_cast<double>(want)) << "element " << g;
          } else if (is_unsigned(t)) {  // modulo 2^bits, as the reduction wraps
            const std::uint64_t mask =
                elem == 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * elem)) - 1;
            std::uint64_t sum = 0;
            for (std::uint64_t b : bits) sum += b;
            EXPECT_EQ(sum & mask, static_cast<std::uint64_t>(want)) << "element " << g;
          } else {
            double sum = 0;
            for (double v : addend) {
              sum += v;
              // Every partial sum stays exactly representable (so any order is exact).
              EXPECT_LE(std::abs(sum), static_cast<double>(exact_limit(t)));
            }
            EXPECT_EQ(sum, static_cast<double>(want)) << "element " << g;
          }
        });
  }
}

// Two neighbours swapped, and for complex numbers the parts of one element swapped: seen in
// every dtype (elements 2 and 3 differ in bool's pattern as well).
TEST(Verify, SwappedElementsAreSeenInEveryDtype) {
  for (DType t : kAllDTypes) {
    const Layout l = Layout::parse({64}, t, "1@0:R");
    const std::size_t elem = dtype_size(t);
    Bytes b = filled(l, 0);
    ASSERT_EQ(count_mismatches(l, 0, b.data()), 0) << to_string(t);
    ASSERT_NE(test_value(2, t), test_value(3, t)) << to_string(t);
    std::swap_ranges(b.begin() + static_cast<std::ptrdiff_t>(2 * elem),
                     b.begin() + static_cast<std::ptrdiff_t>(3 * elem),
                     b.begin() + static_cast<std::ptrdiff_t>(3 * elem));
    EXPECT_EQ(count_mismatches(l, 0, b.data()), 2) << to_string(t);
    if (!is_complex(t)) continue;
    Bytes c = filled(l, 0);
    std::swap_ranges(c.begin() + static_cast<std::ptrdiff_t>(3 * elem),
                     c.begin() + static_cast<std::ptrdiff_t>(3 * elem + elem / 2),
                     c.begin() + static_cast<std::ptrdiff_t>(3 * elem + elem / 2));
    EXPECT_EQ(count_mismatches(l, 0, c.data()), 1) << to_string(t) << " real and imaginary";
  }
}

// A row delivered to another row is seen whatever the row length: test values are no longer
// i % p, under which rows of a multiple of p elements (191 for bf16 and u8, 61 for i8) were
// alike and the swap passed. And a shift by one element is seen in every dtype but bool.
TEST(Verify, RowsSwappedAreSeenWhateverTheirLength) {
  for (DType t : kAllDTypes) {
    if (t == DType::b8) continue;  // 0 or 1: rows alike by chance
    for (std::int64_t cols : {61, 191, 1021}) {
      const Layout l = Layout::parse({4, cols}, t, "1@0:RR");
      const std::size_t row = static_cast<std::size_t>(cols) * dtype_size(t);
      Bytes b = filled(l, 0);
      std::swap_ranges(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(row),
                       b.begin() + static_cast<std::ptrdiff_t>(row));
      EXPECT_GT(count_mismatches(l, 0, b.data()), cols) << to_string(t) << " rows of " << cols;
      // Every element one place on, but the last: only values across a block's end may match.
      Bytes c = filled(l, 0);
      std::rotate(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(dtype_size(t)), c.end());
      EXPECT_GT(count_mismatches(l, 0, c.data()), 3 * cols) << to_string(t) << " shifted";
    }
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
