// convert_region (the sender-side cast of whole-model sync): every f32 pattern narrowed to bf16
// and to f16 against the tests' own integer rounding, which is itself checked against rounding
// by value (the nearest representable value, ties to the even pattern); every bf16 and f16
// pattern widened against their decoding by definition and round-tripped; the f16 exponent edge
// cases by name; strided boxes against an element-by-element reference; refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "meshcast/dtype.h"
#include "meshcast/error.h"
#include "meshcast/region.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// ---- References by value -------------------------------------------------------------------

using testing::bf16_is_nan;
using testing::half_is_nan;
using testing::ref_bf16;
using testing::ref_half;

// IEEE round to nearest even by value: binary search the sorted positive patterns for the
// neighbours of |x| and take the nearer, the even pattern on a tie. For the comparison the
// infinity pattern stands for max + ulp (the next binade's first value), which is the IEEE
// overflow rule: |x| >= max + ulp/2 rounds to inf.
template <class Decode>
unsigned round_by_value(float f, Decode decode, unsigned inf_pattern, double beyond_max) {
  const double x = std::fabs(static_cast<double>(f));
  const unsigned sign = std::signbit(f) ? 0x8000 : 0;
  auto at = [&](unsigned p) { return p == inf_pattern ? beyond_max : decode(p); };
  if (x > beyond_max) return sign | inf_pattern;
  unsigned lo = 0, hi = inf_pattern;  // first pattern whose value is >= x
  while (lo < hi) {
    const unsigned mid = (lo + hi) / 2;
    if (at(mid) < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (at(lo) == x || lo == 0) return sign | lo;
  const double up = at(lo) - x, down = x - at(lo - 1);  // exact: few significant bits
  const unsigned best = up < down ? lo : down < up ? lo - 1 : (lo % 2 == 0 ? lo : lo - 1);
  return sign | best;
}
unsigned bf16_by_value(float f) {
  return round_by_value(f, ref_bf16, 0x7f80, std::ldexp(1.0, 128));
}
unsigned half_by_value(float f) { return round_by_value(f, ref_half, 0x7c00, 65536.0); }

// ---- References by integers (fast enough for every pattern; checked against the above) -------

// Round the integer m right by s bits (s >= 1), to nearest, ties to even.
std::uint32_t shift_round_even(std::uint32_t m, unsigned s) {
  if (s >= 32) return 0;
  const std::uint32_t q = m >> s, r = m - (q << s), half = std::uint32_t{1} << (s - 1);
  return q + ((r > half) | ((r == half) & (q & 1)));
}

// A bf16 pattern is an f32 pattern with its low 16 bits dropped, and patterns of one sign are
// ordered as their values: round the magnitude's bits (a carry into the exponent is right).
unsigned bf16_by_bits(std::uint32_t x) {
  return ((x >> 16) & 0x8000) | shift_round_even(x & 0x7fffffffu, 16);
}

// The f32 significand M (with its hidden bit) counted in units of the half's quantum at that
// exponent: 2^-13 of M for normal halves, 2^-24 absolute below 2^-14.
unsigned half_by_bits(std::uint32_t x) {
  const unsigned sign = (x >> 16) & 0x8000;
  const std::uint32_t e = (x >> 23) & 0xff, man = x & 0x7fffff;
  const std::uint32_t m = e ? (0x800000 | man) : man;  // value m * 2^(max(e,1) - 150)
  if (e >= 113) {                                      // >= 2^-14: a normal half (or overflow)
    const std::uint32_t n = shift_round_even(m, 13);   // in [1024, 2048]
    const std::uint32_t bits = ((e - 112) << 10) + (n - 1024);
    return sign | std::min<std::uint32_t>(bits, 0x7c00);
  }
  // m * 2^(max(e,1) - 150) / 2^-24 = m >> (126 - max(e,1)); 1024 units is 2^-14, pattern 0x400.
  return sign | shift_round_even(m, 126 - std::max<std::uint32_t>(e, 1));
}

// The interesting f32 patterns: per exponent, mantissas that sit on, next to and between the
// rounding boundaries of both targets, and the specials.
std::vector<std::uint32_t> edge_patterns() {
  std::vector<std::uint32_t> out;
  const std::uint32_t lows[] = {0,       1,       2,        0xfff,    0x1000,   0x1001,  0x1fff,
                                0x2000,  0x2001,  0x3000,   0x7fff,   0x8000,   0x8001,  0xffff,
                                0x10000, 0x18000, 0x7fe000, 0x7ff000, 0x7ffe00, 0x7fffff};
  for (std::uint32_t e = 0; e < 256; ++e)
    for (std::uint32_t hi : {0u, 0x10000u, 0x20000u, 0x3f0000u, 0x7e0000u, 0x7f0000u, 0x7fe000u})
      for (std::uint32_t lo : lows)
        for (std::uint32_t sign : {0u, 0x80000000u})
          out.push_back(sign | (e << 23) | ((hi | lo) & 0x7fffff));
  // Every tie and near-tie of the f16 subnormal range: m * 2^-25 +- one f32 ulp.
  for (std::uint32_t k = 0; k <= 2 * 1024 + 1; ++k) {
    const auto b = std::bit_cast<std::uint32_t>(std::ldexp(static_cast<float>(k), -25));
    for (std::uint32_t d : {b - 1, b, b + 1}) out.push_back(d);
  }
  return out;
}

bool is_quiet_half_nan(unsigned h) { return half_is_nan(h) && (h & 0x200); }

TEST(CastReference, IntegerRoundingAgreesWithRoundingByValue) {
  auto check = [](std::uint32_t x) {
    const float f = std::bit_cast<float>(x);
    if (std::isnan(f)) return;
    ASSERT_EQ(bf16_by_bits(x), bf16_by_value(f)) << std::hex << x;
    ASSERT_EQ(half_by_bits(x), half_by_value(f)) << std::hex << x;
  };
  for (std::uint32_t x : edge_patterns()) check(x);
  Rng rng(0xca57);
  for (int i = 0; i < testing::scaled(1 << 18); ++i) check(static_cast<std::uint32_t>(rng.next()));
  // A stride through all patterns that visits every exponent with varied mantissas.
  for (std::uint64_t x = 0; x < (std::uint64_t{1} << 32); x += 40961)
    check(static_cast<std::uint32_t>(x));
}

// ---- Narrowing: every f32 pattern --------------------------------------------------------------

// Patterns [lo, hi) with a stride.
struct Patterns {
  std::uint64_t lo, hi, stride;
};
constexpr std::uint64_t kAll = std::uint64_t{1} << 32;

// Converts the patterns through packed f32 -> 16-bit regions, in parallel chunks, and counts
// the (x, y) that ok(x, y) rejects (a vectorisable count: the full sweep takes seconds); reports
// the first of them.
template <class Ok>
void sweep_f32(DType to, std::vector<Patterns> sets, Ok ok) {
  if (kSanitized)  // instrumented loops are ~10x slower: a sample is enough there
    for (auto& s : sets) s.stride = s.stride * 61;
  constexpr std::uint64_t kChunk = 1 << 20;
  std::vector<Patterns> work;  // chunks of at most kChunk patterns
  for (const auto& s : sets)
    for (std::uint64_t at = s.lo; at < s.hi; at += kChunk * s.stride)
      work.push_back({at, std::min(s.hi, at + kChunk * s.stride), s.stride});
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  std::vector<std::uint64_t> bad(threads, 0), first(threads, 0);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::vector<std::uint32_t> in(kChunk);
      std::vector<std::uint16_t> out(kChunk);
      for (std::size_t w = t; w < work.size(); w += threads) {
        const auto [lo, hi, stride] = work[w];
        const auto n = static_cast<std::int64_t>((hi - lo + stride - 1) / stride);
        for (std::int64_t i = 0; i < n; ++i)
          in[i] = static_cast<std::uint32_t>(lo + static_cast<std::uint64_t>(i) * stride);
        convert_region(Region{in.data(), 4, {n}, {0}, {n}}, DType::f32,
                       Region{out.data(), 2, {n}, {0}, {n}}, to);
        std::uint64_t wrong = 0;
        for (std::int64_t i = 0; i < n; ++i) wrong += !ok(in[i], std::uint32_t{out[i]});
        if (wrong != 0 && bad[t] == 0)
          for (std::int64_t i = 0; i < n; ++i)
            if (!ok(in[i], std::uint32_t{out[i]})) {
              first[t] = in[i];
              break;
            }
        bad[t] += wrong;
      }
    });
  for (auto& th : pool) th.join();
  for (unsigned t = 0; t < threads; ++t)
    EXPECT_EQ(bad[t], 0u) << "first wrong input pattern 0x" << std::hex << first[t];
}

