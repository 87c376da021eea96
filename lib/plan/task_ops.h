// The ops of a task under the sender rules that need no other task (Balance::None and Local):
// the whole plan lists every task's, and a device lists only those it takes part in, by the same
// code, so that the two agree op for op (plan_rank() == plan().rank()). Internal to lib/plan/.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/algebra/holder_set.h"
#include "lib/plan/link_timeline.h"
#include "lib/plan/multicast_tree.h"
#include "meshcast/plan.h"
#include "meshcast/task.h"

namespace meshcast::detail {

// The holders of a tile's first addend: the same for every tile. Of a target, the devices a
// tile goes to (the other addends are zeroed).
std::int64_t holders_per_tile(const Layout& layout);

// Devices of both meshes, an upper bound: 0 when their id ranges are disjoint, their overlap
// where both are ranges, else the smaller mesh's devices the other holds. O(devices log
// devices), no allocation.
double shared_devices(const Mesh& a, const Mesh& b);

// Whether a transfer out of `src` may come from more than one device: a tile with replicas, or
// a pending sum (its reduction's root and contributors). Else greedy and search have nothing to
// choose, and the planner builds balance none's ops (plan_size.cc estimates them so).
bool senders_to_choose(const Layout& src);

// Tag streams a task's ops may use: slot 0 its reduce, then one per transfer of the strategy
// (at most one per receiver, two for allgather). An op's stream is task * slots + slot.
std::int64_t stream_slots(Strategy strategy, const Layout& dst);

// Splits `box` along its first dimension of extent >= n (else its longest) into n slices: the
// pieces the receivers of an allgather get.
std::vector<Box> allgather_slices(const Box& box, std::size_t n);
// Where allgather_slices cuts: the dimension, and slice j's range of it.
struct AllGatherSplit {
  std::size_t dim;
  Range range;
  std::size_t n;
  Range slice(std::size_t j) const;
  // Every slice's size, in order (slice(j).size() without a division per slice).
  void sizes(std::vector<std::int64_t>& out) const;
};
AllGatherSplit allgather_split(const Box& box, std::size_t n);

// Rotates a chain (in chain_order) by `key`: the hosts after the root's in turn, and each host's
// run from a member in turn. Under the local rule a model's thousands of chains so enter and
// leave hosts through different devices: in chain order alone, every chain of one
// tensor-parallel rank leaves a host through the same device, whose NIC then carries that
// rank's share of the whole model.
// `runs` and `scratch` are the caller's vectors, kept from call to call (any contents).
void rotate_chain(std::vector<int>& peers, int root, std::int64_t key, const LinkTimeline& s,
                  std::vector<std::size_t>& runs, std::vector<int>& scratch);
// rotate_chain's start within each host's run: run r (counted from the first rotated) starts at
// member (chain_mix(key) + r) mod its length.
std::uint64_t chain_mix(std::int64_t key);
// The fork (Op::fork) of a chain in chain order from `root`: its run on the root's host, where
// it goes on to other hosts (else 0). The rest then leaves the root's host through the root's
// NIC, which the senders' rotation spreads over the holders, not through the run's last member:
// a host's few receivers of one tensor-parallel rank would carry its share of a whole model
// (TaskOps::forks_from says where).
std::int32_t chain_fork(const std::vector<int>& peers, int root, const LinkTimeline& s);

// Orders ops as a plan lists them: by phase, local ops (copy, zero) first, else as emitted.
void order_ops(std::vector<Op>& ops);

// Where TaskOps puts a task's ops: appended to a vector (a plan), or handed one at a time to a
// visitor that reads each before the next arrives (auto's pricing, which keeps no op: the ops
// of sendrecv's hundreds of thousands of transfers are then one reused Op, not an allocation
// each).
class OpSink {
 public:
  virtual void operator()(const Op& op) = 0;

 protected:
  ~OpSink() = default;
};

// One tensor's ops under a task-local rule (balance none or local; greedy and search give way
// to local): all of them (device < 0, the plan's ops) or those `device` takes part in
// (plan_rank). `key_offset` as TaskOps's.
struct TensorOps {
  Strategy strategy = Strategy::Broadcast;
  Balance balance = Balance::Local;
  std::vector<Op> ops;
  std::int64_t streams = 0;
  std::int64_t tasks = 0;
};
// (device >= 0: refused first, a ValidationError, if estimate_part_size() exceeds the bounds.)
// `trees`: as TaskOps::allow_trees.
TensorOps tensor_ops(const Layout& src, const Layout& dst, int device, const Topology& topology,
                     const PlanOptions& options, std::int64_t key_offset = 0, bool trees = true);
// The strategy tensor_ops() builds with: options.strategy, or Auto priced from the task
// structure (strategy_price.h), the same on every device; `work`, if given: what pricing cost
// (AutoChoice::work; 0 unpriced).
Strategy tensor_strategy(const Layout& src, const Layout& dst, const Topology& topology,
                         const PlanOptions& options, std::int64_t* work = nullptr);

class TaskOps {
 public:
  // `timeline` places the devices of both meshes on hosts (its chain_order orders receivers).
  // `key_offset` shifts the local rule's rotation: a sync of many tensors rotates each tensor's
  // senders on from where the previous tensor's stopped, so small tensors do not all start on
  // the first replica.
  // `fork`: PlanOptions::fork.
  TaskOps(const TaskGrid& grid, const LinkTimeline& timeline, Strategy strategy, Balance balance,
          std::int64_t key_offset = 0, bool fork = true);
  std::int64_t streams() const { return grid_->size() * slots_; }
  // Appends the zero-fills of a partial target's other addends: all (device < 0) or device's.
  void zeros(int device, std::vector<Op>& out) const;
  // Appends task i's ops: all of them (device < 0), or those `device` takes part in.
  void task(std::int64_t i, int device, std::vector<Op>& out);
  // The same ops, handed to `sink` one by one.
  void task(std::int64_t i, int device, OpSink& sink);
  // Whether some box went to more than one receiver: only then do the strategies' ops differ.
  bool fans_out() const { return fans_out_; }
  // Off (a sendrecv walk): transfers from a holder are handed on with root -1, the holder
  // not chosen (for pricing what does not depend on it: an all-gather's forwarding).
  void choose_senders(bool on) { senders_ = on; }
  // Off: a broadcast is one chain (group 0), its tree not chosen. A sync executes chains only
  // (lib/sync/sync_plan.cc), and choosing a tree of 127 receivers was a sixth of planning one.
  void allow_trees(bool on) { trees_on_ = on; }
  // The broadcast's trees of chains, by shape (the last op's answered at once).
  TreeShapes& trees() { return trees_; }

