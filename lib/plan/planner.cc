// plan(): tasks -> ops by strategy, senders chosen task by task (none / local: detail::TaskOps)
// or by the schedule model over the whole plan (greedy / search), then the plan's byte
// accounting.
#include "lib/plan/planner.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <span>

#include "lib/plan/link_timeline.h"
#include "lib/plan/links.h"
#include "lib/plan/multicast_tree.h"
#include "lib/plan/plan_stats.h"
#include "lib/plan/strategy_price.h"
#include "lib/plan/task_ops.h"
#include "meshcast/error.h"
#include "meshcast/plan.h"
#include "meshcast/plan_size.h"
#include "meshcast/task.h"

namespace meshcast {
namespace {

using detail::LinkTimeline;

// An op whose senders are still to be chosen. Multicast: choices[0] lists candidate roots.
// Reduce: choices[g] lists candidate contributors of addend g (peers[g]). The lists are the
// Builder's, one per task and addend, shared by the task's ops (a sendrecv op per receiver).
struct Unit {
  Op op;
  std::vector<std::span<const int>> choices;
  std::int64_t bytes = 0;
};

class Builder {
 public:
  Builder(const Layout& dst, Strategy strategy)
      : dst_(dst),
        strategy_(strategy),
        elem_(static_cast<std::int64_t>(dtype_size(dst.dtype()))),
        slots_(detail::stream_slots(strategy, dst)) {}

  // Streams as detail::TaskOps numbers them: task * slots + slot.
  std::vector<Unit> build(const TaskGrid& grid) {
    for (std::int64_t i = 0; i < dst_.mesh().size(); ++i)  // addends of a partial target
      if (dst_.partial_group(i) != 0 && !dst_.tile_at(i).empty())
        add({OpKind::Zero, 0, dst_.tile_at(i), dst_.mesh().device(i), {}, false, 0}, {});
    for (std::int64_t i = 0; i < grid.size(); ++i) {
      stream_ = i * slots_ + 1;
      expand(grid.task(i));
    }
    return std::move(units_);
  }

 private:
  void add(Op op, std::vector<std::span<const int>> choices) {
    const std::int64_t bytes = op.box.volume() * elem_;
    units_.push_back({std::move(op), std::move(choices), bytes});
  }

  void expand(const Task& t) {
    if (t.sources.size() == 1) {
      // Devices holding the data in both layouts copy it locally.
      const std::vector<int>& holders = keep(t.sources[0]);
      // Membership by binary search in a sorted copy: a linear find per destination costs
      // holders x destinations per task, quadratic in the mesh for replicated layouts.
      sorted_.assign(holders.begin(), holders.end());
      std::sort(sorted_.begin(), sorted_.end());
      std::vector<int> receivers;
      for (int d : t.destinations) {
        if (std::binary_search(sorted_.begin(), sorted_.end(), d))
          add({OpKind::Copy, 0, t.box, d, {}, false, 0}, {});
        else
          receivers.push_back(d);
      }
      serve(t.box, holders, receivers, 0, false);
      return;
    }
    // A pending sum: reduce at one destination device (preferably one holding an addend, so
    // its own addend need not move), which then serves the others.
    // Every addend's holders, sorted for the membership test as above (a sum of thousands of
    // addends, each on one device, to thousands of destinations).
    sorted_.clear();
    for (const auto& g : t.sources) sorted_.insert(sorted_.end(), g.begin(), g.end());
    std::sort(sorted_.begin(), sorted_.end());
    std::vector<int> roots;
    for (int d : t.destinations)
      if (std::binary_search(sorted_.begin(), sorted_.end(), d)) roots.push_back(d);
    if (roots.empty()) roots = t.destinations;
    const int root = least_loaded_root(roots);
    Op reduce{OpKind::Reduce, 0, t.box, root, {}, true, stream_ - 1};
    std::vector<std::span<const int>> choices;
    for (const auto& g : t.sources) {
      const bool at_root = std::find(g.begin(), g.end(), root) != g.end();
      choices.push_back(keep(at_root ? std::vector<int>{root} : g));
      reduce.peers.push_back(choices.back().front());
    }
    reduce_load_[root] += static_cast<std::int64_t>(t.sources.size()) * t.box.volume();
    add(reduce, std::move(choices));
    std::vector<int> receivers;
    for (int d : t.destinations)
      if (d != root) receivers.push_back(d);
    serve(t.box, keep({root}), receivers, 1, true);
  }

  // A list of candidates kept for the units (a deque: its elements never move).
  const std::vector<int>& keep(std::vector<int> candidates) {
    return kept_.emplace_back(std::move(candidates));
  }

  int least_loaded_root(const std::vector<int>& roots) {
    int best = roots.front();
    for (int r : roots)
      if (reduce_load_[r] < reduce_load_[best]) best = r;
    return best;
  }

