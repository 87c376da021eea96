// The benchmarks' one smoke switch: MESHCAST_BENCH_SMOKE set and not "0" (the ctest smoke tests
// set it to 1) asks for tiny sizes and short runs. Every bench main reads it here, alike.
#pragma once

#include <cstdlib>
#include <cstring>

namespace meshcast::bench {

inline bool smoke_mode() {
  const char* s = std::getenv("MESHCAST_BENCH_SMOKE");
  return s && *s && std::strcmp(s, "0") != 0;
}

}  // namespace meshcast::bench