// NaN in: a quiet NaN of the same sign out. Bitwise & and |, not && and ||: branch-free, so
// that the count over a chunk vectorises.
// Lambdas, so that sweep_f32 inlines them.
const auto bf16_ok = [](std::uint32_t x, std::uint32_t y) {
  const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
  const bool quiet_same_sign = ((y & 0x7fc0u) == 0x7fc0u) & (((y ^ (x >> 16)) & 0x8000u) == 0);
  return (nan & quiet_same_sign) | (!nan & (y == bf16_by_bits(x)));
};

const auto half_ok = [](std::uint32_t x, std::uint32_t y) {
  const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
  const bool quiet_same_sign = ((y & 0x7e00u) == 0x7e00u) & (((y ^ (x >> 16)) & 0x8000u) == 0);
  return (nan & quiet_same_sign) | (!nan & (y == half_by_bits(x)));
};

TEST(CastF32ToBf16, EveryPatternRoundsToNearestEven) {
  sweep_f32(DType::bf16, {{0, kAll, 1}}, bf16_ok);
}

// The f32 exponents whose values a half rounds to something other than zero, inf or NaN
// (2^-25 <= |x| < 2^16), every pattern of both signs; elsewhere a stride through each exponent.
TEST(CastF32ToF16, EveryPatternOfTheHalfRangeRoundsToNearestEven) {
  std::vector<Patterns> sets;
  for (std::uint64_t sign : {std::uint64_t{0}, std::uint64_t{1} << 31}) {
    sets.push_back({sign, sign | (std::uint64_t{102} << 23), 4099});
    sets.push_back({sign | (std::uint64_t{102} << 23), sign | (std::uint64_t{143} << 23), 1});
    sets.push_back({sign | (std::uint64_t{143} << 23), sign | (std::uint64_t{256} << 23), 4099});
  }
  sweep_f32(DType::f16, sets, half_ok);
}

