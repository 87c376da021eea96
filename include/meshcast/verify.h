// Exactly predictable test data, so that a reshard can be checked element by element.
#pragma once

#include <cstdint>

#include "meshcast/layout.h"

namespace meshcast {

// The value of global row-major element i: a small integer, exact in every dtype. bool holds 0
// or 1; a complex element holds (value, -value).
std::int64_t test_value(std::int64_t i, DType dtype);
// Fills a device's source tile: element i holds test_value(i); a partial source holds addends
// that sum to it exactly (small integers, so any summation order is exact; unsigned addends may
// wrap below zero, and their sum wraps back; bool addends are 0 or 1 and sum by or).
void fill_source(const Layout& src, int device, void* local);
// Destination elements of `device` that differ from the expected value (0 for addends other
// than the first of a partial target).
std::int64_t count_mismatches(const Layout& dst, int device, const void* local);

}  // namespace meshcast
