// The cost model's time of a multicast as a tree of chains (meshcast/multicast_tree.h), and the
// choice of its groups. Internal to lib/plan/.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lib/plan/links.h"
#include "meshcast/plan.h"
#include "meshcast/topology.h"

namespace meshcast::detail {

class LinkTimeline;

// A multicast's devices on hosts and NICs; its time as a chain or a tree (the chain_time model
// of links.h, hop by hop). A tree's hops are the chain's, but for the trunk's, which replace the
// hops into the leaders; they all stream at once, so
//   time = sum over the deepest path's hops (latency_h + stage_h) + (m - 1) max_h stage_h,
// where a hop's stage is its slowest link's time per message over every hop of the tree that
// shares the link: a leader's send port posts and copies each message twice (to the next leader
// and into its group), and a NIC carries each hop that leaves or enters a host through it (the
// trunk and its group's chain may leave a leader's host through one NIC). Exact for the trees
// whole() admits (a host entered once, left at most twice through the leader's host), O(n / g)
// per group size g after O(n) preparation. A fork's two branches are trees of their own from
// the root, whose port then posts each message twice (and whose NIC carries each branch that
// leaves its host).
class MulticastTree {
 public:
  // Starts a multicast of `bytes` in messages of `chunk`; add() then places its root, then its
  // receivers in chain order: host and NIC (any numbering, equal iff the same NIC).
  void reset(const Topology& topology, std::int64_t bytes, std::int64_t chunk);
  void add(int host, std::size_t nic);

  // The time of the tree with groups of `group` (0: one chain), forked after `fork` receivers
  // (0: not; meshcast/multicast_tree.h).
  OpTime time(std::int64_t group, std::int64_t fork = 0);
  // Whether the groups (of the receivers after `fork`) are whole hosts (every leader the first
  // receiver on its host) or each lies within one host: the trees the planner considers.
  bool whole(std::int64_t group, std::int64_t fork = 0);
  // The group (0 or one whole() admits) of the least time, for the receivers after `fork`; a
  // tree only where it is faster.
  std::int32_t best(std::int64_t fork = 0);

 private:
  // A tree's deepest path (its hops' latency + stage, and their latency alone), its slowest
  // stage, and the stage of the root's hop as counted in the path.
  struct Path {
    double deepest = 0, latency = 0, slowest = 0, first = 0;
  };
  Path path(std::int64_t group);
  // The root and receivers [from, to): one branch of a fork.
  MulticastTree branch(std::size_t from, std::size_t to) const;
  // A fork's branches: the first's path (a chain) and whether its first hop is between hosts,
  // and the second, to be cut into groups.
  struct Fork {
    Path first;
    bool first_net = false;
    std::unique_ptr<MulticastTree> second;
  };
  Fork split(std::int64_t fork) const;
  // The time of fork `f` with the second branch in groups of `group`.
  OpTime forked(const Fork& f, std::int64_t group);
  void prepare();
  double stage(bool network) const { return network ? stage_net_ : stage_intra_; }
  double latency(bool network) const { return network ? lat_net_ : lat_intra_; }
  double overhead(bool network) const {
    return (network ? topology_->network() : topology_->intra()).overhead;
  }

  const Topology* topology_ = nullptr;
  std::int64_t messages_ = 1;
  double c_ = 0;  // bytes per message
  double stage_net_ = 0, stage_intra_ = 0, lat_net_ = 0, lat_intra_ = 0;
  bool ready_ = false;
  std::optional<bool> chained_;     // a branch: whether its whole multicast is chunked (>1 hop)
  std::vector<int> host_;           // per member: the root, then the receivers
  std::vector<std::size_t> nic_;    // per member
  std::vector<char> net_;           // per chain hop k (member k -> k + 1): between hosts
  std::vector<double> sum_, lat_;   // prefix over chain hops: latency + stage, latency
  std::vector<std::int64_t> nets_;  // prefix: hops between hosts
  std::vector<std::int64_t> run_;   // per receiver: the last receiver of its host's run
};

// MulticastTree's answers for the multicasts of one plan (one LinkTimeline: its topology, element
// size and chunk), kept by shape: a tree's time and best group depend only on the bytes and on
// which members share a host and which share a NIC (MulticastTree compares hosts and NICs for
// equality only), and a plan's thousands of multicasts mostly repeat a few shapes. The
// planner asks it for the broadcast strategy's multicasts; an all-gather's forwarding
// multicasts stay chains (their r chains at once already spread the load, and auto prices them
// in closed form as chains: lib/plan/strategy_price.cc). Bounded: past about 8 MB of shapes it
// forgets them all.
class TreeShapes {
 public:
  explicit TreeShapes(const LinkTimeline& s) : s_(&s) {}
  // The group (0 for one chain) whose tree of `op` (receivers in chain order, forked after
  // op.fork, `bytes`) takes least time by the cost model (MulticastTree::best).
  std::int32_t best(const Op& op, std::int64_t bytes);
  // The time of op's tree of op.group and op.fork.
  OpTime time(const Op& op, std::int64_t bytes);

 private:
  struct Shape {
    std::int32_t group;
    OpTime time;  // of the tree of `group` (and the op's fork)
  };
  struct Hash {
    std::size_t operator()(const std::vector<std::int64_t>& key) const;
  };
  const Shape& shape(const Op& op, std::int64_t bytes);
  const Shape& find(const Op& op, std::int64_t bytes);  // shape() by key
  void load(const Op& op, std::int64_t bytes);          // tree_ := op's members

  const LinkTimeline* s_;
  MulticastTree tree_;
  std::vector<std::int64_t> key_;
  // Per host and per NIC id: the stamp of the last shape that labelled it, and its label.
  std::vector<std::pair<std::uint64_t, std::int32_t>> host_label_, nic_label_;
  std::uint64_t stamp_ = 0;
  std::unordered_map<std::vector<std::int64_t>, Shape, Hash> shapes_;
  std::size_t kept_ = 0;  // key entries held
  // The multicast asked last and its shape (map nodes do not move).
  int last_root_ = -1;
  std::int64_t last_bytes_ = -1, last_fork_ = -1;
  std::vector<int> last_peers_;
  const Shape* last_ = nullptr;
};

}  // namespace meshcast::detail