// The sender's cast and the reductions (accumulate, through the scalar conversions) agree.
TEST(CastF32, MatchesTheScalarConversions) {
  sweep_f32(DType::bf16, {{0, kAll, 127}}, [](std::uint32_t x, std::uint32_t y) {
    return y == float_to_bf16(std::bit_cast<float>(x));
  });
  sweep_f32(DType::f16, {{0, kAll, 127}}, [](std::uint32_t x, std::uint32_t y) {
    return y == float_to_half(std::bit_cast<float>(x));
  });
}

unsigned to_half(float f) {
  std::uint16_t h = 0;
  convert_region(Region{&f, 4, {1}, {0}, {1}}, DType::f32, Region{&h, 2, {1}, {0}, {1}},
                 DType::f16);
  return h;
}

TEST(CastF32ToF16, ExponentEdgeCases) {
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    float f;
    unsigned h;
  } cases[] = {
      {65504.0f, 0x7bff},                           // largest finite
      {std::bit_cast<float>(0x477fefffu), 0x7bff},  // just below the tie
      {65520.0f, 0x7c00},                           // tie: even is inf
      {-65520.0f, 0xfc00},
      {65536.0f, 0x7c00},
      {std::numeric_limits<float>::max(), 0x7c00},  // overflow to inf
      {inf, 0x7c00},
      {-inf, 0xfc00},
      {std::ldexp(1.0f, -14), 0x0400},                        // smallest normal
      {std::ldexp(1023.5f, -24), 0x0400},                     // tie, rounds up into it
      {std::ldexp(1022.5f, -24), 0x03fe},                     // tie, stays even
      {std::ldexp(1023.0f, -24), 0x03ff},                     // largest subnormal
      {std::ldexp(1.0f, -24), 0x0001},                        // smallest subnormal
      {std::ldexp(1.5f, -24), 0x0002},                        // tie: even (2)
      {std::ldexp(2.5f, -24), 0x0002},                        // tie: even (2)
      {std::ldexp(1.0f, -25), 0x0000},                        // tie: even (0)
      {std::nextafter(std::ldexp(1.0f, -25), 1.0f), 0x0001},  // above the tie
      {-std::ldexp(1.0f, -25), 0x8000},                       // signed zero kept
      {std::numeric_limits<float>::denorm_min(), 0x0000},
      {-std::numeric_limits<float>::denorm_min(), 0x8000},
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},      // tie: even (1)
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02},  // tie: even
      {2049.0f, 0x6800},
      {2051.0f, 0x6802},
      {std::nextafter(2049.0f, 0.0f), 0x6800},
      {std::nextafter(2049.0f, 4096.0f), 0x6801},
      {std::nextafter(std::ldexp(1.0f, -14), 0.0f), 0x0400},  // rounds up to normal
  };
  for (const auto& c : cases) {
    EXPECT_EQ(to_half(c.f), c.h) << c.f;
    EXPECT_EQ(half_by_value(c.f), c.h) << c.f;  // the reference agrees with the table
  }
  // NaNs of any payload, quiet or signalling, either sign: a quiet NaN of that sign.
  for (std::uint32_t payload : {1u, 0x1fffu, 0x2000u, 0x200000u, 0x3fffffu, 0x400000u, 0x7fffffu})
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      const unsigned h = to_half(std::bit_cast<float>(sign | 0x7f800000u | payload));
      EXPECT_TRUE(is_quiet_half_nan(h)) << std::hex << payload << " -> " << h;
      EXPECT_EQ(h >> 15, sign >> 31) << std::hex << payload;
    }
}

