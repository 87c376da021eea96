// Moving a whole model: many named tensors, each from its own source layout to its own target
// layout, planned jointly and executed as one operation. Boxes that travel between the same
// sender and the same receivers (in the same phase) are coalesced into one message, packed at
// the sender and unpacked at the receivers; senders rotate over all replicas of all tensors; the
// packing memory in flight per device stays under a bound; an f32 tensor may cross the network
// as bf16 or f16 (cast at the sender). Every device plans only its own part.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meshcast/communicator.h"
#include "meshcast/plan.h"
#include "meshcast/reshard.h"
#include "meshcast/topology.h"

namespace meshcast {

// One tensor of a model sync. dst has src's shape; its dtype is src's, or bf16 / f16 when src is
// f32 (the sender casts, round to nearest even; the wire carries the target's bytes).
struct TensorMove {
  std::string name;  // non-empty, unique in a sync, at most kMaxTensorNameBytes
  Layout src;
  Layout dst;
};
// A tensor's name, copied into every device's part of a sync: longer ones are refused (a name
// of 30 MB held 3.8 GB over 64 devices of one process). Real names are under 200 bytes.
inline constexpr std::size_t kMaxTensorNameBytes = 1024;

struct SyncOptions {
  // Per tensor: the strategy (auto by default), the chunk; senders by Balance::Local (none
  // keeps the first holder). Greedy and search need a tensor's whole plan and give way to local.
  // Where auto's choices would make a device's part of the sync exceed 256 MiB (or the plan
  // bounds), the tensors that save the most take the strategy of their smallest part.
  PlanOptions plan{.balance = Balance::Local};
  // Packing memory in flight per device and sync (send and receive staging together, each
  // message's rounded up to 64 bytes, and the chain engine's own staging of a strided box sent
  // to several receivers, at most TransportCaps::chain_staging_bytes): >= 8, and at least
  // addends x element size for a partial-sum source (its root stages the addends together). A
  // bound below a chain's staging lets one such box through at a time, alone.
  std::int64_t max_staging_bytes = std::int64_t{64} << 20;
  // The largest coalesced message, 0 or >= 8: 0 picks min(4 MiB, max_staging_bytes / 4), so that
  // several messages are in flight (links stay busy) while others are packed.
  std::int64_t bucket_bytes = 0;
  // Boxes of at most this many bytes (and at most a bucket) are packed into shared messages;
  // larger ones travel alone, straight from the source buffer into the targets' (no copy), unless
  // they are cast. Packing costs two copies and saves a message: worth it for small boxes
  // (norms, biases), not for a weight matrix.
  std::int64_t pack_bytes = std::int64_t{64} << 10;
};

// What one device does in a sync (SyncPlan::stats: the bytes it receives), and what a whole sync
// costs (predict_sync).
struct SyncStats {
  std::int64_t tensors = 0;
  std::int64_t messages = 0;       // transfers (a coalesced message, a box sent unpacked, a reduce)
  std::int64_t boxes = 0;          // boxes they carry (before coalescing, one transfer each)
  std::int64_t bytes_moved = 0;    // bytes sent device to device (the wire's dtype)
  std::int64_t bytes_network = 0;  // predict_sync() only: of which between hosts (a SyncPlan
                                   // holds no topology, and a chain's hops are the planner's)
  double predicted_seconds = 0;    // predict_sync() only: the cost model's time
  double link_bound_seconds = 0;   // predict_sync() only: busiest link's bytes / its rate
  std::string busiest_link;        // predict_sync() only: that link (LinkLoad::name)
};

// One device's part of a sync: its local copies, and its messages in the order every device of
// the sync posts them.
class SyncPlan {
 public:
  struct Segment {  // one box of one tensor inside a message
    std::int32_t tensor = 0;
    Box box;
    bool from_dst = false;  // the sender reads its target buffer (filled in an earlier phase)
  };
  struct Message {
    std::int32_t phase = 0;
    OpKind kind = OpKind::Multicast;  // Multicast (coalesced) or Reduce (one op, unpacked)
    int root = -1;
    std::vector<int> peers;
    std::int32_t group = 0;   // Multicast: tree of chains (Op::group)
    std::int32_t fork = 0;    // Multicast: split at the root (Op::fork)
    std::int64_t stream = 0;  // the sync's tag stream, and the order all devices post in
    bool packed = true;       // staged through a contiguous buffer (else sent from the buffer)
    std::int64_t bytes = 0;   // wire bytes
    std::vector<Segment> segments;
  };
  struct Local {  // a copy or zero-fill on this device
    std::int32_t tensor = 0;
    Op op;
  };

