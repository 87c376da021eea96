// The communicator interface that the executor drives; each backend (local threads, MPI, UCX,
// NCCL) implements it. A communicator is one device's endpoint: rank() is its global device id.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "meshcast/region.h"

namespace meshcast {

// A handle to a non-blocking operation; complete it with Communicator::wait.
class Request {
 public:
  struct Impl {
    virtual ~Impl() = default;
  };
  Request() = default;
  explicit Request(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Impl* get() const { return impl_.get(); }
  bool valid() const { return impl_ != nullptr; }
  void reset() { impl_.reset(); }

 private:
  std::shared_ptr<Impl> impl_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // Non-blocking point-to-point; regions stay valid until the request completes. Messages with
  // the same (source, destination, tag) match in posting order.
  virtual Request isend(const Region& from, int dst, int tag) = 0;
  virtual Request irecv(const Region& to, int src, int tag) = 0;
  // Broadcast from `root` to every other device of `group` (device ids, root included). The
  // root passes its source region, the others their destination region. The default sends
  // from the root to each receiver.
  virtual Request ibcast(const Region& region, int root, std::span<const int> group, int tag);

  // Work on this device's own memory, which a backend may keep elsewhere (GPU memory for NCCL).
  // The defaults work on host memory.
  virtual void copy(const Region& from, const Region& to) { copy_region(from, to); }
  virtual void zero(const Region& r) { zero_region(r); }
  virtual void add(const Region& from, const Region& to, DType dtype) {
    accumulate(from, to, dtype);
  }
  // A scratch buffer of `bytes` bytes in the device's memory, freed when the pointer dies.
  virtual std::shared_ptr<void> scratch(std::size_t bytes);

  // Completes a request (throws CommError if a peer failed); the request is reset.
  void wait(Request& r);
  void wait_all(std::span<Request> rs);
  // True once a request completed (it stays valid; wait() on it returns at once).
  bool test(Request& r);
  virtual void barrier() = 0;
  // Tells the other devices that this one gives up on the current operation because of
  // `field: cause` (reshard() calls it when it throws), so that they end with that error at
  // once instead of waiting for their timeout. Best effort; the default does nothing.
  virtual void abandon(const std::string& field, const std::string& cause) {
    (void)field;
    (void)cause;
  }
  // abandon() with what `e` says: a CommError passes on the failed device it names, anything
  // else says that this device failed. reshard() and the collectives call it as they throw.
  void abandon_for(const std::exception& e);

  // Memory shared with the other devices of this node, where the backend maps it: device d's
  // segment of node_segment_bytes() bytes when d is on this node (this device included), else
  // nullptr. The blocking collectives copy through it instead of sending (collectives/node.cc
  // owns its contents). The default has none.
  virtual std::byte* node_segment(int device) {
    (void)device;
    return nullptr;
  }
  virtual std::size_t node_segment_bytes() const { return 0; }
  // One step of spinning on node memory that `peers` will write, the `polls`-th since `since`:
  // moves this device's own traffic on (its peers may wait on it), yields the core after a
  // short spin, and throws CommError when a peer failed or the wait outlasted the backend's
  // timeout. The default only yields: a backend that maps node memory overrides it.
  virtual void idle(std::span<const int> peers, int polls,
                    std::chrono::steady_clock::time_point since);

  // The tag of this device's next collective on `group` (meshcast/collectives.h): in
  // [32768, 49152), above every plan tag and below the backends' control tags. Each group (its
  // device list) has its own sequence, starting at an offset of its own, so members agree as long
  // as they start their collectives on that group in the same order, whatever else they do.
  int next_collective_tag(std::span<const int> group);
  // Instead of a tag, for a collective that sends nothing (node memory): a 64-bit name of the
  // group's next collective, the same on every member, taken from the same sequence.
  std::uint64_t next_collective_id(std::span<const int> group);

 protected:
  // Backend-specific completion and non-blocking check of one of its own requests. A backend
  // that polls must call advance_chains() in its polling loop, so that chains forward chunks
  // while their devices wait on anything else.
  virtual void wait_one(Request::Impl& r) = 0;
  virtual bool test_one(Request::Impl& r) = 0;

  // A pipelined chain broadcast over isend/irecv: the box travels root -> group[1] -> group[2]
  // ... in chunks of `chunk` bytes, each member forwarding a chunk as soon as it arrived, so the
  // time is about bytes/bandwidth + (members - 2) * chunk/bandwidth. `group` is in chain order
  // and must contain the root first. A strided box is staged through a scratch buffer of at
  // most max(1, staging_bytes / chunk) chunks (chunks packed and unpacked one at a time as they
  // pass); a contiguous one moves in place.
  Request ibcast_chain(const Region& region, int root, std::span<const int> group, int tag,
                       std::size_t chunk, std::size_t staging_bytes);
  // Moves every chain of this device on (receives, unpacks, forwards); true if it did anything.
  bool advance_chains();

 private:
  struct Chain;
  bool advance_chain(Chain& c);
  std::vector<std::weak_ptr<Chain>> chains_;
  std::unordered_map<std::uint64_t, unsigned> collective_seq_;  // per group (hash of its ids)
  std::pair<std::uint64_t, unsigned> next_in_sequence(std::span<const int> group);
};

}  // namespace meshcast