// ---- Widening and round trips: every 16-bit pattern ---------------------------------------------

std::vector<std::uint16_t> every_16bit_pattern() {
  std::vector<std::uint16_t> v(1 << 16);
  for (unsigned i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint16_t>(i);
  return v;
}

std::vector<float> widen(const std::vector<std::uint16_t>& in, DType from) {
  std::vector<float> out(in.size());
  const auto n = static_cast<std::int64_t>(in.size());
  convert_region(Region{const_cast<std::uint16_t*>(in.data()), 2, {n}, {0}, {n}}, from,
                 Region{out.data(), 4, {n}, {0}, {n}}, DType::f32);
  return out;
}

std::vector<std::uint16_t> narrow(const std::vector<float>& in, DType to) {
  std::vector<std::uint16_t> out(in.size());
  const auto n = static_cast<std::int64_t>(in.size());
  convert_region(Region{const_cast<float*>(in.data()), 4, {n}, {0}, {n}}, DType::f32,
                 Region{out.data(), 2, {n}, {0}, {n}}, to);
  return out;
}

TEST(CastBf16, WidensExactlyAndRoundTripsEveryPattern) {
  const auto all = every_16bit_pattern();
  const auto wide = widen(all, DType::bf16);
  const auto back = narrow(wide, DType::bf16);
  for (unsigned h = 0; h < all.size(); ++h) {
    const float f = wide[h];
    EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    if (bf16_is_nan(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(bf16_is_nan(back[h])) << std::hex << h << " -> " << back[h];
      EXPECT_EQ(back[h] & 0x8000, h & 0x8000) << std::hex << h;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), ref_bf16(h)) << std::hex << h;
    EXPECT_EQ(back[h], h) << std::hex << h;
  }
}

TEST(CastF16, WidensExactlyAndRoundTripsEveryPattern) {
  const auto all = every_16bit_pattern();
  const auto wide = widen(all, DType::f16);
  const auto back = narrow(wide, DType::f16);
  for (unsigned h = 0; h < all.size(); ++h) {
    const float f = wide[h];
    EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    if (half_is_nan(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(half_is_nan(back[h])) << std::hex << h << " -> " << back[h];
      EXPECT_EQ(back[h] & 0x8000, h & 0x8000) << std::hex << h;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), ref_half(h)) << std::hex << h;
    EXPECT_EQ(back[h], h) << std::hex << h;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(f), std::bit_cast<std::uint32_t>(half_to_float(h)));
  }
}

