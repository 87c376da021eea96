// dtype names and sizes; the half-precision conversions against the tests' own decoding and a
// brute-force round-to-nearest-even.
#include "meshcast/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "meshcast/error.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;

TEST(DType, NamesRoundTrip) {
  // Every numeric numpy dtype, in kAllDTypes' order; "bool" is numpy's name.
  const char* names[] = {"f16", "bf16", "f32", "f64", "i8",   "i16", "i32", "i64",
                         "u8",  "u16",  "u32", "u64", "bool", "c64", "c128"};
  ASSERT_EQ(std::size(kAllDTypes), std::size(names));
  std::size_t i = 0;
  for (DType t : kAllDTypes) {
    EXPECT_EQ(to_string(t), names[i]);
    EXPECT_EQ(parse_dtype(names[i]), t);
    EXPECT_EQ(parse_dtype(to_string(t)), t);
    ++i;
  }
}

TEST(DType, Sizes) {
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::i8), 1u);
  EXPECT_EQ(dtype_size(DType::i16), 2u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_EQ(dtype_size(DType::u16), 2u);
  EXPECT_EQ(dtype_size(DType::u32), 4u);
  EXPECT_EQ(dtype_size(DType::u64), 8u);
  EXPECT_EQ(dtype_size(DType::b8), 1u);
  EXPECT_EQ(dtype_size(DType::c64), 8u);
  EXPECT_EQ(dtype_size(DType::c128), 16u);
}

TEST(DType, OnlyTheComplexTypesAreComplex) {
  for (DType t : kAllDTypes)
    EXPECT_EQ(is_complex(t), t == DType::c64 || t == DType::c128) << to_string(t);
}

TEST(DType, UnknownNamesThrowParseErrorNamingTheField) {
  for (const char* bad :
       {"", "f8", "F32", "float", "f32 ", "i128", "bf16x", "b8", "Bool", "BOOL", "u8 ", "c32"}) {
    try {
      parse_dtype(bad, "src.dtype");
      ADD_FAILURE() << "'" << bad << "' parsed";
    } catch (const ParseError& e) {
      EXPECT_EQ(e.field(), "src.dtype") << bad;
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << bad;
    }
  }
}

using testing::bf16_is_nan;
using testing::half_is_nan;
using testing::ref_bf16;
using testing::ref_half;

TEST(Half, DecodesEveryPattern) {
  for (unsigned h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(static_cast<unsigned short>(h));
    if (half_is_nan(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), ref_half(h)) << std::hex << h;
    EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
  }
}

TEST(Half, RoundTripsEveryNonNanPattern) {
  for (unsigned h = 0; h < 0x10000; ++h) {
    if (half_is_nan(h)) {
      EXPECT_TRUE(half_is_nan(float_to_half(half_to_float(static_cast<unsigned short>(h)))))
          << std::hex << h;
      continue;
    }
    EXPECT_EQ(float_to_half(half_to_float(static_cast<unsigned short>(h))), h) << std::hex << h;
  }
}

TEST(Half, RoundsToNearestEven) {
  struct Case {
    float f;
    unsigned short h;
  };
  const Case cases[] = {
      {1.0f, 0x3c00},
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},      // halfway 1 and 1+2^-10: even (1)
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02},  // halfway 1+2^-10 and 1+2^-9: even
      {1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20), 0x3c01},  // above halfway
      {-2.0f, 0xc000},
      {65504.0f, 0x7bff},
      {65519.0f, 0x7bff},
      {65520.0f, 0x7c00},  // halfway to 2^16: rounds to even, i.e. overflows to inf
      {1e9f, 0x7c00},
      {-1e9f, 0xfc00},
      {std::ldexp(1.0f, -24), 0x0001},  // smallest subnormal
      {std::ldexp(1.0f, -25), 0x0000},  // halfway 0 and 2^-24: even (0)
      {std::ldexp(1.5f, -24), 0x0002},  // halfway 1 and 2 ulps: even (2)
      {std::ldexp(3.0f, -25), 0x0002},  // 1.5 ulp
      {std::ldexp(1.0f, -26), 0x0000},
      {std::ldexp(1023.5f, -24), 0x0400},  // halfway largest subnormal / smallest normal
      {std::ldexp(1.0f, -14), 0x0400},     // smallest normal
      {-0.0f, 0x8000},
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {2049.0f, 0x6800},  // halfway 2048 and 2050: even (2048)
      {2051.0f, 0x6802},  // halfway 2050 and 2052: even (2052)
  };
  for (const auto& c : cases) EXPECT_EQ(float_to_half(c.f), c.h) << c.f;
  EXPECT_TRUE(half_is_nan(float_to_half(std::numeric_limits<float>::quiet_NaN())));
}

