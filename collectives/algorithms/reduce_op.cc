// The reduction operators of the collectives, per element type.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "lib/support/text.h"
#include "meshcast/collectives.h"
#include "meshcast/error.h"

namespace meshcast {
namespace {

// max for floats, the same bits whichever operand comes first, since members combine the same
// values in different orders (recursive doubling's partners compute a ∘ b and b ∘ a): a NaN
// wins (numpy's maximum; std::max kept the first operand, so members disagreed), of two NaNs
// the one of larger bits, and +0 over -0.
template <class T>
T float_max(T x, T y) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  if (x != x || y != y) {
    if (x == x) return y;
    if (y == y) return x;
    return std::bit_cast<Bits>(x) > std::bit_cast<Bits>(y) ? x : y;
  }
  if (x == y) return std::signbit(x) ? y : x;
  return x > y ? x : y;
}

// The sum, the same bits whichever operand comes first: of two NaNs the hardware keeps the
// first operand's (x86), so members that added them in different orders disagreed. A NaN sum is
// the one quiet NaN (numpy promises no payload either): a compare and a blend, which vectorize
// (choosing between two NaNs by their bits ran 3.5x slower on an in-cache vector).
template <class T>
T float_sum(T x, T y) {
  const T s = x + y;
  return s != s ? std::numeric_limits<T>::quiet_NaN() : s;
}

template <class T>
void combine(const void* from, const void* base, void* to, std::int64_t n, ReduceOp op) {
  const T* a = static_cast<const T*>(from);
  const T* b = static_cast<const T*>(base);
  T* c = static_cast<T*>(to);
  if constexpr (std::is_floating_point_v<T>) {
    if (op == ReduceOp::Sum)
      for (std::int64_t i = 0; i < n; ++i) c[i] = float_sum(b[i], a[i]);
    else
      for (std::int64_t i = 0; i < n; ++i) c[i] = float_max(b[i], a[i]);
  } else
    for (std::int64_t i = 0; i < n; ++i) c[i] = std::max(b[i], a[i]);
}

// Integers: the sum wraps modulo 2^bits as numpy's does; computed in the unsigned type of the
// same width, since signed overflow is undefined behaviour.
template <class T>
void combine_int(const void* from, const void* base, void* to, std::int64_t n, ReduceOp op) {
  using U = std::make_unsigned_t<T>;
  if (op == ReduceOp::Max) return combine<T>(from, base, to, n, op);
  const T* a = static_cast<const T*>(from);
  const T* b = static_cast<const T*>(base);
  T* c = static_cast<T*>(to);
  for (std::int64_t i = 0; i < n; ++i)
    c[i] = static_cast<T>(static_cast<U>(static_cast<U>(b[i]) + static_cast<U>(a[i])));
}

// bool: sum and max are both logical or (numpy's add on bool), giving 0 or 1.
void combine_bool(const void* from, const void* base, void* to, std::int64_t n) {
  const auto* a = static_cast<const std::uint8_t*>(from);
  const auto* b = static_cast<const std::uint8_t*>(base);
  auto* c = static_cast<std::uint8_t*>(to);
  for (std::int64_t i = 0; i < n; ++i) c[i] = (b[i] | a[i]) != 0;
}

// Half types: each pair combined in float, rounded once.
template <float (*ToFloat)(unsigned short), unsigned short (*FromFloat)(float)>
void combine_half(const void* from, const void* base, void* to, std::int64_t n, ReduceOp op) {
  const auto* a = static_cast<const unsigned short*>(from);
  const auto* b = static_cast<const unsigned short*>(base);
  auto* c = static_cast<unsigned short*>(to);
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = ToFloat(a[i]), y = ToFloat(b[i]);
    c[i] = FromFloat(op == ReduceOp::Sum ? float_sum(y, x) : float_max(y, x));
  }
}

}  // namespace

void reduce_into(const void* from, const void* base, void* to, std::int64_t count, DType dtype,
                 ReduceOp op) {
  if (op == ReduceOp::Max && is_complex(dtype))
    throw ValidationError(
        "op", "max is not defined for " + to_string(dtype) + " (complex numbers have no order)");
  switch (dtype) {
    case DType::f16:
      return combine_half<half_to_float, float_to_half>(from, base, to, count, op);
    case DType::bf16:
      return combine_half<bf16_to_float, float_to_bf16>(from, base, to, count, op);
    case DType::f32:
      return combine<float>(from, base, to, count, op);
    case DType::f64:
      return combine<double>(from, base, to, count, op);
    case DType::i8:
      return combine_int<std::int8_t>(from, base, to, count, op);
    case DType::i16:
      return combine_int<std::int16_t>(from, base, to, count, op);
    case DType::i32:
      return combine_int<std::int32_t>(from, base, to, count, op);
    case DType::i64:
      return combine_int<std::int64_t>(from, base, to, count, op);
    case DType::u8:
      return combine_int<std::uint8_t>(from, base, to, count, op);
    case DType::u16:
      return combine_int<std::uint16_t>(from, base, to, count, op);
    case DType::u32:
      return combine_int<std::uint32_t>(from, base, to, count, op);
    case DType::u64:
      return combine_int<std::uint64_t>(from, base, to, count, op);
    case DType::b8:
      return combine_bool(from, base, to, count);
    case DType::c64:  // componentwise: the real and imaginary parts are summed as floats
      return combine<float>(from, base, to, 2 * count, op);
    case DType::c128:
      return combine<double>(from, base, to, 2 * count, op);
  }
}

void reduce_into(const void* from, void* to, std::int64_t count, DType dtype, ReduceOp op) {
  reduce_into(from, to, to, count, dtype, op);
}

std::string to_string(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

ReduceOp parse_reduce_op(std::string_view text, const std::string& field) {
  if (text == "sum") return ReduceOp::Sum;
  if (text == "max") return ReduceOp::Max;
  throw ParseError(field, "unknown reduction " + detail::quote(text) + " (expected sum or max)");
}

std::string to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Auto:
      return "auto";
    case Algorithm::Ring:
      return "ring";
    case Algorithm::RecursiveDoubling:
      return "recursive-doubling";
    case Algorithm::HalvingDoubling:
      return "halving-doubling";
    case Algorithm::Hierarchical:
      return "hierarchical";
    case Algorithm::SharedMemory:
      return "shared-memory";
  }
  return "?";
}

Algorithm parse_algorithm(std::string_view text, const std::string& field) {
  for (Algorithm a : {Algorithm::Auto, Algorithm::Ring, Algorithm::RecursiveDoubling,
                      Algorithm::HalvingDoubling, Algorithm::Hierarchical, Algorithm::SharedMemory})
    if (text == to_string(a)) return a;
  throw ParseError(
      field, "unknown algorithm " + detail::quote(text) +
                 " (expected auto, ring, recursive-doubling, halving-doubling, hierarchical or "
                 "shared-memory)");
}

}  // namespace meshcast
