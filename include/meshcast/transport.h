// The table a transport fills (local threads, MPI, UCX, NCCL), as NCCL's and UCX's transports do:
// post a send or a receive, test a request, wait a moment for progress, cancel, work on the
// device's own memory, abort. Everything above it (chains, phases, groups and their tags, the
// wait loop, reshards, collectives) is the progress engine's, in the core (Communicator), and is
// the same for every transport. Users never call a transport: they get a Communicator from a
// session (LocalWorld, MpiSession, UcxSession, NcclSession) and call that.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "meshcast/error.h"
#include "meshcast/region.h"

namespace meshcast {

// A handle to a non-blocking operation; complete it with Communicator::wait or test.
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

// What a transport can do; the engine chooses how to move data from it.
struct TransportCaps {
  // How a multicast (one root, several receivers) travels: as a pipelined chain of
  // point-to-point chunks over post_send/post_recv, natively (post_broadcast), or as one send
  // from the root to each receiver (a transport whose sends of one batch run concurrently).
  enum class Multicast { Chain, Native, Fanout } multicast = Multicast::Chain;
  // Posts between begin_batch() and end_batch() are issued together (NCCL groups): a batch
  // must hold every post that another device's batch waits on.
  bool batches = false;
  // Buffers live in device memory: copy, zero, add and scratch are the transport's own.
  bool device_memory = false;
  // A pair's transfers (or a group's broadcasts) match in the order they are issued, whatever
  // their tags (NCCL; MPI's native broadcasts): the engine then posts nothing of an operation
  // but inside its own calls (no InFlight::poll while waiting on another), so that every device
  // issues in its program's order; the devices must then wait on their operations in one order.
  bool ordered_matching = false;
  // The largest data tag; tags above it are the transport's own (control messages).
  int max_tag = 32767;
  // The most scratch memory a chain stages a strided box through (per chain and device; at
  // least one chunk).
  std::size_t chain_staging_bytes = std::size_t{16} << 20;
};

class Transport {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Transport() = default;

  virtual int rank() const = 0;  // this device's id
  virtual int size() const = 0;  // devices in the world
  virtual std::string name() const = 0;
  virtual TransportCaps caps() const = 0;

  // Non-blocking point-to-point; the region stays valid until the request completes. Messages
  // with the same (source, destination, tag) match in posting order.
  virtual Request post_send(const Region& from, int dst, int tag) = 0;
  virtual Request post_recv(const Region& to, int src, int tag) = 0;
  // A native broadcast from `root` to the other devices of `group` (caps().multicast ==
  // Native; the default throws InternalError).
  virtual Request post_broadcast(const Region& region, int root, std::span<const int> group,
                                 int tag);
  // The chunk a chain over `members` (root first) moves in (caps().multicast == Chain).
  virtual std::size_t chain_chunk(std::span<const int> members) const {
    (void)members;
    return std::size_t{256} << 10;
  }
  // Whether the request completed (moves the transport's traffic on; throws on failure).
  virtual bool test(Request::Impl& r) = 0;
  // One step of waiting: for `waiting` (a request of this transport) or, when null, for node
  // memory that `peers` will write. Moves this device's traffic on, may block briefly (until
  // something may have changed), and throws CommError naming the device that failed, or when
  // nothing completed since `since` for longer than the transport's timeout. `polls` counts
  // the steps since the last progress (a transport spins first, then yields).
  virtual void idle(const Request::Impl* waiting, std::span<const int> peers, int polls,
                    Clock::time_point since) = 0;
  // Throws the CommError a peer gave up with, if its notice has come (MPI and UCX look at most
  // once a millisecond); called as an operation starts. A device whose sends complete at once
  // (small messages go eagerly) waits for nothing, where it would hear of it: without this it would
  // go on for ever, step after step, beside a peer that gave the communicator up. The default has
  // no notices.
  virtual void check_peers() {}
  // Drops a request in flight: no peer reads or writes its region any more (best effort for a
  // request the peer already matched: abort() then ends the operation). One that may still
  // move data (MPI and UCX cannot stop a send the peer matched) is kept by the transport until
  // settle_cancelled() finds it ended.
  virtual void cancel(Request::Impl& r) = 0;
  // Moves traffic on until every request cancelled since the last call has ended or `until` has
  // passed; true when none is left: their regions are no longer read or written. Those still
  // going are kept (ended when they end) but not waited for again.
  virtual bool settle_cancelled(Clock::time_point until) {
    (void)until;
    return true;
  }

  // Batches (caps().batches): the engine brackets the posts of one phase with these.
  virtual void begin_batch() {}
  virtual void end_batch() {}

  // Work on this device's own memory; the defaults work on host memory. A transport may queue
  // it (a GPU stream), ordered before the sends, receives and multicasts posted after it:
  // settle() waits for everything queued, after which the host may read the memory or free
  // it. The engine settles before a transfer completes; Communicator::copy and the others
  // settle each call.
  virtual void copy(const Region& from, const Region& to) { copy_region(from, to); }
  virtual void zero(const Region& r) { zero_region(r); }
  virtual void add(const Region& from, const Region& to, DType dtype) {
    accumulate(from, to, dtype);
  }
  // Element-wise dtype conversion (the sender-side cast of whole-model sync): round to nearest
  // even when narrowing, exact when widening; see convert_region for the pairs supported.
  virtual void convert(const Region& from, DType from_type, const Region& to, DType to_type) {
    convert_region(from, from_type, to, to_type);
  }
  virtual void settle() {}
  // Memory for the engine's staging, freed only after the local work queued on it.
  virtual std::shared_ptr<void> scratch(std::size_t bytes);

  // Memory shared with the devices of this node, where the transport maps it: device d's segment
  // of node_segment_bytes() bytes, or nullptr. The default has none.
  virtual std::byte* node_segment(int device) {
    (void)device;
    return nullptr;
  }
  virtual std::size_t node_segment_bytes() const { return 0; }

  // Every device of the world; collective. While it waits it calls `meanwhile` now and then:
  // the engine moves its operations in flight on there, since a peer may need this device's part
  // of one before it enters the barrier.
  virtual void barrier(const std::function<void()>& meanwhile) = 0;
  // This device gives up on what is in flight because of `why` (a CommError naming the device
  // that failed, or this device's own error): tell the peers at once, so that they end with
  // that error instead of their timeout, and make sure no peer still reads this device's
  // buffers once it returns. Best effort.
  virtual void abort(const Error& why) = 0;
};

}  // namespace meshcast
