// A plan: the operations that move a tensor from one layout to another. A pure, deterministic,
// serialisable value; build it once with plan() and execute it many times with reshard().
#pragma once

#include <cstdint>
#include <iosfwd>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "meshcast/box.h"
#include "meshcast/layout.h"
#include "meshcast/multicast_tree.h"
#include "meshcast/topology.h"

namespace meshcast {

enum class Strategy {
  Auto,       // the cheapest of the three by the planner's cost estimate
  Broadcast,  // each task served by ONE multicast from one chosen sender to all its receivers
  SendRecv,   // one point-to-point transfer per receiver (the baseline)
  AllGather,  // each receiver gets 1/r of the box, then the r receivers all-gather
};
std::string to_string(Strategy s);
Strategy parse_strategy(std::string_view text, const std::string& field = "strategy");

// How senders are chosen among the devices holding a task's data.
enum class Balance {
  None,    // always the first holder in mesh order
  Greedy,  // largest task first, the sender that finishes it earliest
  Search,  // greedy, then a bounded local search over sender and order; never worse than greedy
  // Per task, from the task alone: a holder on the first receiver's host if there is one, else
  // one of the holders in rotation by the task's index. Every device computes its own ops under
  // this rule without the others' (plan_rank()); greedy and search need the whole plan.
  Local,
};
std::string to_string(Balance b);
Balance parse_balance(std::string_view text, const std::string& field = "balance");

// The chunk of a pipelined chain broadcast: the backends' default (MpiOptions::chunk_bytes)
// and the cost model's assumption unless told otherwise.
inline constexpr std::int64_t kDefaultChunkBytes = std::int64_t{256} << 10;

struct PlanOptions {
  Strategy strategy = Strategy::Auto;
  Balance balance = Balance::Search;
  // Search effort: candidate moves evaluated (deterministic; a work budget also bounds them on
  // huge plans), and an optional wall-clock cap. The cap is off by default: a plan cut short by
  // the clock depends on the machine's load, so processes that plan independently could
  // disagree. A cut-short plan records search_truncated.
  std::int64_t search_moves = 4000;
  double search_seconds = std::numeric_limits<double>::infinity();
  // The chain chunk the cost model assumes (meshcast/cost.h); >= 1.
  std::int64_t chunk_bytes = kDefaultChunkBytes;
  // The planner's memory bound: a request whose plan is estimated (meshcast/plan_size.h) to
  // need more is refused before any work with a one-line ValidationError("plan memory") naming
  // the estimate and the bound. 0: limits().plan_memory_bytes (8 GiB unless
  // MESHCAST_MAX_PLAN_MEMORY_BYTES says otherwise).
  std::int64_t max_plan_bytes = 0;
  // Under the local rule, whether a chain may fork at the root (Op::fork) where the source's
  // devices on the root's host use more NICs than the destination's there. false: chains and
  // trees only (the baseline of what forking gains).
  bool fork = true;
};

enum class OpKind {
  Copy,       // device copies the box from its source buffer to its destination buffer
  Multicast,  // root sends the box to every peer (a broadcast; one peer: a send)
  Reduce,     // peers (addend holders, in addend order) send the box to root, which sums them
  Zero,       // device zero-fills the box (addends other than the first of a partial target)
};
std::string to_string(OpKind k);

struct Op {
  OpKind kind = OpKind::Copy;
  int phase = 0;           // ops of phase p run after the device finished its ops of phase p-1
  Box box;                 // region of the global tensor
  int root = -1;           // Copy/Zero: the device; Multicast: sender; Reduce: the summing device
  std::vector<int> peers;  // Multicast: receivers; Reduce: one contributor per addend (may be root)
  bool from_dst = false;   // the root reads its destination buffer (filled in an earlier phase)
  // The op's tag stream (its tag is the reshard's TagBlock::tag(stream)): distinct for the
  // transfers of a plan, and the same in a device's own part (RankPlan) as in the whole plan.
  std::int64_t stream = 0;
  // Multicast: the receivers' groups of a tree of chains (meshcast/multicast_tree.h), 0 for one
  // chain. The planner picks it by the cost model (lib/plan/multicast_tree.h).
  std::int32_t group = 0;
  // Multicast: the receivers [0, fork) on a chain of their own from the root, the tree of
  // `group` over the others hanging from the root too (meshcast/multicast_tree.h); 0: no split.
  std::int32_t fork = 0;
  friend bool operator==(const Op&, const Op&) = default;
};

struct PlanStats {
  std::int64_t bytes_moved = 0;       // bytes sent from one device to another
  std::int64_t bytes_local = 0;       // bytes copied inside a device
  std::int64_t bytes_intra_host = 0;  // of bytes_moved: between devices of one host
  std::int64_t bytes_network = 0;     // of bytes_moved: crossing a host's network link
  std::map<int, std::int64_t> sent;   // per device id
  std::map<int, std::int64_t> received;
  double predicted_seconds = 0;   // the planner's schedule estimate on the topology
  bool search_truncated = false;  // the search hit its wall-clock cap
  friend bool operator==(const PlanStats&, const PlanStats&) = default;
};

class Plan {
 public:
  // `streams` < 0: the ops' streams are renumbered 0, 1, ... in order (hand-built plans).
  Plan(Layout src, Layout dst, Strategy strategy, Balance balance, std::string topology,
       std::vector<Op> ops, PlanStats stats, std::int64_t streams = -1);

