// What a plan will take to build and hold, known from the two layouts before planning: plan()
// checks it against limits() so that a request too large for the machine is refused at once
// instead of after minutes and gigabytes.
#pragma once

#include <cstdint>

#include "meshcast/layout.h"
#include "meshcast/plan.h"
#include "meshcast/topology.h"

namespace meshcast {

// Upper bounds (doubles: they may exceed any integer type).
struct PlanSize {
  double boxes = 0;                    // pieces of the tensor the move splits into (tasks)
  double ops = 0;                      // operations of the plan
  double peers = 0;                    // entries of their peer lists (receivers, contributors)
  double bytes = 0;                    // the planner's working memory
  double transient = 0;                // of bytes: what only planning holds (per device, process)
  Strategy strategy = Strategy::Auto;  // the one estimated (for Auto: the smallest)
  Balance balance = Balance::Search;
};

// For one strategy and balance. Boxes: the product over dimensions of the distinct pieces that
// both layouts' cuts make; per box, its receivers (the destination's replicas), the holders of
// each addend of the source, the copies (holders that are destinations): the ops (a reduce per
// box of a partial source, copies, one chain per box for broadcast, a send per receiver for
// sendrecv, two for allgather) and their peer lists (allgather's: receivers^2 per box). Greedy
// and search keep each addend's holders once per box, as the candidate senders its transfers
// share (a view per transfer), search a copy of every op. Bytes per op and per device are
// calibrated upper bounds of the peak resident memory of `meshcast plan` (docs/design.md).
// Auto: the smallest over the three strategies, each under `balance` or Local (plan() builds
// with Local a strategy that fits only so).
PlanSize estimate_plan_size(const Layout& src, const Layout& dst, Strategy strategy,
                            Balance balance = Balance::Search);

// The largest part of that plan any one device computes alone (plan_rank(), a device's part of
// a sync), under Local (or None): the tasks meeting one tile of each layout (the most any tile
// meets), and per task the ops the device takes part in and their peer lists (a chain lists
// every receiver; allgather's receivers each take part in every receiver's forward). plan_rank()
// checks it before any op is built where the whole plan would not fit: a broadcast to n
// receivers of n boxes lists n^2 peers at every device, where sendrecv's part is 2n ops. Auto:
// the smallest over the three strategies.
PlanSize estimate_part_size(const Layout& src, const Layout& dst, Strategy strategy,
                            Balance balance = Balance::Local);

// What the planner holds per host the move's devices span on `topology` (each NIC's link loads,
// each host's devices, in the schedule and the cost model), which the estimates above leave
// out: a broadcast to 2^20 devices on as many hosts peaked at 1.35x their estimate without it.
// with_hosts() adds those bytes to an estimate's (transient: each planning holds its own).
double host_bytes(const Topology& topology, const Layout& src, const Layout& dst);
PlanSize with_hosts(PlanSize size, double host_bytes);

// Planning two moves in one process, one after the other, keeping both (a sync's tensors): boxes,
// ops and their bytes add up; the transient bytes (the per-device arrays of one planning, the
// process's own memory) count once, the larger. The strategy is Auto where the two differ.
PlanSize combined(const PlanSize& a, const PlanSize& b);
// The memory bound in force: `max_bytes` (PlanOptions::max_plan_bytes) if > 0, else
// limits().plan_memory_bytes.
std::int64_t plan_memory_bound(std::int64_t max_bytes);
// The bound of each of `parts` plans that one process makes at once (the local backend plans
// every device's part): every estimate counts the process's own memory, which they share, so
// each gets that and an equal share of the rest of `bound` (not bound / parts, under the process
// alone from about 500 parts).
std::int64_t plan_memory_share(std::int64_t bound, std::int64_t parts);

// Throws a one-line ValidationError naming "plan ops" or "plan memory" with the estimate (boxes,
// ops, bytes, strategy) and the bound when the estimate exceeds limits().plan_ops or
// plan_memory_bound(max_bytes).
void check_plan_size(const PlanSize& size, std::int64_t max_bytes = 0);
bool within_limits(const PlanSize& size, std::int64_t max_bytes = 0);

}  // namespace meshcast