  SyncPlan(std::vector<TensorMove> tensors, int device, std::vector<Local> locals,
           std::vector<Message> messages, std::int64_t streams, SyncOptions options);

  const std::vector<TensorMove>& tensors() const { return tensors_; }
  // The tensor's index, or -1 (O(log tensors)).
  int index(std::string_view name) const;
  int device() const { return device_; }
  const std::vector<Local>& locals() const { return locals_; }
  const std::vector<Message>& messages() const { return messages_; }
  std::int64_t streams() const { return streams_; }
  const SyncOptions& options() const { return options_; }
  SyncStats stats() const;  // this device's messages (as root or peer)
  std::string str(std::size_t max_messages = 32) const;
  // A digest of the tensors (names, shapes, dtypes, layouts), the same on every device of a sync
  // planned from the same model: sync() checks its peers' against it.
  std::uint64_t model_digest() const { return model_digest_; }

 private:
  std::vector<TensorMove> tensors_;
  int device_;
  std::vector<Local> locals_;
  std::vector<Message> messages_;
  std::int64_t streams_;
  SyncOptions options_;
  std::uint64_t model_digest_ = 0;
  std::vector<std::int32_t> by_name_;  // tensor indices sorted by name, for index()
};

// Every device of the tensors' meshes, sorted: the devices a sync involves.
std::vector<int> sync_devices(const std::vector<TensorMove>& tensors);

// Device `device`'s part of syncing `tensors`: time and memory in proportion to the boxes it
// takes part in plus the tensors' devices. Deterministic: every device computes the same
// messages for the parts they share. Throws ValidationError naming the tensor and field
// ("tensors[3].dst.dtype": a cast other than f32 -> bf16/f16; "tensors[3].dst.shape";
// "tensors[3].name": a duplicate or empty name, or one over kMaxTensorNameBytes),
// ValidationError("max_staging_bytes") < 1.
SyncPlan plan_sync(std::vector<TensorMove> tensors, int device,
                   const Topology& topology = Topology::single_host(),
                   const SyncOptions& options = {});

// The transfers one sync of `t` counts for a bound before any planning: one for each target
// device (coalesced or not, each unpacks the tensor), or, where no device is in both meshes,
// the pieces a cast or a pending sum splits it into (each at most a bucket, SyncOptions; a
// fraction: pieces of several tensors share a message), whichever is more.
double sync_transfers(const TensorMove& t, const SyncOptions& options = {});

// The whole sync's messages over every device, priced by the cost model (meshcast/cost.h):
// predicted_seconds (the analytic model, phase after phase) and link_bound_seconds. Plans every
// tensor for every device: for `meshcast sync --predict`, not for each rank of a job.
SyncStats predict_sync(const std::vector<TensorMove>& tensors,
                       const Topology& topology = Topology::single_host(),
                       const SyncOptions& options = {});

// Executes the device's part: src[i] / dst[i] are its local tiles of tensor i (row-major,
// nullptr where it holds / receives none), over `group` (which holds every device of every
// tensor's meshes; every member calls it, in the same order as its other operations on the
// group). Throws as reshard(), and ValidationError("src[3]") for a missing buffer.
void sync(const SyncPlan& plan, const Group& group, std::span<const void* const> src,
          std::span<void* const> dst);
// isync moves inside its own test()/wait(), a later reservation of its tags, and any wait of
// the device on something else (InFlight::poll): syncs, reshards and collectives in flight
// together may be waited in any order. Except where the transport matches transfers in issue
// order (TransportCaps::ordered_matching: NCCL, MPI's native broadcasts): there they must be
// waited in the same order on every device, or all driven with test() until done.
Transfer isync(const SyncPlan& plan, const Group& group, std::span<const void* const> src,
               std::span<void* const> dst);

}  // namespace meshcast
