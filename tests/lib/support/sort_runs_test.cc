// detail::sort_runs (lib/support/sort_runs.h) sorts as std::sort does, whatever order the groups
// and their keys come in: one run per group, rotations of a run, a group met twice, duplicates.
#include "lib/support/sort_runs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace meshcast::detail {
namespace {

TEST(SortRuns, SortsAsStdSortForRunsRotationsAndGroupsMetTwice) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const unsigned shift = trial % 2 ? 32 : 41;
    const int groups = 1 + static_cast<int>(rng() % 6), per = 1 + static_cast<int>(rng() % 9);
    std::vector<std::uint64_t> keys;
    for (int g = 0; g < groups; ++g) {
      std::vector<std::uint64_t> run;
      for (int i = 0; i < per; ++i) run.push_back(std::uint64_t(g) << shift | rng() % 64);
      switch (rng() % 3) {  // the run in order, rotated, or shuffled
        case 0:
          std::sort(run.begin(), run.end());
          break;
        case 1:
          std::sort(run.begin(), run.end());
          std::rotate(run.begin(), run.begin() + static_cast<long>(rng() % run.size()), run.end());
          break;
        default:
          std::shuffle(run.begin(), run.end(), rng);
      }
      keys.insert(keys.end(), run.begin(), run.end());
    }
    // Runs in any order of groups; every fourth trial splits a group into two runs
    // apart.
    std::vector<std::vector<std::uint64_t>> runs;
    for (std::size_t b = 0; b < keys.size(); b += static_cast<std::size_t>(per))
      runs.emplace_back(keys.begin() + static_cast<long>(b),
                        keys.begin() + static_cast<long>(b) + per);
    std::shuffle(runs.begin(), runs.end(), rng);
    if (trial % 4 == 0 && runs.size() > 1 && per > 1) {
      runs.push_back({runs[0].back()});  // after another group's run
      runs[0].pop_back();
    }
    keys.clear();
    for (const auto& r : runs) keys.insert(keys.end(), r.begin(), r.end());
    auto expected = keys;
    std::sort(expected.begin(), expected.end());
    sort_runs(keys, shift);
    ASSERT_EQ(keys, expected) << "trial " << trial;
  }
}

TEST(SortRuns, EmptyAndSingle) {
  std::vector<std::uint64_t> keys;
  sort_runs(keys, 32);
  EXPECT_TRUE(keys.empty());
  keys = {5};
  sort_runs(keys, 32);
  EXPECT_EQ(keys, std::vector<std::uint64_t>{5});
}

}  // namespace
}  // namespace meshcast::detail
