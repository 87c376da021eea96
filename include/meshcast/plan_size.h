// What a plan will take to build and hold, known from the two layouts before planning: plan()
// checks it against limits() so that a request too large for the machine is refused at once
// instead of after minutes and gigabytes.
#pragma once

#include "meshcast/layout.h"
#include "meshcast/plan.h"

namespace meshcast {

// Upper bounds (doubles: they may exceed any integer type).
struct PlanSize {
  double boxes = 0;  // pieces of the tensor the move splits into (tasks)
  double ops = 0;    // operations of the plan
  double bytes = 0;  // the planner's working memory
};

// For one strategy (Auto: the smallest of the three, as plan() skips the ones that do not fit).
// Boxes: the product over dimensions of the distinct pieces that both layouts' cuts make;
// receivers per box: the destination's replicas; holders: the source's. The allgather and
// sendrecv strategies keep each holder as a candidate sender per receiver (holders x receivers
// per box), the allgather one also a peer list per receiver (receivers^2).
PlanSize estimate_plan_size(const Layout& src, const Layout& dst, Strategy strategy);

// Throws ValidationError naming "plan ops" or "plan memory" with the estimate and the bound when
// the estimate exceeds limits().plan_ops or limits().plan_memory_bytes.
void check_plan_size(const PlanSize& size);
bool within_limits(const PlanSize& size);

}  // namespace meshcast
