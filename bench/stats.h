// The bench programs' one median: of a run's iterations, or of a row's repetitions (0 of none;
// the mean of the two middle values of an even count).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace meshcast::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace meshcast::bench
