// predict(): the planner's schedule model replayed over a finished plan, and the link loads.
#include "meshcast/cost.h"

#include <algorithm>

#include "links.h"
#include "schedule.h"

namespace meshcast {

Prediction predict(const Plan& plan, const Topology& topology, std::int64_t chunk_bytes) {
  detail::check_chunk(chunk_bytes);
  const std::vector<int> devices = plan.devices();
  detail::Schedule s(topology, devices, dtype_size(plan.src().dtype()), chunk_bytes);
  // Phase by phase, in plan order within a phase, as the planner evaluated it.
  std::vector<const Op*> order;
  for (const Op& op : plan.ops()) order.push_back(&op);
  std::stable_sort(order.begin(), order.end(),
                   [](const Op* a, const Op* b) { return a->phase < b->phase; });
  int phase = order.empty() ? 0 : order.front()->phase;
  for (const Op* op : order) {
    for (; phase < op->phase; ++phase) s.next_phase();
    s.place(*op);
  }
  Prediction p;
  p.seconds = s.makespan();
  p.links = detail::Links(topology, devices).loads(plan);
  p.bound_seconds = p.links.empty() ? 0 : p.links.front().seconds;
  return p;
}

}  // namespace meshcast
