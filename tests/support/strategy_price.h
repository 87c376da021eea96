// A strategy's price for a move as the planner computes it (lib/plan/strategy_price.h), with
// the timeline and links built from the move's devices: for tests of lib/plan and lib/sync.
#pragma once

#include <cstdint>

#include "lib/plan/link_timeline.h"
#include "lib/plan/links.h"
#include "lib/plan/planner.h"
#include "lib/plan/strategy_price.h"
#include "meshcast/plan.h"
#include "meshcast/task.h"

namespace meshcast::testing {

inline double strategy_price(const Layout& src, const Layout& dst, const Topology& topo,
                             Strategy st, Balance rule, std::int64_t chunk,
                             bool* fans_out = nullptr, bool fork = true) {
  const TaskGrid grid(src, dst);
  const detail::LinkTimeline s(topo, detail::union_devices(src, dst), dtype_size(src.dtype()),
                               chunk);
  const detail::Links links(topo, s.devices());
  return detail::strategy_price(grid, s, links, st, rule, chunk, fans_out, fork);
}

}  // namespace meshcast::testing