TEST(CastHalfTypes, Bf16AndF16ConvertWithOneRounding) {
  const auto all = every_16bit_pattern();
  const auto n = static_cast<std::int64_t>(all.size());
  std::vector<std::uint16_t> as_half(all.size()), as_bf16(all.size());
  convert_region(Region{const_cast<std::uint16_t*>(all.data()), 2, {n}, {0}, {n}}, DType::bf16,
                 Region{as_half.data(), 2, {n}, {0}, {n}}, DType::f16);
  convert_region(Region{const_cast<std::uint16_t*>(all.data()), 2, {n}, {0}, {n}}, DType::f16,
                 Region{as_bf16.data(), 2, {n}, {0}, {n}}, DType::bf16);
  for (unsigned h = 0; h < all.size(); ++h) {
    // Each value is exact in f32, so the one rounding is the f32 one.
    if (bf16_is_nan(h))
      EXPECT_TRUE(is_quiet_half_nan(as_half[h])) << std::hex << h;
    else
      EXPECT_EQ(as_half[h], half_by_value(static_cast<float>(ref_bf16(h)))) << std::hex << h;
    if (half_is_nan(h))
      EXPECT_TRUE(bf16_is_nan(as_bf16[h])) << std::hex << h;
    else
      EXPECT_EQ(as_bf16[h], bf16_by_value(static_cast<float>(ref_half(h)))) << std::hex << h;
  }
}

// ---- Regions -----------------------------------------------------------------------------------

// A random box inside a random tile of `ndim` dimensions.
Region random_box(Rng& rng, std::size_t ndim, std::size_t elem, void* base) {
  Region r;
  r.base = base;
  r.elem_size = elem;
  for (std::size_t d = 0; d < ndim; ++d) {
    const auto e = rng.between(1, 9);
    auto c = rng.chance(1, 3) ? e : rng.between(1, e);  // whole dimensions are common
    r.extent.push_back(e);
    r.count.push_back(c);
    r.offset.push_back(rng.between(0, e - c));
  }
  return r;
}

// The same counts at a random place in another random tile.
Region box_like(Rng& rng, const Region& like, std::size_t elem, void* base) {
  Region r{base, elem, {}, {}, like.count};
  for (auto c : like.count) {
    const auto e = rng.chance(1, 3) ? c : c + rng.between(0, 5);
    r.extent.push_back(e);
    r.offset.push_back(rng.between(0, e - c));
  }
  return r;
}

std::int64_t elements_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  return n;
}

// Linear index in the tile of the box's k-th element (row-major), by coordinates.
std::int64_t tile_index(const Region& r, std::int64_t k) {
  const auto c = testing::ref_coord(r.count, k);
  std::int64_t at = 0;
  for (std::size_t d = 0; d < c.size(); ++d) at = at * r.extent[d] + r.offset[d] + c[d];
  return at;
}