  const Layout& src() const { return src_; }
  const Layout& dst() const { return dst_; }
  Strategy strategy() const { return strategy_; }  // never Auto: the one chosen
  Balance balance() const { return balance_; }
  const std::string& topology() const { return topology_; }
  const std::vector<Op>& ops() const { return ops_; }
  const PlanStats& stats() const { return stats_; }
  // The tag streams the plan's ops are numbered in: every op's stream is below it (a reshard
  // reserves min(streams, the group's window) tags).
  std::int64_t streams() const { return streams_; }
  int phases() const;
  // Every device id of either mesh, sorted.
  std::vector<int> devices() const;

  // One JSON document; from_json(to_json()) == *this. from_json throws ParseError("plan...")
  // for malformed text (a duplicate key included), a ValidationError("plan.ops", ...) for more
  // than limits().plan_ops ops, and validates the plan (below) before returning it; its stats'
  // byte counts must be what its ops move (ValidationError("plan.stats.bytes_moved", ...)),
  // the intra-host and network split only add up, predicted_seconds is taken as written.
  std::string to_json() const;
  // The same document written straight to `os`, op by op (no tree, no string of it in memory).
  void write_json(std::ostream& os) const;
  static Plan from_json(std::string_view text);

  // Checks everything the executor relies on, throwing ValidationError naming the field
  // ("plan.ops[3].box", "plan.ops[3].peers[1]", "plan.ops" for coverage):
  //  - the strategy is not Auto; both layouts have one shape and dtype; at most plan_ops ops;
  //  - ops are listed in phase order: phases start at 0 and never skip one;
  //  - every box has the tensor's ndim, lo < hi in every dimension, and lies in the tensor;
  //  - Copy: no peers; the root holds the box in both layouts and the source is complete.
  //    Zero: no peers; the root's target tile holds the box and the root is an addend other
  //    than the first of a partial target. Multicast: at least one receiver, none twice, not
  //    the root (no self-send); from_dst: the root's target tile holds the box and the root
  //    received all of it in earlier phases; else the root's source tile holds it and the
  //    source is complete; receivers' target tiles hold the box; fork is 0 or in
  //    [1, receivers); group is 0 or in [2, receivers - fork). Reduce: one contributor per
  //    addend of the source, in addend order, each holding the box; the root's target tile
  //    holds it. Ops other than multicasts: group and fork 0;
  //  - every op's stream lies in [0, streams()); multicasts and reduces have distinct streams;
  //  - coverage: every element of every target device's tile is written exactly once, with the
  //    value (Copy, Reduce, a multicast of the value) on a complete target or addend 0 of a
  //    partial one, with zeros (Zero, or a multicast forwarding them) on the other addends.
  // Near linear in the ops: per target device, its boxes lie in its tile, their volumes add up
  // to the tile's and they are pairwise disjoint (a grid of the boxes' bounds, or a sweep); a
  // plan too fragmented to check within a work bound of 2^24 + 64 per write is refused.
  // Example: moving a 4x6 tensor from 2@0-1:RR to 1@2:RR, the ops "multicast [0:4,0:4] 0 -> 2"
  // and "multicast [0:4,4:6] 1 -> 2" are valid; with the second's box [0:4,3:6] validate()
  // throws "plan.ops[1]: writes [0:4,3:4] of device 2, which plan.ops[0] also writes", with
  // [0:4,5:6] "plan.ops: 4 of the 24 elements of device 2's target tile [0:4,0:6] are never
  // written".
  void validate() const;