// Nearest representable value, ties to the even pattern, by search over the sorted patterns.
template <class Decode>
unsigned short ref_round(float f, Decode decode, unsigned inf_pattern) {
  const double x = std::fabs(static_cast<double>(f));
  const unsigned sign = std::signbit(f) ? 0x8000 : 0;
  // Positive finite patterns are sorted by value: binary search the first >= x.
  unsigned lo = 0, hi = inf_pattern;  // decode(inf_pattern) is +inf
  while (lo < hi) {
    const unsigned mid = (lo + hi) / 2;
    if (decode(mid) < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return static_cast<unsigned short>(sign);
  unsigned best;
  if (lo == inf_pattern) {
    // Beyond the largest finite: inf when x >= max + ulp/2 (the next binade's first value).
    const double max = decode(inf_pattern - 1), ulp = max - decode(inf_pattern - 2);
    best = x >= max + ulp / 2 ? inf_pattern : inf_pattern - 1;
  } else {
    const double up = decode(lo), down = decode(lo - 1);
    if (up - x < x - down)
      best = lo;
    else if (x - down < up - x)
      best = lo - 1;
    else
      best = (lo % 2 == 0) ? lo : lo - 1;
  }
  return static_cast<unsigned short>(sign | best);
}

TEST(Half, RandomFloatsRoundToNearestEven) {
  Rng rng(0x4a1f);
  for (int i = 0; i < testing::scaled(200000); ++i) {
    // Floats near the half range: random exponent in [-30, 17], random mantissa and sign.
    const auto bits =
        static_cast<std::uint32_t>(((rng.between(97, 144)) << 23) | (rng.next() & 0x7fffff) |
                                   (rng.chance(1, 2) ? 0x80000000u : 0));
    const float f = std::bit_cast<float>(bits);
    ASSERT_EQ(float_to_half(f), ref_round(f, ref_half, 0x7c00))
        << f << " bits " << std::hex << bits;
  }
}

TEST(BFloat16, DecodesAndRoundTripsEveryNonNanPattern) {
  for (unsigned h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_float(static_cast<unsigned short>(h));
    if (bf16_is_nan(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(bf16_is_nan(float_to_bf16(f))) << std::hex << h;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), ref_bf16(h)) << std::hex << h;
    EXPECT_EQ(float_to_bf16(f), h) << std::hex << h;
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  struct Case {
    float f;
    unsigned short h;
  };
  const Case cases[] = {
      {1.0f, 0x3f80},
      {1.0f + std::ldexp(1.0f, -8), 0x3f80},      // halfway: even
      {1.0f + 3 * std::ldexp(1.0f, -8), 0x3f82},  // halfway: even (up)
      {1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20), 0x3f81},
      {257.0f, 0x4380},  // 256..258 halfway: 256
      {259.0f, 0x4382},  // 258..260 halfway: 260
      {-3.0f, 0xc040},
      {std::numeric_limits<float>::max(), 0x7f80},  // above the halfway point to 2^128: inf
      {std::numeric_limits<float>::infinity(), 0x7f80},
      {-0.0f, 0x8000},
  };
  for (const auto& c : cases) EXPECT_EQ(float_to_bf16(c.f), c.h) << c.f;
  EXPECT_TRUE(bf16_is_nan(float_to_bf16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(BFloat16, RandomFloatsRoundToNearestEven) {
  Rng rng(0xbf16);
  for (int i = 0; i < testing::scaled(200000); ++i) {
    const auto bits = static_cast<std::uint32_t>(rng.next() & 0xffffffffu);
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(float_to_bf16(f), ref_round(f, ref_bf16, 0x7f80))
        << f << " bits " << std::hex << bits;
  }
}

}  // namespace
}  // namespace meshcast