unsigned ref_convert(unsigned x, DType from, DType to) {
  auto f32_of = [&](unsigned v) {
    if (from == DType::f32) return std::bit_cast<float>(static_cast<std::uint32_t>(v));
    return static_cast<float>(from == DType::bf16 ? ref_bf16(v) : ref_half(v));
  };
  const float f = f32_of(x);
  if (std::isnan(f)) return 0xffffffffu;  // compared by class below
  if (to == DType::f32) return std::bit_cast<std::uint32_t>(f);
  return to == DType::bf16 ? bf16_by_value(f) : half_by_value(f);
}

TEST(CastRegion, StridedBoxesMatchAnElementByElementReference) {
  Rng rng(0x5712);
  const DType pairs[][2] = {{DType::f32, DType::bf16}, {DType::f32, DType::f16},
                            {DType::bf16, DType::f32}, {DType::f16, DType::f32},
                            {DType::bf16, DType::f16}, {DType::f16, DType::bf16}};
  for (int it = 0; it < testing::scaled(600); ++it) {
    const auto [from, to] = pairs[it % 6];
    const std::size_t fs = dtype_size(from), ts = dtype_size(to);
    const auto ndim = static_cast<std::size_t>(rng.between(1, 4));
    Region a = random_box(rng, ndim, fs, nullptr);
    std::vector<std::uint32_t> src(static_cast<std::size_t>(elements_of(a.extent)));
    for (auto& v : src) {
      v = static_cast<std::uint32_t>(rng.next());
      if (fs == 2) v &= 0xffff;
    }
    // Packed in the source's own width.
    std::vector<std::byte> src_bytes(src.size() * fs);
    for (std::size_t i = 0; i < src.size(); ++i) std::memcpy(&src_bytes[i * fs], &src[i], fs);
    a.base = src_bytes.data();
    std::vector<std::byte> dst_bytes;
    Region b = box_like(rng, a, ts, nullptr);
    dst_bytes.assign(static_cast<std::size_t>(elements_of(b.extent)) * ts, std::byte{0xa5});
    b.base = dst_bytes.data();
    const auto before = dst_bytes;
    convert_region(a, from, b, to);
    std::vector<bool> inside(static_cast<std::size_t>(elements_of(b.extent)), false);
    for (std::int64_t k = 0; k < a.elements(); ++k) {
      const auto i = static_cast<std::size_t>(tile_index(a, k));
      const auto o = static_cast<std::size_t>(tile_index(b, k));
      inside[o] = true;
      unsigned got = 0;
      std::memcpy(&got, &dst_bytes[o * ts], ts);
      const unsigned want = ref_convert(src[i], from, to);
      if (want == 0xffffffffu) {
        const bool nan = to == DType::f32    ? std::isnan(std::bit_cast<float>(got))
                         : to == DType::bf16 ? bf16_is_nan(got)
                                             : half_is_nan(got);
        ASSERT_TRUE(nan) << to_string(from) << "->" << to_string(to) << " element " << k;
      } else {
        ASSERT_EQ(got, want) << to_string(from) << "->" << to_string(to) << " element " << k
                             << " input 0x" << std::hex << src[i];
      }
    }
    for (std::size_t o = 0; o < inside.size(); ++o)
      if (!inside[o]) {
        ASSERT_EQ(std::memcmp(&dst_bytes[o * ts], &before[o * ts], ts), 0)
            << "wrote outside the box at " << o;
      }
  }
}