  // Moves `box` from one of `holders` to every receiver, by the strategy.
  void serve(const Box& box, const std::vector<int>& holders, const std::vector<int>& receivers,
             int phase, bool from_dst) {
    if (receivers.empty()) return;
    if (receivers.size() > 1) fans_out_ = true;
    const std::int64_t base = stream_;
    if (strategy_ == Strategy::SendRecv) {
      for (std::size_t j = 0; j < receivers.size(); ++j)
        add({OpKind::Multicast,
             phase,
             box,
             holders.front(),
             {receivers[j]},
             from_dst,
             base + static_cast<std::int64_t>(j)},
            {holders});
      return;
    }
    if (strategy_ == Strategy::Broadcast || receivers.size() == 1) {
      add({OpKind::Multicast, phase, box, holders.front(), receivers, from_dst, base}, {holders});
      return;
    }
    // AllGather: receiver j gets slice j, then broadcasts it to the other receivers.
    const auto parts = detail::allgather_slices(box, receivers.size());
    for (std::size_t j = 0; j < parts.size(); ++j) {
      if (parts[j].empty()) continue;
      const auto slot = base + 2 * static_cast<std::int64_t>(j);
      add({OpKind::Multicast, phase, parts[j], holders.front(), {receivers[j]}, from_dst, slot},
          {holders});
      std::vector<int> others;
      for (int r : receivers)
        if (r != receivers[j]) others.push_back(r);
      add({OpKind::Multicast, phase + 1, parts[j], receivers[j], std::move(others), true, slot + 1},
          {});
    }
  }

  const Layout& dst_;
  Strategy strategy_;
  std::int64_t elem_;
  std::int64_t slots_;
  std::int64_t stream_ = 0;  // the current task's first transfer stream
  std::vector<Unit> units_;
  std::deque<std::vector<int>> kept_;
  std::map<int, std::int64_t> reduce_load_;
  std::vector<int> sorted_;  // expand()'s scratch

