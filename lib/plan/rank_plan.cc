// A device's own part of a plan: cut from the whole plan (Plan::rank), or computed alone
// (plan_rank) from the tasks that meet the device's tiles.
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "lib/plan/link_timeline.h"
#include "lib/plan/op_text.h"
#include "lib/plan/planner.h"
#include "lib/plan/strategy_price.h"
#include "lib/plan/task_ops.h"
#include "lib/support/text.h"
#include "meshcast/error.h"
#include "meshcast/plan.h"
#include "meshcast/plan_size.h"
#include "meshcast/task.h"

namespace meshcast {
namespace {

bool takes_part(const Op& op, int device) {
  return op.root == device || std::find(op.peers.begin(), op.peers.end(), device) != op.peers.end();
}

}  // namespace

RankPlan::RankPlan(Layout src, Layout dst, Strategy strategy, Balance balance, int device,
                   std::vector<Op> ops, std::int64_t streams)
    : src_(std::move(src)),
      dst_(std::move(dst)),
      strategy_(strategy),
      balance_(balance),
      device_(device),
      ops_(std::move(ops)),
      streams_(streams) {}

std::string RankPlan::str(std::size_t max_ops) const {
  int phases = 0;
  for (const Op& op : ops_) phases = std::max(phases, op.phase + 1);
  std::ostringstream os;
  os << "plan of device " << device_ << ": " << shape_str(src_.shape()) << ' '
     << to_string(src_.dtype()) << "  " << src_.str() << " -> " << dst_.str() << '\n'
     << "  strategy " << to_string(strategy_) << ", balance " << to_string(balance_) << ", "
     << detail::counted(static_cast<std::int64_t>(ops_.size()), "op") << " in "
     << detail::counted(phases, "phase") << ", " << detail::counted(streams_, "tag stream") << '\n';
  detail::write_op_list(os, ops_, max_ops);
  return os.str();
}

RankPlan Plan::rank(int device) const {
  if (device < 0)
    throw ValidationError("device", "must be a device id >= 0, got " + std::to_string(device));
  std::vector<Op> mine;
  for (const Op& op : ops_)
    if (takes_part(op, device)) mine.push_back(op);
  return RankPlan(src_, dst_, strategy_, balance_, device, std::move(mine), streams_);
}

namespace detail {

namespace {

PlanOptions local_rule(const PlanOptions& options) {
  check_plan_options(options);
  PlanOptions o = options;
  if (o.balance != Balance::None) o.balance = Balance::Local;
  return o;
}

}  // namespace

Strategy tensor_strategy(const Layout& src, const Layout& dst, const Topology& topology,
                         const PlanOptions& options, std::int64_t* work) {
  if (work) *work = 0;
  if (options.strategy != Strategy::Auto) return options.strategy;
  const PlanOptions o = local_rule(options);
  const TaskGrid grid(src, dst);
  const LinkTimeline s(topology, union_devices(src, dst), dtype_size(src.dtype()), o.chunk_bytes);
  const AutoChoice c = auto_strategy(grid, s, o);
  if (work) *work = c.work;
  return c.strategy;
}

TensorOps tensor_ops(const Layout& src, const Layout& dst, int device, const Topology& topology,
                     const PlanOptions& options, std::int64_t key_offset, bool trees) {
  PlanOptions o = local_rule(options);
  const TaskGrid grid(src, dst);
  const LinkTimeline s(topology, union_devices(src, dst), dtype_size(src.dtype()), o.chunk_bytes);
  // Auto is priced from the task structure (strategy_price.h), the same on every device.
  if (o.strategy == Strategy::Auto) o.strategy = auto_strategy(grid, s, o).strategy;
  // A device's part is bounded before any op is built where the whole plan would not fit (a
  // part of a plan that fits does too, and plan_rank() then builds what plan() would).
  if (device >= 0) {
    const double hosts = host_bytes(topology, src, dst);
    if (!within_limits(with_hosts(estimate_plan_size(src, dst, o.strategy, o.balance), hosts),
                       o.max_plan_bytes))
      check_plan_size(with_hosts(estimate_part_size(src, dst, o.strategy, o.balance), hosts),
                      o.max_plan_bytes);
  }
  TensorOps r;
  r.strategy = o.strategy;
  r.balance = o.balance;
  r.tasks = grid.size();
  TaskOps t(grid, s, r.strategy, o.balance, key_offset, o.fork);
  t.allow_trees(trees);
  t.zeros(device, r.ops);
  if (device < 0) {
    for (std::int64_t i = 0; i < grid.size(); ++i) t.task(i, device, r.ops);
  } else {
    // The tasks meeting the device's tiles: those it holds, and those it receives.
    std::vector<std::int64_t> mine;
    if (src.mesh().contains(device)) mine = grid.meeting(src.tile_of(device));
    if (dst.mesh().contains(device)) {
      const auto more = grid.meeting(dst.tile_of(device));
      std::vector<std::int64_t> both;
      both.reserve(mine.size() + more.size());
      std::set_union(mine.begin(), mine.end(), more.begin(), more.end(), std::back_inserter(both));
      mine = std::move(both);
    }
    for (std::int64_t i : mine) t.task(i, device, r.ops);
  }
  order_ops(r.ops);
  r.streams = t.streams();
  return r;
}

}  // namespace detail

RankPlan plan_rank(const Layout& src, const Layout& dst, int device, const Topology& topology,
                   const PlanOptions& options) {
  // (tensor_ops() takes a negative device for all of them: a whole plan under the local rule.)
  if (device < 0) throw ValidationError("device", "must be >= 0, got " + std::to_string(device));
  detail::TensorOps t = detail::tensor_ops(src, dst, device, topology, options);
  return RankPlan(src, dst, t.strategy, t.balance, device, std::move(t.ops), t.streams);
}

}  // namespace meshcast
