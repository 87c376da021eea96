// reduce_into, the collectives' element kernels, for every dtype: sum and max against a
// straightforward per-element reference on random data (integers of any bits, so that sums
// wrap), hand cases of the new semantics (wraparound, bool as or, complex componentwise), and
// max over complex numbers refused naming "op".
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "meshcast/collectives.h"
#include "meshcast/error.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::Rng;
using Bytes = std::vector<std::byte>;

template <class T>
T get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void put(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// Integers: the mathematical result reduced modulo 2^bits, read back in T (two's complement).
template <class T>
T wrap_sum(T a, T b) {
  const std::uint64_t s = static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b);
  return static_cast<T>(s);  // modulo 2^bits since C++20
}

// c := b op a for one element, written per dtype without the library's kernels.
void reference(DType t, ReduceOp op, const std::byte* a, const std::byte* b, std::byte* c) {
  const bool sum = op == ReduceOp::Sum;
  auto num = [&](auto zero, std::size_t at = 0) {
    using T = decltype(zero);
    const T x = get<T>(a + at), y = get<T>(b + at);
    if constexpr (std::is_integral_v<T>)
      put<T>(c + at, sum ? wrap_sum(y, x) : std::max(y, x));
    else
      put<T>(c + at, sum ? static_cast<T>(y + x) : std::max(y, x));
  };
  auto half = [&](float (*to_f)(unsigned short), unsigned short (*from_f)(float)) {
    const float x = to_f(get<unsigned short>(a)), y = to_f(get<unsigned short>(b));
    put(c, from_f(sum ? y + x : std::max(y, x)));
  };
  switch (t) {
    case DType::f16:
      return half(half_to_float, float_to_half);
    case DType::bf16:
      return half(bf16_to_float, float_to_bf16);
    case DType::f32:
      return num(float{});
    case DType::f64:
      return num(double{});
    case DType::i8:
      return num(std::int8_t{});
    case DType::i16:
      return num(std::int16_t{});
    case DType::i32:
      return num(std::int32_t{});
    case DType::i64:
      return num(std::int64_t{});
    case DType::u8:
      return num(std::uint8_t{});
    case DType::u16:
      return num(std::uint16_t{});
    case DType::u32:
      return num(std::uint32_t{});
    case DType::u64:
      return num(std::uint64_t{});
    case DType::b8:  // sum and max are both or
      return put<std::uint8_t>(c, get<std::uint8_t>(a) || get<std::uint8_t>(b));
    case DType::c64:  // real and imaginary parts summed apart
      num(float{}, 0);
      return num(float{}, 4);
    case DType::c128:
      num(double{}, 0);
      return num(double{}, 8);
  }
}

// Random elements: any bits for integers (so that sums wrap), non-NaN floats (max of NaN is
// beside the point here), 0 or 1 for bool.
void random_element(Rng& rng, DType t, std::byte* p) {
  switch (t) {
    case DType::f16:
      return put(p, float_to_half(static_cast<float>(rng.between(-2000, 2000)) / 64.0f));
    case DType::bf16:
      return put(p, float_to_bf16(static_cast<float>(rng.between(-2000, 2000)) / 64.0f));
    case DType::f32:
    case DType::c64:
      for (std::size_t at = 0; at < dtype_size(t); at += 4)
        put(p + at, static_cast<float>(rng.between(-1000000, 1000000)) / 64.0f);
      return;
    case DType::f64:
    case DType::c128:
      for (std::size_t at = 0; at < dtype_size(t); at += 8)
        put(p + at, static_cast<double>(rng.between(-1000000000, 1000000000)) / 3.0);
      return;
    case DType::b8:
      return put<std::uint8_t>(p, rng.next() & 1);
    default: {  // integers: any bits (little-endian: the low bytes)
      const std::uint64_t bits = rng.next();
      std::memcpy(p, &bits, dtype_size(t));
    }
  }
}

bool defined(DType t, ReduceOp op) { return op == ReduceOp::Sum || !is_complex(t); }

