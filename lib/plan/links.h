// The links of the cost model (see meshcast/cost.h) and the time of one op over them: shared by
// the planner's schedule, predict() and the simulator so that they agree. Internal to lib/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshcast/cost.h"
#include "meshcast/plan.h"
#include "meshcast/topology.h"

namespace meshcast::detail {

// An op's time split in two: latency (the hops' message latencies, in flight; links are free
// meanwhile) and occupancy (the time the op keeps its links busy).
struct OpTime {
  double latency = 0, occupancy = 0;
  double total() const { return latency + occupancy; }
};

// The one cost model (LogGP-like), shared by the list schedule, predict(), the simulator and
// the collectives. A chain sends a box in messages of `chunk` bytes (at least one, even over
// one hop: lib/exec/chain.cc); m = messages(), c = bytes / m. A hop's sender port posts each
// message (its class's overhead o) and copies it out (c / intra bandwidth); a hop between hosts
// also streams it through two NICs (c / NIC bandwidth), in parallel with the port. So a hop
// takes per message
//   stage = o + c / B_intra                                 inside a host,
//   stage = max(o + c / B_intra, c / B_nic)                 between hosts,
// and a chain of hops h takes
//   sum_h latency_h + sum_h stage_h + (m - 1) max_h stage_h
// (every hop's latency, the first message across every hop, the rest at the slowest stage). A
// tree of chains (Op::group) takes the same along its deepest path: MulticastTree.
std::int64_t messages(std::int64_t bytes, std::int64_t chunk);
double stage_time(double message_bytes, bool network, const Topology& topology);
OpTime chain_time(std::int64_t bytes, int net_hops, int intra_hops, const Topology& topology,
                  std::int64_t chunk);
// The weight of a hop's sender port in a flow of `bytes` (in m messages) over it: the port's
// time per byte of the flow is weight / B_intra (the copy plus the overhead per message).
double send_weight(std::int64_t bytes, std::int64_t m, bool network, const Topology& topology);

// Refuses a chunk < 1 (ValidationError "chunk_bytes").
void check_chunk(std::int64_t chunk);

// The hosts of `devices` numbered densely, in the topology's order: per device its host's
// number, and (`ids`) per number the topology's host. The links are sized by the hosts a plan
// uses, not by the topology's (a 32-byte move on a topology of 2^20 hosts x 256 NICs took
// 12.6 GB).
std::vector<int> plan_hosts(const Topology& topology, const std::vector<int>& devices,
                            std::vector<int>& ids);

class Links {
 public:
  // `devices`: every device the plan touches, sorted. Throws ValidationError("topology") for a
  // device the topology does not place.
  Links(const Topology& topology, std::vector<int> devices);

  std::size_t size() const { return bandwidth_.size(); }
  // Link indices: devices' ports first, then the hosts' NICs (the plan's hosts, plan_hosts(),
  // nics_per_host() each; a device's traffic to other hosts goes through its NIC, nic_of()).
  std::size_t send(int device) const { return 2 * slot(device); }
  std::size_t recv(int device) const { return 2 * slot(device) + 1; }
  std::size_t out(int device) const {
    const std::size_t s = slot(device);
    return 2 * devices_.size() + 2 * (static_cast<std::size_t>(host_[s]) * nics_ + nic_[s]);
  }
  std::size_t in(int device) const { return out(device) + 1; }
  double bandwidth(std::size_t link) const { return bandwidth_[link]; }
  bool network(std::size_t link) const { return link >= 2 * devices_.size(); }
  std::string name(std::size_t link) const;
  int host(int device) const { return host_[slot(device)]; }

  // The op's transfers as (links, bytes) flows: a multicast is one flow over its whole chain
  // (root -> peers[0] -> peers[1] ...) or tree (its edges; a link on two of them appears twice;
  // its time: MulticastTree), a reduce one flow per contributor other than the root
  // (one message each), a copy one flow on the device's receive port, a zero none. A flow keeps
  // link links[k] busy for bytes * weights[k] / bandwidth (a sender's port pays its messages'
  // overhead: send_weight). Also returns the op's time alone on idle links (its latency and
  // occupancy; a reduce's occupancy is left to the caller, who shares its links).
  struct Flow {
    std::vector<std::size_t> links;
    std::vector<double> weights;  // per entry of links
    std::int64_t bytes = 0;
    double seconds(std::size_t k, const Links& l) const {
      return static_cast<double>(bytes) * weights[k] / l.bandwidth(links[k]);
    }
  };
  // Appends the links of a transfer from -> to in `m` messages (from == to: a local copy, the
  // receive port).
  void hop(int from, int to, std::int64_t m, Flow& f) const;
  // How many links hop() appends: 1 (a local copy), 2 on a host, 4 across hosts.
  int hop_links(int from, int to) const { return from == to ? 1 : host(from) == host(to) ? 2 : 4; }
  OpTime flows(const Op& op, std::int64_t bytes, std::int64_t chunk, std::vector<Flow>& out) const;

  // Bytes over every link (each flow's bytes on each of its links), as LinkLoads busiest first;
  // a link's seconds include the overhead of the messages its device sends.
  std::vector<LinkLoad> loads(const Plan& plan, std::int64_t chunk) const;

  // The analytic model (meshcast/cost.h, Prediction::seconds): phase after phase, the ops of a
  // phase share every link, so the phase takes its busiest link's bytes / bandwidth plus the
  // longest latency, or its slowest op alone (a long chain), whichever is more.
  double analytic_seconds(const std::vector<Op>& ops, std::int64_t elem_size,
                          std::int64_t chunk) const;

 private:
  std::size_t slot(int device) const;

  const Topology* topology_;
  std::vector<int> devices_;
  std::vector<int> host_, nic_;  // per device slot (host_: plan_hosts())
  std::vector<int> host_ids_;    // per plan host: the topology's
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  std::vector<std::uint32_t> dense_;  // dense_[id]: slot(id), kNone if absent; may be empty
  std::size_t nics_ = 1;
  std::vector<double> bandwidth_;
};

}  // namespace meshcast::detail
