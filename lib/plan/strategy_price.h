// The price of a strategy before it is built: the analytic model the plan records
// (Links::analytic_seconds) evaluated over the flows the strategy would create, task by task,
// without keeping its ops. `auto` prices the three strategies and builds only the cheapest.
// Internal to lib/plan/.
#pragma once

#include <cstdint>

#include "lib/plan/link_timeline.h"
#include "lib/plan/links.h"
#include "meshcast/plan.h"
#include "meshcast/task.h"

namespace meshcast::detail {

// The predicted seconds of `strategy`'s plan (not Auto) of the move `grid`, its senders chosen
// task by task by `rule` (Balance::None or Local, TaskOps' rules: greedy and search need the
// whole plan): equal, up to rounding, to the predicted_seconds of plan() with that strategy and
// balance. `s` and `links` cover the devices of both meshes. Time O(tasks x receivers) for every
// strategy (allgather's r^2 chain hops per task are summed in closed form), or
// O(tasks + classes x receivers) where priced_by_class(); memory O(devices + the largest task's
// receivers), or O(devices + classes x receivers) up to a bound. `fans_out` (optional): whether
// some box goes to more than one receiver (only then do the strategies' ops differ). `fork`:
// PlanOptions::fork.
double strategy_price(const TaskGrid& grid, const LinkTimeline& s, const Links& links,
                      Strategy strategy, Balance rule, std::int64_t chunk, bool* fans_out = nullptr,
                      bool fork = true);

// Whether strategy_price() and auto_strategy() price the move's tasks under sender rule `rule`
// by class: then in time O(tasks + classes x receivers). Where the source is complete, each
// task's transfers come from one sender (its tile has one holder, or rule none) or no host has
// devices of both meshes, and tasks are at least twice the destination's tiles.
bool priced_by_class(const TaskGrid& grid, const LinkTimeline& s, Balance rule);

// What auto spends pricing one move at most (AutoChoice::work), about 0.2 s of the 2-core
// development machine. Pricing is O(tasks x receivers) where tasks do not repeat their classes:
// every device pricing an all-gather over 4,096 devices took 2.4 s (8,192: 10 s), for a part it
// plans in milliseconds. What it costs: such a move is built unpriced (that all-gather, on 8
// devices a host: sendrecv, 8.3 ms by the cost model, where priced it took broadcast, 5.2 ms).
inline constexpr std::int64_t kAutoWork = std::int64_t{16} << 20;

// What `auto` builds: the least priced of broadcast, allgather and sendrecv (ties to the
// earlier), senders by options.balance's task-by-task rule (Local standing in for greedy and
// search, which need the built plan). A strategy is a candidate if its estimated plan
// (plan_size.h) fits the limits and options.max_plan_bytes under options.balance, or else under
// Local, which it is then built with (greedy and search keep every holder of a box as its
// transfers' candidates, and a search a copy of every op). Where no box goes to more than one
// receiver the strategies build the same ops: the first candidate at once. Where pricing passes
// kAutoWork, the least priced of those priced by then. Where no whole plan fits (a device planning
// its part alone; plan() refuses first), or none was priced within kAutoWork, the strategy of the
// smallest part (estimate_part_size): its own part is the least a device builds. A function of its
// arguments alone, so every device resolves Auto alike.
struct AutoChoice {
  Strategy strategy;
  Balance balance;
  std::int64_t work = 0;  // what its pricing cost: link loads added, ten per task walked
};
// (`work_cap`: kAutoWork but in tests.)
AutoChoice auto_strategy(const TaskGrid& grid, const LinkTimeline& s, const PlanOptions& options,
                         std::int64_t work_cap = kAutoWork);

}  // namespace meshcast::detail
