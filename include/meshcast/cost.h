// What a plan costs on a topology, before running it: the analytic model the planner ranks
// choices by, the per-link loads, and a discrete-event simulation with fair sharing of
// contended links. See docs/model.md for the model, its calibration and its validation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshcast/plan.h"
#include "meshcast/topology.h"

namespace meshcast {

// A link of the model. Every device has a send and a receive port (intra-host class: a transfer
// between two devices of one host uses the sender's send port and the receiver's receive port);
// every NIC of a host has a network link out and one in, at Topology::nic_bandwidth() (network
// class: a transfer between hosts also uses the sender's NIC out and the receiver's NIC in,
// Topology::nic_of(); with one NIC per host, the host's link).
struct LinkLoad {
  // "device 3 send", "device 3 recv", "host p3-1 out", "host p3-1 in"; with several NICs per
  // host "host dgx-1 nic 2 out", "host dgx-1 nic 2 in".
  std::string name;
  bool network = false;    // network class (else intra-host)
  std::int64_t bytes = 0;  // bytes the plan moves over the link
  // The least time the link is busy: bytes / its bandwidth, and on a sender's port each
  // message's overhead too (the model's send weight).
  double seconds = 0;
};

struct Prediction {
  // The analytic model: phase after phase, the busiest link's time plus the longest latency,
  // or the slowest op alone (a long chain: every hop's latency, overhead and fill), whichever is
  // more. plan() records this as PlanStats::predicted_seconds.
  double seconds = 0;
  // The busiest link's time busy (LinkLoad::seconds): no schedule of these ops is faster.
  double bound_seconds = 0;
  std::vector<LinkLoad> links;  // links that carry bytes, busiest first
};

// Throws ValidationError("topology") when the topology does not place a device of the plan,
// ValidationError("chunk_bytes") when chunk_bytes < 1, and as Plan::validate() for an op that
// is not valid (a hand-built plan; it need not write every target element: a scenario is priced).
Prediction predict(const Plan& plan, const Topology& topology,
                   std::int64_t chunk_bytes = kDefaultChunkBytes);

struct Simulation {
  // When the last op ends. Ops start as the executor starts them: every op of a phase as soon
  // as each of its devices finished its ops of the earlier phases; the transfers in flight
  // share every link max-min fairly (a chain moves at its slowest hop's share).
  double seconds = 0;
  std::vector<double> op_start, op_end;  // per op of the plan, in plan order
  std::int64_t events = 0;               // rate recomputations (a measure of the work done)
  std::vector<LinkLoad> links;           // as Prediction::links
};

// Throws as predict().
Simulation simulate(const Plan& plan, const Topology& topology,
                    std::int64_t chunk_bytes = kDefaultChunkBytes);

// The cost model's primitives, for transfers priced without a plan (the collectives' choice of
// algorithm). The same formulas as predict() and simulate() (docs/model.md): a message costs
// its sender the link class's `overhead` and its port bytes / intra bandwidth, crosses a NIC at
// Topology::nic_bandwidth() (in parallel with the port) and arrives a `latency` later.
//
// `bytes` along a pipelined chain of `net_hops` hops between hosts and `intra_hops` inside
// hosts, in messages of `chunk` bytes (>= 1), alone on idle links.
double chain_seconds(std::int64_t bytes, int net_hops, int intra_hops, const Topology& topology,
                     std::int64_t chunk = kDefaultChunkBytes);
// A round of messages posted at once: every sender posts `messages` messages of `bytes` each;
// `per_nic` of all the round's messages leave through the busiest NIC (0: the round stays inside
// hosts). latency + the busiest of a sender's port (messages x (overhead + bytes / intra
// bandwidth)) and that NIC (per_nic x bytes / NIC bandwidth).
double round_seconds(double bytes, std::int64_t messages, std::int64_t per_nic,
                     const Topology& topology);

}  // namespace meshcast
