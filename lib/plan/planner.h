// What plan() and plan_rank() share. Internal to lib/plan/.
#pragma once

#include <vector>

#include "meshcast/layout.h"
#include "meshcast/plan.h"

namespace meshcast::detail {

// Every device id of either mesh, sorted.
std::vector<int> union_devices(const Layout& src, const Layout& dst);

// Throws ValidationError naming the field of `options` that is out of its range (an enum value
// not among its names, a negative count or bound, a NaN or negative wall-clock cap): `field` is
// where the options came from ("options" for plan() and plan_rank(), "plan" for a sync's
// SyncOptions::plan); chunk_bytes is named "chunk_bytes" alone, as check_chunk() names it.
void check_plan_options(const PlanOptions& options, const std::string& field = "options");

}  // namespace meshcast::detail
