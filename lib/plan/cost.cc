// predict(): the planner's schedule model replayed over a finished plan, and the link loads.
#include "meshcast/cost.h"

#include <algorithm>

#include "link_timeline.h"
#include "links.h"

namespace meshcast {

Prediction predict(const Plan& plan, const Topology& topology, std::int64_t chunk_bytes) {
  detail::check_chunk(chunk_bytes);
  const detail::Links links(topology, plan.devices());
  Prediction p;
  p.seconds = links.analytic_seconds(
      plan.ops(), static_cast<std::int64_t>(dtype_size(plan.src().dtype())), chunk_bytes);
  p.links = links.loads(plan);
  p.bound_seconds = p.links.empty() ? 0 : p.links.front().seconds;
  return p;
}

}  // namespace meshcast
