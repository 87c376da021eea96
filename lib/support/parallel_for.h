// parallel_for(n, f): f(0) .. f(n - 1) on up to one thread per core, the first exception
// rethrown once all have ended (the others' are dropped). For work a LocalWorld's devices would
// otherwise do inside its run, where a long one is taken for a stall (see run_local). Internal.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace meshcast::detail {

template <class F>
void parallel_for(std::size_t n, F&& f) {
  std::atomic<std::size_t> next{0};
  std::exception_ptr first;
  std::mutex m;
  const auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        f(i);
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
        next = n;  // the rest is not started
      }
    }
  };
  const std::size_t helpers =
      std::min<std::size_t>(n, std::max(1u, std::thread::hardware_concurrency())) - (n > 0);
  std::vector<std::thread> threads;
  try {
    for (std::size_t t = 0; t < helpers; ++t) threads.emplace_back(work);
  } catch (...) {  // fewer threads: the ones started and this one do it all
  }
  work();
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace meshcast::detail
