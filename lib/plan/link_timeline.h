// The planner's time model: list scheduling of a plan's ops over the devices' send and receive
// ports and each host's network link (in and out), with the op times of the one cost model
// (lib/plan/links.h, chain_time). An op keeps its links busy for its occupancy and ends a latency
// later; the links are free again at the end of the occupancy, so the latencies of ops in a row
// overlap. A sender's port is also busy posting its messages (per-message overhead), so n tiny
// sends from one device take about n x overhead. Internal to lib/plan/.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "links.h"
#include "meshcast/plan.h"
#include "meshcast/topology.h"

namespace meshcast::detail {

class LinkTimeline {
 public:
  // `devices`: every device id the plan touches, sorted.
  LinkTimeline(const Topology& topology, std::vector<int> devices, std::size_t elem_size,
               std::int64_t chunk_bytes);

  // Forgets everything placed.
  void reset();
  // Ops of the next phase start after their devices finished the earlier phases.
  void next_phase();
  // Places an op at the earliest time its resources allow; returns its end time. A multicast is
  // placed as one chain: the planner chooses senders here before it cuts multicasts into trees
  // of chains (TreeShapes, lib/plan/multicast_tree.h), which the plan's prediction then times.
  double place(const Op& op) {
    return place(op, op.box.volume() * static_cast<std::int64_t>(elem_size_));
  }
  // The same, given the op's bytes (its box volume times the element size), known to the caller.
  double place(const Op& op, std::int64_t bytes);
  // Greedy choices. The candidate root of a Multicast that would end it earliest if placed now;
  // the candidate contributor of a Reduce that is ready earliest. Ties go to the candidate
  // that has sent fewer bytes, then to the first. O(peers + candidates), or O(peers x
  // candidates) with several NICs per host (root_cost()).
  int best_root(const Op& op, std::span<const int> candidates) const;
  // What best_root() costs per candidate, in peers visited.
  std::size_t root_cost(const Op& op) const { return nics_ > 1 ? 1 + op.peers.size() : 1; }
  int best_contributor(std::span<const int> candidates, int root) const;

  double makespan() const { return makespan_; }
  double total_end() const { return total_end_; }
  int host(int device) const { return dev_[index(device)].host; }  // plan_hosts()' number
  // A device's NIC (an index into the per-NIC links) and, for the device at `slot`, its rail
  // from a root whose NIC is `root_nic`: how many NICs of its host its NIC comes after the
  // root's index (chain_order enters a host through rail 0 where it can).
  std::size_t nic(int device) const { return dev_[index(device)].nic; }
  std::uint64_t rail(std::size_t slot, std::size_t root_nic) const {
    if (nics_ == 1) return 0;
    const std::size_t mine = dev_[slot].rail, root = root_nic % nics_;
    return mine >= root ? mine - root : mine + nics_ - root;
  }
  // The devices, sorted, and a device's position among them (dense per-device arrays).
  const std::vector<int>& devices() const { return devices_; }
  std::size_t slot(int device) const { return index(device); }
  const Topology& topology() const { return *topology_; }
  std::size_t elem_size() const { return elem_size_; }
  std::int64_t chunk() const { return chunk_; }

 private:
  // The receiver a multicast's chain ends at (chain_order's last): it forwards nothing.
  int chain_last(const std::vector<int>& peers, int root_host, std::size_t root_nic) const;
  std::size_t index(int device) const {  // inline: asked per hop of every multicast priced
    if (device >= 0 && static_cast<std::size_t>(device) < dense_.size())
      return dense_[static_cast<std::size_t>(device)];
    return sparse_index(device);
  }
  std::size_t sparse_index(int device) const;  // by binary search
  // With several NICs per host: the NICs through which a multicast's chain from a root on
  // `root_host` with NIC `root_nic` enters its other receiving hosts (chain_order's first
  // receiver on each), appended to `nics` in the order of the hosts. (With one, the hosts'.)
  void entry_nics(const std::vector<int>& peers, int root_host, std::size_t root_nic,
                  std::vector<std::size_t>& nics) const;
  // A multicast's time to `net_hops` receiving hosts other than the root's and `peers` peers.
  OpTime multicast_time(std::int64_t bytes, int net_hops, std::size_t peers) const;
  // multicast_time's last answer (a LinkTimeline is one planner's, never shared by threads).
  struct Timed {
    std::int64_t bytes = -1;
    int net = 0;
    std::size_t peers = 0;
    OpTime time;
  };
  mutable Timed timed_;
  OpTime link_time(std::int64_t bytes, bool remote) const;
  // The per-message overhead of a message between hosts (remote) or inside one.
  double overhead(bool remote) const;

  const Topology* topology_;
  std::vector<int> devices_;
  // dense_[id] == index(id) for ids up to a bound (a lookup instead of a binary search; the
  // planner's search evaluates schedules millions of times). Empty for very sparse ids.
  std::vector<std::uint32_t> dense_;
  std::size_t elem_size_;
  std::int64_t chunk_;
  std::size_t nics_ = 1;  // per host
  // Per device (dense index), together so that placing an op touches one cache line per device.
  struct Device {
    double send = 0, recv = 0, finish = 0, prev = 0;  // port free times, end of work, phase start
    std::int64_t sent_bytes = 0;
    int host = 0;
    std::size_t nic = 0;   // its host's NIC that it uses: index into out_ and in_
    std::size_t rail = 0;  // that NIC's index on the host (nic % nics_per_host)
  };
  std::vector<Device> dev_;
  std::vector<double> out_, in_;  // per NIC (host * nics_per_host + the host's NIC)
  double makespan_ = 0, total_end_ = 0;
  std::vector<std::size_t> touched_in_,
      touched_out_;  // place()'s scratch, kept to avoid allocation
};

// Receivers of a multicast in chain order: the root's host first (by id), then by host, each
// host from the receiver on the root's NIC index, NICs in order, then by id (LinkTimeline::rail).
void chain_order(std::vector<int>& peers, int root, const LinkTimeline& s);

}  // namespace meshcast::detail