  // For pricing by class (lib/plan/strategy_price.cc): whether the source is complete (one
  // addend: no reduction), and whether some host has devices of both meshes (else a task's
  // receivers are all its targets, and every hop from a sender leaves its host).
  bool complete() const { return holders_.size() == 1; }
  bool shared_hosts() const { return shared_hosts_; }
  // Selects task i's tiles, as task() does first (O(tensor and mesh ranks)): then its
  // destination tile's shard indices, its targets and (a complete source) its holders.
  void select(std::int64_t i);
  const std::vector<std::int64_t>& dst_shard() const { return dst_shard_; }
  const HolderSet& targets() const { return targets_; }
  const HolderSet& holders() const { return holders_[0]; }
  // The sender task() chooses among the selected task's holders for receiver `to` by `key` (a
  // broadcast's: its task's index; sendrecv's to receiver j: the index plus j).
  int sender(int to, std::int64_t key) { return choose(holders_[0], to, key); }
  // The key task i's broadcast chain is rotated by (rotate_chain), or -1: not rotated.
  std::int64_t rotation(std::int64_t i) const {
    return balance_ == Balance::Local ? i + key_offset_ : -1;
  }

 private:
  // Whether a broadcast's chain from a root on `host` that reads its source forks (chain_fork)
  // where it goes on to other hosts: under the local rule, where the source's devices there use
  // more NICs than the destination's, whose NICs would otherwise carry all that leaves the host.
  bool forks_from(int host) const {
    return !fork_from_.empty() && fork_from_[static_cast<std::size_t>(host)] != 0;
  }
  // The sender for receiver `to` among `holders`: under Local a holder on `to`'s host if there
  // is one, else one of all; in rotation by `key` either way. Under None the first holder.
  int choose(const HolderSet& holders, int to, std::int64_t key);
  // op_ made a multicast of `box` (a chain, group 0) in `phase`: the caller sets its sender,
  // receivers and stream. Its vectors keep their capacity from op to op.
  Op& transfer(const Box& box, int phase, bool from_dst);
  // Sendrecv's one transfer of task i to `device`, which only receives it: from its index among
  // the receivers, without listing them (a gather to n devices listed n per task at every
  // device: n^2 each).
  void receive_alone(const Box& box, std::int64_t i, int device, OpSink& out);
  // Moves `box` from `root` (or, root < 0, from one of holders_[0]) to `receivers`.
  void serve(const Box& box, int root, int phase, bool from_dst, std::int64_t i, int device,
             OpSink& out);
  // Hands `op` on if `device` takes part in it (or device < 0).
  static void push(const Op& op, int device, OpSink& out);
  // Whether `device` holds an addend of the selected task's box.
  bool holds(int device) const;

  const TaskGrid* grid_;
  const LinkTimeline* s_;
  Strategy strategy_;
  Balance balance_;
  std::int64_t key_offset_;
  std::int64_t slots_;
  std::vector<std::vector<int>> on_host_;  // per host: its devices of the meshes, ascending
  // Whether some host has devices of both meshes: else no holder (a source device) is ever on
  // a receiver's host (a target device), and choose() need not look for one.
  bool shared_hosts_ = false;
  std::vector<char> fork_from_;     // per host: forks_from()
  TreeShapes trees_;                // the broadcast's trees of chains, by shape
  HolderSet targets_;               // the task's destinations
  std::vector<HolderSet> holders_;  // per addend of the source
  HolderSet any_holder_;            // of any addend (selected where there are several)
  std::vector<std::int64_t> src_shard_, dst_shard_;
  std::vector<int> receivers_, near_;  // scratch
  Op op_;                              // scratch: the op being handed on
  std::vector<std::size_t> runs_;      // scratch of rotate_chain
  std::vector<int> rotated_;           // scratch of rotate_chain
  bool fans_out_ = false;
  bool senders_ = true;
  bool trees_on_ = true;
};

}  // namespace meshcast::detail
