// predict(): the analytic model over a finished plan, and the link loads; the cost model's
// primitives for transfers priced without a plan.
#include "meshcast/cost.h"

#include <algorithm>

#include "lib/plan/plan_check.h"
#include "link_timeline.h"
#include "links.h"

namespace meshcast {

Prediction predict(const Plan& plan, const Topology& topology, std::int64_t chunk_bytes) {
  detail::check_chunk(chunk_bytes);
  detail::check_plan_ops(plan);  // its phases and boxes index the link timeline
  const detail::Links links(topology, plan.devices());
  Prediction p;
  p.seconds = links.analytic_seconds(
      plan.ops(), static_cast<std::int64_t>(dtype_size(plan.src().dtype())), chunk_bytes);
  p.links = links.loads(plan, chunk_bytes);
  p.bound_seconds = p.links.empty() ? 0 : p.links.front().seconds;
  return p;
}

double chain_seconds(std::int64_t bytes, int net_hops, int intra_hops, const Topology& topology,
                     std::int64_t chunk) {
  detail::check_chunk(chunk);
  return detail::chain_time(bytes, net_hops, intra_hops, topology, chunk).total();
}

double round_seconds(double bytes, std::int64_t messages, std::int64_t per_nic,
                     const Topology& topology) {
  const auto k = static_cast<double>(messages);
  if (per_nic == 0)
    return topology.intra().latency + k * detail::stage_time(bytes, false, topology);
  const LinkClass& net = topology.network();
  return net.latency + std::max(k * (net.overhead + bytes / topology.intra().bandwidth),
                                static_cast<double>(per_nic) * bytes / topology.nic_bandwidth());
}

}  // namespace meshcast
