// Testing aids, for users' tests and benchmarks as for meshcast's own: exactly predictable data,
// so that a reshard can be checked element by element, and a timed run of a plan on threads.
#pragma once

#include <cstdint>
#include <vector>

#include "meshcast/layout.h"
#include "meshcast/plan.h"

namespace meshcast {

// The value of global row-major element i: a small integer, exact in every dtype, not periodic
// (docs/design.md, "Test data": a box delivered to another place shows, but by chance, in every
// dtype). bool holds 0 or 1; a complex element holds (value, -value).
std::int64_t test_value(std::int64_t i, DType dtype);
// Fills a device's source tile: element i holds test_value(i); a partial source holds addends
// that sum to it exactly (small integers, so any summation order is exact; unsigned addends may
// wrap below zero, and their sum wraps back; bool addends are 0 or 1 and sum by or). Of a float
// type, the addends after the 66th (bf16), 1,028th (f16) or 777,160th (f32, c64) hold 0, so that
// every partial sum stays exact.
void fill_source(const Layout& src, int device, void* local);
// Destination elements of `device` that differ from the expected value (0 for addends other
// than the first of a partial target).
std::int64_t count_mismatches(const Layout& dst, int device, const void* local);

// Runs a plan on a LocalWorld (meshcast/local.h) `iters` times after one warm-up run, source
// tiles filled by fill_source. Returns each iteration's seconds and, when `verify`, the
// mismatches of the last run summed over devices.
struct LocalRun {
  std::vector<double> seconds;
  std::int64_t mismatches = 0;
};
LocalRun run_local(const Plan& plan, int iters, bool verify);

}  // namespace meshcast
