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

}  // namespace meshcast::detail