TEST(CastRegion, BoxInsideALargerTileConvertsOnlyTheBox) {
  // A 3-D box [2, 5) x [1, 4) x [3, 11) of a 6 x 5 x 16 f32 tile into the middle of a
  // 4 x 7 x 9 bf16 tile: rows of 8 elements, neither side contiguous.
  std::vector<float> src(6 * 5 * 16);
  for (std::size_t i = 0; i < src.size(); ++i)
    src[i] = 1.0f + static_cast<float>(i) * (1.0f / 1024) + std::ldexp(1.0f, -9);
  std::vector<std::uint16_t> dst(4 * 7 * 9, 0xdead);
  const Region a{src.data(), 4, {6, 5, 16}, {2, 1, 3}, {3, 3, 8}};
  const Region b{dst.data(), 2, {4, 7, 9}, {1, 2, 1}, {3, 3, 8}};
  convert_region(a, DType::f32, b, DType::bf16);
  std::size_t touched = 0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 7; ++j)
      for (int k = 0; k < 9; ++k) {
        const unsigned got = dst[static_cast<std::size_t>((i * 7 + j) * 9 + k)];
        const bool in = i >= 1 && i < 4 && j >= 2 && j < 5 && k >= 1 && k < 9;
        if (!in) {
          EXPECT_EQ(got, 0xdeadu) << i << "," << j << "," << k;
          continue;
        }
        ++touched;
        const float f = src[static_cast<std::size_t>(((i + 1) * 5 + (j - 1)) * 16 + (k + 2))];
        EXPECT_EQ(got, bf16_by_value(f)) << i << "," << j << "," << k;
      }
  EXPECT_EQ(touched, 72u);
}

TEST(CastRegion, SameDTypeCopies) {
  Rng rng(0x1d);
  for (DType t : kAllDTypes) {
    const std::size_t es = dtype_size(t);
    std::vector<std::byte> src(4 * 6 * es), dst(5 * 6 * es, std::byte{7});
    for (auto& b : src) b = static_cast<std::byte>(rng.next());
    const Region a{src.data(), es, {4, 6}, {1, 2}, {2, 3}};
    const Region b{dst.data(), es, {5, 6}, {3, 0}, {2, 3}};
    auto want = dst;
    copy_region(a, Region{want.data(), es, {5, 6}, {3, 0}, {2, 3}});
    convert_region(a, t, b, t);
    EXPECT_EQ(dst, want) << to_string(t);
  }
}

TEST(CastRegion, RefusesOtherPairsAndMismatchedRegions) {
  float f[4] = {};
  double d[4] = {};
  std::int32_t i[4] = {};
  std::uint16_t h[4] = {};
  const Region rf{f, 4, {4}, {0}, {4}}, rd{d, 8, {4}, {0}, {4}}, ri{i, 4, {4}, {0}, {4}},
      rh{h, 2, {4}, {0}, {4}};
  auto field_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const ValidationError& e) {
      return e.field();
    }
    return "(no error)";
  };
  EXPECT_EQ(field_of([&] { convert_region(rf, DType::f32, rd, DType::f64); }), "dtype");
  EXPECT_EQ(field_of([&] { convert_region(rd, DType::f64, rh, DType::bf16); }), "dtype");
  EXPECT_EQ(field_of([&] { convert_region(rf, DType::f32, ri, DType::i32); }), "dtype");
  EXPECT_EQ(field_of([&] { convert_region(ri, DType::i32, rf, DType::f32); }), "dtype");
  try {
    convert_region(rf, DType::f32, rd, DType::f64);
  } catch (const ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot convert f32 to f64"), std::string::npos)
        << e.what();
  }
  // Element sizes that are not the dtypes', and different counts.
  EXPECT_EQ(field_of([&] { convert_region(rf, DType::f32, rf, DType::bf16); }), "region");
  EXPECT_EQ(field_of([&] {
              convert_region(rf, DType::f32, Region{h, 2, {4}, {0}, {3}}, DType::bf16);
            }),
            "region");
  // Nothing to convert is fine.
  EXPECT_EQ(field_of([&] {
              convert_region(Region{f, 4, {4}, {0}, {0}}, DType::f32, Region{h, 2, {4}, {0}, {0}},
                             DType::bf16);
            }),
            "(no error)");
}

}  // namespace
}  // namespace meshcast
