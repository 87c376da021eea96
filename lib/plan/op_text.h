// The op list of Plan::str() and RankPlan::str(). Internal to lib/plan/.
#pragma once

#include <cstddef>
#include <ostream>
#include <vector>

#include "meshcast/plan.h"

namespace meshcast::detail {

// One line per op ("[0] multicast [0:4,0:2] 0 -> 2,3", "[0] send [0:4] 1 -> 5"), at most
// `max_ops`, then how many more.
void write_op_list(std::ostream& os, const std::vector<Op>& ops, std::size_t max_ops);

}  // namespace meshcast::detail
