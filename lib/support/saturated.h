// A double estimate (bytes, flops, ops) as an int64 for the limit checks and messages: past
// 2^63 - 1, or NaN, it is the largest int64, so it is refused rather than cast to a wrong value
// (a cast out of range is undefined). Internal to lib/ and the tools.
#pragma once

#include <cstdint>
#include <limits>

namespace meshcast::detail {

inline std::int64_t saturated_int64(double v) {
  if (!(v < 0x1p63)) return std::numeric_limits<std::int64_t>::max();
  return v < -0x1p63 ? std::numeric_limits<std::int64_t>::min() : static_cast<std::int64_t>(v);
}

// sum += a * b, false (sum unchanged) where the result would pass 2^63 - 1: counts that large
// (bytes a whole sync moves over thousands of devices) are refused, not wrapped.
inline bool add_product(std::int64_t& sum, std::int64_t a, std::int64_t b) {
  std::int64_t product = 0, total = 0;
  if (__builtin_mul_overflow(a, b, &product) || __builtin_add_overflow(sum, product, &total))
    return false;
  sum = total;
  return true;
}

}  // namespace meshcast::detail
