// What plan() and plan_rank() share. Internal to lib/plan/.
#pragma once

#include <vector>

#include "meshcast/layout.h"

namespace meshcast::detail {

// Every device id of either mesh, sorted.
std::vector<int> union_devices(const Layout& src, const Layout& dst);

}  // namespace meshcast::detail