  // Human-readable summary and op list (at most `max_ops` ops listed).
  std::string str(std::size_t max_ops = 32) const;
  // Device `device`'s part: the ops it takes part in, in plan order, streams kept (none for a
  // device outside both meshes). O(ops). Throws ValidationError("device") when device < 0.
  class RankPlan rank(int device) const;
  friend bool operator==(const Plan&, const Plan&) = default;

 private:
  Layout src_;
  Layout dst_;
  Strategy strategy_;
  Balance balance_;
  std::string topology_;
  std::vector<Op> ops_;
  PlanStats stats_;
  std::int64_t streams_ = 0;
};

// Plans the move of `src` to `dst` (same shape and dtype; meshes may differ, overlap or be
// disjoint). Pure and deterministic (unless the search's wall-clock cap is hit). Throws
// ValidationError("dst.shape" / "dst.dtype" / "topology") for inconsistent input.
Plan plan(const Layout& src, const Layout& dst, const Topology& topology = Topology::single_host(),
          const PlanOptions& options = {});

// One device's part of a plan: the ops it takes part in (as root, peer, or the device of a copy
// or zero), in the plan's order, with the plan's streams. What reshard() executes on a device.
class RankPlan {
 public:
  RankPlan(Layout src, Layout dst, Strategy strategy, Balance balance, int device,
           std::vector<Op> ops, std::int64_t streams);
  const Layout& src() const { return src_; }
  const Layout& dst() const { return dst_; }
  Strategy strategy() const { return strategy_; }
  Balance balance() const { return balance_; }
  int device() const { return device_; }
  const std::vector<Op>& ops() const { return ops_; }
  std::int64_t streams() const { return streams_; }
  // Summary and op list, as Plan::str().
  std::string str(std::size_t max_ops = 32) const;
  friend bool operator==(const RankPlan&, const RankPlan&) = default;

 private:
  Layout src_;
  Layout dst_;
  Strategy strategy_;
  Balance balance_;
  int device_;
  std::vector<Op> ops_;
  std::int64_t streams_;
};

// Device `device`'s part of plan(src, dst, topology, options), computed without the rest of the
// plan: time and memory in proportion to the device's own ops plus the devices of the meshes.
// Greedy and search choose senders over the whole plan, so here they give way to Balance::Local
// (the result's balance() says which rule ran); with balance none or local,
//   plan_rank(src, dst, d, topology, o) == plan(src, dst, topology, o).rank(d)
// for every device d. A device outside both meshes gets an empty plan. Throws as plan(), and
// ValidationError("device") for a negative device.
RankPlan plan_rank(const Layout& src, const Layout& dst, int device,
                   const Topology& topology = Topology::single_host(),
                   const PlanOptions& options = {});

// Draws a plan as SVG: the source mesh above the destination mesh, devices grouped in boxes by
// host, each device labelled with its tile; lines hop by hop along each multicast's chains,
// network transfers (between hosts) drawn apart from intra-host ones, width in proportion to
// the bytes. Above 16 devices in a mesh (or 40 device pairs) the view is aggregated: one box per
// host (or run of hosts) with the bytes between boxes on the lines. Bounded by
// limits().svg_elements. The hosts come from `topology`, the one the plan was made with; without
// it, from the topology the plan names (Topology::resolve: a preset, single-host); they are drawn
// as unknown when that does not place every device or splits the bytes otherwise than the plan.
std::string plan_svg(const Plan& plan);
std::string plan_svg(const Plan& plan, const Topology& topology);

}  // namespace meshcast
