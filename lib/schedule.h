// The planner's time model: list scheduling of a plan's ops over the devices' send and receive
// ports and each host's network link (in and out), every op taking latency + bytes/bandwidth of
// the slowest link class it crosses. Internal to lib/; a coarse model that ranks choices.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "meshcast/plan.h"
#include "meshcast/topology.h"

namespace meshcast::detail {

class Schedule {
 public:
  // `devices`: every device id the plan touches, sorted.
  Schedule(const Topology& topology, std::vector<int> devices, std::size_t elem_size);

  // Forgets everything placed.
  void reset();
  // Ops of the next phase start after their devices finished the earlier phases.
  void next_phase();
  // Places an op at the earliest time its resources allow; returns its end time.
  double place(const Op& op);
  // Greedy choices. The candidate root of a Multicast that would end it earliest if placed now;
  // the candidate contributor of a Reduce that is ready earliest. Ties go to the candidate
  // that has sent fewer bytes, then to the first. O(peers + candidates).
  int best_root(const Op& op, std::span<const int> candidates) const;
  int best_contributor(std::span<const int> candidates, int root) const;

  double makespan() const { return makespan_; }
  double total_end() const { return total_end_; }
  int host(int device) const { return host_[index(device)]; }
  const Topology& topology() const { return *topology_; }

 private:
  std::size_t index(int device) const;
  double duration(std::int64_t bytes, bool remote) const;

  const Topology* topology_;
  std::vector<int> devices_;
  std::size_t elem_size_;
  std::vector<int> host_;  // per dense device index
  std::vector<double> send_, recv_, finish_, prev_;
  std::vector<std::int64_t> sent_bytes_;
  std::vector<double> out_, in_;  // per host
  double makespan_ = 0, total_end_ = 0;
};

// Receivers of a multicast in chain order: the root's host first, then by host, then by id.
void chain_order(std::vector<int>& peers, int root, const Schedule& s);

}  // namespace meshcast::detail
