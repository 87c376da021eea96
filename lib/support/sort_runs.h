// Sorts keys whose high bits name a group (a host) and which mostly come group by group: a
// multicast chain enters host after host, each host's devices in a rotation of their order
// (rotate_chain). The runs are put in order of group and each is sorted alone, a rotation by a
// rotate; a group met in two runs falls back to one sort of all. Half of a device's planning of
// 1,000 all-gathers over 128 devices went to sorting chains whole. Internal to lib/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshcast::detail {

// Ascending `keys`, grouped by key >> shift.
inline void sort_runs(std::vector<std::uint64_t>& keys, unsigned shift) {
  struct Run {
    std::uint64_t group;
    std::size_t begin, end;  // [begin, end) in keys
  };
  thread_local std::vector<Run> runs;  // scratch: a plan sorts a chain per task
  thread_local std::vector<std::uint64_t> sorted;
  runs.clear();
  for (std::size_t b = 0, e; b < keys.size(); b = e) {
    for (e = b + 1; e < keys.size() && keys[e] >> shift == keys[b] >> shift;) ++e;
    runs.push_back({keys[b] >> shift, b, e});
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.group < b.group; });
  for (std::size_t r = 1; r < runs.size(); ++r)
    if (runs[r].group == runs[r - 1].group) {
      std::sort(keys.begin(), keys.end());
      return;
    }
  sorted.clear();
  for (const Run& run : runs) {
    const auto at = static_cast<std::ptrdiff_t>(sorted.size());
    sorted.insert(sorted.end(), keys.begin() + static_cast<std::ptrdiff_t>(run.begin),
                  keys.begin() + static_cast<std::ptrdiff_t>(run.end));
    const auto b = sorted.begin() + at, cut = std::is_sorted_until(b, sorted.end());
    if (cut == sorted.end()) continue;
    if (std::is_sorted(cut, sorted.end()) && sorted.back() < *b)
      std::rotate(b, cut, sorted.end());
    else
      std::sort(b, sorted.end());
  }
  keys.swap(sorted);
}

}  // namespace meshcast::detail