TEST(ReduceInto, MatchesTheReferenceForEveryDtypeAndOp) {
  Rng rng(0x5e0d);
  for (DType t : kAllDTypes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      if (!defined(t, op)) continue;
      SCOPED_TRACE(to_string(t) + " " + to_string(op));
      const std::size_t elem = dtype_size(t);
      for (int round = 0; round < testing::scaled(20); ++round) {
        const auto n = static_cast<std::int64_t>(rng.below(300));
        Bytes a(static_cast<std::size_t>(n) * elem), b(a.size());
        for (std::size_t k = 0; k < a.size(); k += elem) {
          random_element(rng, t, a.data() + k);
          random_element(rng, t, b.data() + k);
        }
        Bytes want(a.size());
        for (std::size_t k = 0; k < a.size(); k += elem)
          reference(t, op, a.data() + k, b.data() + k, want.data() + k);
        Bytes to(a.size(), std::byte{0x5a});
        reduce_into(a.data(), b.data(), to.data(), n, t, op);
        ASSERT_EQ(to, want) << n << " elements, separate output";
        reduce_into(a.data(), b.data(), n, t, op);  // in place: b := b op a
        ASSERT_EQ(b, want) << n << " elements, in place";
      }
    }
}

// One element each: c = b op a, compared as T.
template <class T>
T one(DType t, ReduceOp op, T a, T b) {
  T c{};
  reduce_into(&a, &b, &c, 1, t, op);
  return c;
}

TEST(ReduceInto, IntegerSumsWrapAndMaxesCompareByValue) {
  const auto sum = ReduceOp::Sum, max = ReduceOp::Max;
  EXPECT_EQ(one<std::uint8_t>(DType::u8, sum, 200, 100), 44);
  EXPECT_EQ(one<std::uint8_t>(DType::u8, max, 200, 100), 200) << "unsigned, not as i8";
  EXPECT_EQ(one<std::int8_t>(DType::i8, sum, 127, 1), -128);
  EXPECT_EQ(one<std::int16_t>(DType::i16, sum, 32767, 1), -32768);
  EXPECT_EQ(one<std::int16_t>(DType::i16, sum, -32768, -1), 32767);
  EXPECT_EQ(one<std::int16_t>(DType::i16, max, -5, -300), -5);
  EXPECT_EQ(one<std::uint16_t>(DType::u16, sum, 65535, 65535), 65534);
  EXPECT_EQ(one<std::uint16_t>(DType::u16, max, 40000, 3), 40000);
  EXPECT_EQ(one<std::int32_t>(DType::i32, sum, std::numeric_limits<std::int32_t>::max(), 1),
            std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(one<std::uint32_t>(DType::u32, sum, 4294967295u, 2), 1u);
  EXPECT_EQ(one<std::uint32_t>(DType::u32, max, 4294967295u, 2), 4294967295u);
  EXPECT_EQ(one<std::int64_t>(DType::i64, sum, std::numeric_limits<std::int64_t>::min(), -1),
            std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(one<std::uint64_t>(DType::u64, sum, ~std::uint64_t{0}, 2), 1u);
  EXPECT_EQ(one<std::uint64_t>(DType::u64, max, ~std::uint64_t{0}, 2), ~std::uint64_t{0});
}

TEST(ReduceInto, BoolSumAndMaxAreOr) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
    const std::uint8_t a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1};
    std::uint8_t c[4] = {9, 9, 9, 9};
    reduce_into(a, b, c, 4, DType::b8, op);
    EXPECT_EQ(c[0], 0) << to_string(op);
    EXPECT_EQ(c[1], 1) << to_string(op);
    EXPECT_EQ(c[2], 1) << to_string(op);
    EXPECT_EQ(c[3], 1) << to_string(op) << ": 1 + 1 stays true, not 2";
  }
}

TEST(ReduceInto, ComplexSumsAddTheParts) {
  const float a[4] = {1, 2, 0.5f, -8}, b[4] = {3, -5, 0.25f, 8};
  float c[4] = {};
  reduce_into(a, b, c, 2, DType::c64, ReduceOp::Sum);
  EXPECT_EQ(c[0], 4);
  EXPECT_EQ(c[1], -3);
  EXPECT_EQ(c[2], 0.75f);
  EXPECT_EQ(c[3], 0);
  const double x[2] = {1e300, -1}, y[2] = {1e300, 1};
  double z[2] = {};
  reduce_into(x, y, z, 1, DType::c128, ReduceOp::Sum);
  EXPECT_EQ(z[0], 2e300);
  EXPECT_EQ(z[1], 0);
}

TEST(ReduceInto, MaxOfComplexIsRefusedNamingTheOp) {
  double buf[4] = {};
  for (DType t : {DType::c64, DType::c128}) {
    try {
      reduce_into(buf, buf, 1, t, ReduceOp::Max);
      ADD_FAILURE() << to_string(t) << ": max accepted";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "op");
      EXPECT_NE(std::string(e.what()).find("max is not defined for " + to_string(t)),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace meshcast
