// The search over the training engine's parallel configurations (AxoNN-style communication
// model): estimates the step time of every uniform parallel configuration of a model over a
// number of devices on a topology, from the GEMM rate of one device and the topology's link
// classes, and orders them by it. (Not the reshard planner of meshcast/plan.h.)
//
// The model, per step on the busiest device (no overlap of communication with compute assumed,
// so the estimate is an upper bound where the engine overlaps):
// - compute: per token per block, forward 2(3d^2 + d^2 + 2df) / (R C) for the linears plus
//   4 seq d / C for attention (heads split over C, repeated over R), the head 2 d vocab / R;
//   the backward twice the forward. Tokens per micro-batch: its samples over dp x D, rounded up.
// - tensor_comm: the partial-sum and input-gradient all-reduces over the R and C groups and the
//   layernorm all-reduces over R, every micro-batch; the depth all-gathers of the linear
//   weights, once per step.
// - data_comm: the depth reduce-scatters and replica all-reduces of the linear weights, the
//   bucketed all-reduces of the other parameters over dp x D, the sparse embedding table's
//   synchronisation (the cheapest method by sparse_traffic(), every token's row assumed
//   distinct), and the step's loss and norm all-reduce over every device.
// - pipeline_comm: every activation and gradient a device sends or receives across a stage
//   boundary (or a skip between stages), point to point between the devices at the same place
//   of the two stage meshes, all at once: a round of the cost model each (round_seconds), the
//   transfers leaving (entering) a host sharing its NICs.
// Collectives cost as collective_seconds(), except that a group's devices do not have their
// host's NICs to themselves: every group along the same axes (all stages) runs at once, so the
// NICs carry a message from each of the host's devices in groups that span hosts.
// - bubble: (stages-1)/micro_batches of the busiest stage's compute + tensor_comm, i.e. the
//   (stages-1)/(micro_batches+stages-1) fraction of the pipelined part of the step.
#pragma once

#include <string>
#include <vector>

#include "meshcast/topology.h"
#include "meshcast/training/engine.h"

namespace meshcast::training {

struct Machine {
  double flops = 0;  // measured fp32 GEMM rate of one device, FLOP/s
};

// A parallel configuration and its estimated step time, by part.
struct ConfigEstimate {
  // Every stage the same StageShape; OneFOneB without a pipeline, Eager1F1B with one; topology
  // points to search_configurations()' argument (for train(), which must not outlive it).
  ParallelConfig parallel;
  double compute = 0;        // seconds per step of GEMM work on the busiest device
  double tensor_comm = 0;    // seconds of tensor-parallel collectives (R, C, D groups)
  double data_comm = 0;      // gradient synchronisation
  double pipeline_comm = 0;  // stage-boundary transfers
  double bubble = 0;         // pipeline idle
  double total = 0;          // compute + tensor_comm + data_comm + pipeline_comm + bubble
  // One line: "pp=2 dp=1 grid=1x2x1 mb=4 eager-1f1b: 12.3 ms = compute 8.1 + tp 2.0 + dp 0.5 +
  // pp 0.4 + bubble 1.3" (milliseconds).
  std::string str() const;
};

// Every configuration over `devices` devices (ids 0..devices-1, stage 0 first): pipeline
// stages pp dividing `devices` and at most model.layers; per stage every dp x R x C x D of
// devices / pp; micro-batches pp * 2^k dividing train.batch; of those, the ones validate()
// accepts. Ordered by total (ties in that order), best first; at most top_k. Throws
// ValidationError naming the field: "devices" (< 1, beyond the topology, or nothing fits),
// "top_k" (< 1), "flops" (not positive), or what validate() says of the model or the batch.
std::vector<ConfigEstimate> search_configurations(const ModelConfig& model,
                                                  const TrainConfig& train, int devices,
                                                  const Topology& topology, const Machine& machine,
                                                  int top_k);

enum class CollectiveKind { AllReduce, AllGather, ReduceScatter };

// Seconds of one ring collective among `group` (device ids) over `bytes` (all-reduce: the
// buffer; all-gather: the gathered result; reduce-scatter: the input): 2(n-1) steps for an
// all-reduce, n-1 otherwise, each a round of the cost model (meshcast/cost.h round_seconds) in
// which every member sends bytes / n to the next: the latency of the link class, then the
// slower of the sender's port (overhead + bytes / n at the intra-host rate) and, across hosts,
// the busiest NIC, which carries one message from each of the group's members on its host
// (split over nics_per_host). 0 for a group of one.
// Example (meshes/emulated.json, 4 devices per host, 1 Gbit/s, 12 ms): an all-reduce of 1 MB
// among {0, 1, 4} takes 4 steps of 12 ms + 2 x 1/3 MB / 125 MB/s = 69.3 ms.
// Throws ValidationError("bytes") when negative or not finite, ("topology") for a device the
// topology does not place.
double collective_seconds(const std::vector<int>& group, double bytes, CollectiveKind kind,
                          const Topology& topology);

}  // namespace meshcast::training