 public:
  // Whether some box went to more than one receiver: only then do the strategies' ops differ.
  bool fans_out_ = false;
};

// Ops grouped by phase, each phase in execution order (indices into units).
using Order = std::vector<std::vector<std::size_t>>;

struct Cost {
  double makespan, total;
  bool operator<(const Cost& o) const {
    const double eps = 1e-12 * std::max(1.0, o.makespan);
    if (makespan < o.makespan - eps) return true;
    if (makespan > o.makespan + eps) return false;
    return total < o.total * (1 - 1e-12);
  }
};

Cost evaluate(const std::vector<Unit>& units, const Order& order, LinkTimeline& s) {
  s.reset();
  for (std::size_t p = 0; p < order.size(); ++p) {
    if (p) s.next_phase();  // not after the last phase: nothing reads it, the next use resets
    for (auto i : order[p]) s.place(units[i].op, units[i].bytes);
  }
  return {s.makespan(), s.total_end()};
}

// Local ops first, then the largest transfers first (the greedy order).
Order initial_order(const std::vector<Unit>& units) {
  int phases = 0;
  for (const auto& u : units) phases = std::max(phases, u.op.phase + 1);
  Order order(static_cast<std::size_t>(phases));
  for (std::size_t i = 0; i < units.size(); ++i)
    order[static_cast<std::size_t>(units[i].op.phase)].push_back(i);
  for (auto& phase : order)
    std::stable_sort(phase.begin(), phase.end(), [&](auto a, auto b) {
      const bool la = units[a].op.kind == OpKind::Copy || units[a].op.kind == OpKind::Zero;
      const bool lb = units[b].op.kind == OpKind::Copy || units[b].op.kind == OpKind::Zero;
      if (la != lb) return la;
      return units[a].bytes > units[b].bytes;
    });
  return order;
}

// The candidates greedy prices, over all ops: every one while that stays within the budget
// (a pricing is tens of ns); past it each candidate list gets an equal share of it, a window of
// its candidates rotated by `key`. A replicated source of 16,384 holders sent to 16,384
// receivers priced 2.7e8 candidates (17 s) for a tensor of 8 elements.
constexpr double kGreedyWork = 1 << 25;

std::span<const int> window(std::span<const int> c, std::size_t most, std::size_t key,
                            std::vector<int>& scratch) {
  if (c.size() <= most) return c;
  scratch.clear();
  const std::size_t start = key * most % c.size();
  for (std::size_t k = 0; k < most; ++k) scratch.push_back(c[(start + k) % c.size()]);
  return scratch;
}

// Greedy: in order, each op takes the sender that ends it (or is ready) earliest.
void assign_greedy(std::vector<Unit>& units, const Order& order, LinkTimeline& s) {
  double work = 0, lists = 0;
  for (const Unit& u : units) {
    if (u.op.kind == OpKind::Multicast && !u.choices.empty())
      work += static_cast<double>(u.choices[0].size() * s.root_cost(u.op)), ++lists;
    else if (u.op.kind == OpKind::Reduce)
      for (const auto& c : u.choices) work += static_cast<double>(c.size()), ++lists;
  }
  const double share = work <= kGreedyWork ? work : kGreedyWork / std::max(lists, 1.0);
  std::vector<int> scratch;
  s.reset();
  for (const auto& phase : order) {
    for (auto i : phase) {
      Unit& u = units[i];
      const auto most = [&](std::size_t cost) {
        return static_cast<std::size_t>(std::max(1.0, share / static_cast<double>(cost)));
      };
      if (u.op.kind == OpKind::Multicast && !u.choices.empty())
        u.op.root = s.best_root(u.op, window(u.choices[0], most(s.root_cost(u.op)), i, scratch));
      else if (u.op.kind == OpKind::Reduce)
        for (std::size_t g = 0; g < u.choices.size(); ++g)
          u.op.peers[g] =
              s.best_contributor(window(u.choices[g], most(1), i + g, scratch), u.op.root);
      s.place(u.op, u.bytes);
    }
    s.next_phase();
  }
}

// Bounded local search from the greedy solution: move one op to another sender, or swap two
// ops of a phase; keep a move only if the schedule improves. Deterministic (fixed seed) unless
// the wall-clock cap ends it.
bool search(std::vector<Unit>& units, Order& order, LinkTimeline& s, const PlanOptions& opt) {
  constexpr double kWork = 4e6;     // op-participant visits over all evaluations
  if (order.empty()) return false;  // nothing to move
  std::size_t per_eval = 1;
  std::vector<std::size_t> movable;
  for (std::size_t i = 0; i < units.size(); ++i) {
    per_eval += 1 + units[i].op.peers.size();
    for (const auto& c : units[i].choices)
      if (c.size() > 1) {
        movable.push_back(i);
        break;
      }
  }
  const auto moves = std::min<std::int64_t>(
      opt.search_moves, static_cast<std::int64_t>(kWork / static_cast<double>(per_eval)));
  std::mt19937_64 rng(0x6d65736863617374ull);
  const auto t0 = std::chrono::steady_clock::now();
  Cost best = evaluate(units, order, s);
  for (std::int64_t m = 0; m < moves; ++m) {
    if ((m & 15) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >
            opt.search_seconds)
      return true;
    if ((rng() & 1) && !movable.empty()) {
      Unit& u = units[movable[rng() % movable.size()]];
      std::size_t slot = rng() % u.choices.size();
      while (u.choices[slot].size() < 2) slot = (slot + 1) % u.choices.size();
      const auto& c = u.choices[slot];
      int& who = u.op.kind == OpKind::Multicast ? u.op.root : u.op.peers[slot];
      const int before = who;
      who = c[rng() % c.size()];
      if (who == before) continue;
      const Cost cost = evaluate(units, order, s);
      if (cost < best)
        best = cost;
      else
        who = before;
    } else {
      auto& phase = order[rng() % order.size()];
      if (phase.size() < 2) continue;
      const std::size_t a = rng() % phase.size(), b = rng() % phase.size();
      if (a == b) continue;
      std::swap(phase[a], phase[b]);
      const Cost cost = evaluate(units, order, s);
      if (cost < best)
        best = cost;
      else
        std::swap(phase[a], phase[b]);
    }
  }
  return false;
}

// `fans_out` (optional) tells whether the strategy mattered (see Builder::fans_out_).
// The ops of units in `order`, each multicast's receivers in chain order, as a tree of chains
// where the model prefers one (not an all-gather's forwarding: see TreeShapes).
std::vector<Op> ops_of(const std::vector<Unit>& units, const Order& order, const LinkTimeline& s,
                       Strategy strategy) {
  std::vector<Op> ops;
  ops.reserve(units.size());
  detail::TreeShapes trees(s);
  const auto elem = static_cast<std::int64_t>(s.elem_size());
  for (const auto& phase : order)
    for (auto i : phase) {
      Op op = units[i].op;
      if (op.kind == OpKind::Multicast) {
        detail::chain_order(op.peers, op.root, s);
        if (strategy != Strategy::AllGather) op.group = trees.best(op, op.box.volume() * elem);
      }
      ops.push_back(std::move(op));
    }
  return ops;
}

Plan plan_with(const Layout& src, const Layout& dst, const TaskGrid& grid, LinkTimeline& s,
               Strategy strategy, const PlanOptions& opt, bool* fans_out = nullptr) {
  const auto elem = static_cast<std::int64_t>(dtype_size(src.dtype()));
  // The schedule ranks sender choices; the plan records the analytic model, which does not
  // depend on the order of a phase's ops (the executor posts them all at once).
  const detail::Links links(s.topology(), s.devices());
  auto analytic = [&](const std::vector<Op>& ops) {
    return links.analytic_seconds(ops, elem, opt.chunk_bytes);
  };
  bool truncated = false;
  std::vector<Op> ops;
  // Greedy and search schedule the whole plan only where a sender is to be chosen; elsewhere
  // their ops are balance none's, built task by task (in task order), without the schedule's
  // units and copies of every op (a dense 8,192-device move has 4 M of them).
  const bool scheduled = (opt.balance == Balance::Greedy || opt.balance == Balance::Search) &&
                         detail::senders_to_choose(src);
  if (!scheduled) {
    // Task by task, as each device computes its own part (plan_rank).
    const Balance rule = opt.balance == Balance::Local ? Balance::Local : Balance::None;
    detail::TaskOps t(grid, s, strategy, rule, 0, opt.fork);
    t.zeros(-1, ops);
    for (std::int64_t i = 0; i < grid.size(); ++i) t.task(i, -1, ops);
    detail::order_ops(ops);
    if (fans_out) *fans_out = t.fans_out();
    PlanStats st = detail::account(ops, s, elem);
    st.predicted_seconds = analytic(ops);
    return Plan(src, dst, strategy, opt.balance, s.topology().name(), std::move(ops), std::move(st),
                t.streams());
  }
  Builder builder(dst, strategy);
  std::vector<Unit> units = builder.build(grid);
  if (fans_out) *fans_out = builder.fans_out_;
  Order order = initial_order(units);
  assign_greedy(units, order, s);
  if (opt.balance == Balance::Search) {
    // The search improves the schedule; keep greedy's plan where the model prefers it, so that
    // search is never worse than greedy by the time the plan records.
    std::vector<Op> greedy = ops_of(units, order, s, strategy);
    truncated = search(units, order, s, opt);
    ops = ops_of(units, order, s, strategy);
    if (analytic(greedy) < analytic(ops) * (1 - 1e-12)) ops = std::move(greedy);
  } else {
    ops = ops_of(units, order, s, strategy);
  }
  PlanStats st = detail::account(ops, s, elem);
  st.predicted_seconds = analytic(ops);
  st.search_truncated = truncated;
  return Plan(src, dst, strategy, opt.balance, s.topology().name(), std::move(ops), std::move(st),
              grid.size() * detail::stream_slots(strategy, dst));
}

}  // namespace

namespace detail {

std::vector<int> union_devices(const Layout& src, const Layout& dst) {
  std::vector<int> d = src.mesh().devices();
  d.insert(d.end(), dst.mesh().devices().begin(), dst.mesh().devices().end());
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  return d;
}

void check_plan_options(const PlanOptions& o, const std::string& field) {
  const auto refuse = [&](const char* name, const std::string& why) {
    throw ValidationError(field + "." + name, why);
  };
  if (o.strategy < Strategy::Auto || o.strategy > Strategy::AllGather)
    refuse("strategy", "is not a Strategy (" + std::to_string(static_cast<int>(o.strategy)) + ")");
  if (o.balance < Balance::None || o.balance > Balance::Local)
    refuse("balance", "is not a Balance (" + std::to_string(static_cast<int>(o.balance)) + ")");
  if (o.search_moves < 0)
    refuse("search_moves", "must be >= 0, got " + std::to_string(o.search_moves));
  if (!(o.search_seconds >= 0)) refuse("search_seconds", "must be >= 0 (infinity: no cap)");
  check_chunk(o.chunk_bytes);
  if (o.max_plan_bytes < 0)
    refuse("max_plan_bytes",
           "must be >= 0 (0: the limit in force), got " + std::to_string(o.max_plan_bytes));
}

}  // namespace detail

Plan plan(const Layout& src, const Layout& dst, const Topology& topology,
          const PlanOptions& options) {
  detail::check_plan_options(options);
  // Refused before any work when even the smallest candidate would not fit.
  check_plan_size(with_hosts(estimate_plan_size(src, dst, options.strategy, options.balance),
                             host_bytes(topology, src, dst)),
                  options.max_plan_bytes);
  const TaskGrid grid(src, dst);
  LinkTimeline s(topology, detail::union_devices(src, dst), dtype_size(src.dtype()),
                 options.chunk_bytes);
  if (options.strategy != Strategy::Auto)
    return plan_with(src, dst, grid, s, options.strategy, options);
  // Auto: each candidate priced from the tasks by the model the plan records, without building
  // it (strategy_price.h); only the cheapest is built (with the local rule if it fits only so).
  const detail::AutoChoice choice = detail::auto_strategy(grid, s, options);
  PlanOptions chosen = options;
  chosen.balance = choice.balance;
  return plan_with(src, dst, grid, s, choice.strategy, chosen);
}

}  // namespace meshcast
