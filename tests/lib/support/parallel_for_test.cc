// detail::parallel_for (lib/support/parallel_for.h): every index once, on several threads; an
// exception rethrown once every call in flight has ended.
#include "lib/support/parallel_for.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

namespace meshcast::detail {
namespace {

TEST(ParallelFor, EveryIndexOnce) {
  for (std::size_t n : {0u, 1u, 7u, 1000u}) {
    std::vector<std::atomic<int>> runs(n);
    parallel_for(n, [&](std::size_t i) { ++runs[i]; });
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_EQ(runs[i].load(), 1) << "index " << i << " of " << n;
  }
}

TEST(ParallelFor, AnExceptionEndsItAfterEveryCallInFlight) {
  constexpr std::size_t n = 10000;
  std::atomic<int> in_flight{0};
  try {
    parallel_for(n, [&](std::size_t i) {
      ++in_flight;
      if (i == 3) {
        --in_flight;
        throw std::runtime_error("index 3");
      }
      std::this_thread::yield();  // the others' calls in flight meanwhile
      --in_flight;
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "index 3");
  }
  EXPECT_EQ(in_flight.load(), 0) << "a call still ran after parallel_for returned";
}

}  // namespace
}  // namespace meshcast::detail
