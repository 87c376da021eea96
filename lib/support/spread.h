// Whether every member of a group passes the same values, and the least and most of each when
// not: each value and its negation all-reduced by max, one small all-reduce. Internal to lib/,
// collectives/, training/ and bench/.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshcast/collectives.h"

namespace meshcast::detail {

struct Spread {
  std::int64_t least, most;
  bool same() const { return least == most; }
};

// Collective over `group`: every member passes as many values (none of them INT64_MIN).
inline std::vector<Spread> spread(const Group& group, std::span<const std::int64_t> values,
                                  const CollectiveOptions& options = {}) {
  const std::size_t n = values.size();
  std::vector<std::int64_t> both(2 * n);
  for (std::size_t i = 0; i < n; ++i) both[i] = values[i], both[n + i] = -values[i];
  all_reduce(group, both.data(), both.data(), static_cast<std::int64_t>(2 * n), DType::i64,
             ReduceOp::Max, options);
  std::vector<Spread> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = {-both[n + i], both[i]};
  return out;
}

}  // namespace meshcast::detail
