// One device's endpoint, for every transport: the progress engine over a Transport
// (meshcast/transport.h). It owns what is the same for all of them: chain broadcasts and their
// in-flight state, the wait loop, batches, and groups with their tag spaces. rank() is the
// device's global id. Sessions hand it out: LocalWorld::run, MpiSession::world(), ...
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meshcast/error.h"
#include "meshcast/multicast_tree.h"
#include "meshcast/region.h"
#include "meshcast/transport.h"

namespace meshcast {

class Communicator;
namespace detail {
class WaitHook;
}

// An operation in flight on a group (a reshard, a collective), as the engine sees it: when a
// later operation on the group needs the tags this one still holds, the engine finishes it first;
// while the device waits on anything, it moves the others on (poll), since a peer may be waiting
// on this device's part of one of them before it can complete what this device waits for (the
// members wait on their operations in different orders).
class InFlight {
 public:
  virtual ~InFlight() = default;
  virtual bool done() const = 0;
  virtual void finish() = 0;  // completes it (blocking); throws what the operation throws
  // Moves it on as far as it can without blocking (its test()); nothing while it is being
  // driven already (the wait that polls the others may be its own). Throws what it throws.
  virtual void poll() = 0;
};

// The tags of one operation on a group: tag(i) for its i-th message stream. Distinct from the
// tags of every other operation in flight on any group of the communicator.
class TagBlock {
 public:
  TagBlock() = default;
  TagBlock(int base, std::uint32_t start, std::uint32_t length, std::uint32_t window)
      : base_(base), start_(start), length_(length), window_(window) {}
  // Streams beyond the block's length reuse its tags in order. Posting in the same order on
  // both sides does not keep two messages of one pair on a tag apart where a chain forwards one
  // late: the reshard and sync executors never hold two on one tag in flight.
  int tag(std::size_t i) const {
    return base_ + static_cast<int>((start_ + i % length_) % window_);
  }
  std::uint32_t length() const { return length_; }

 private:
  int base_ = 0;
  std::uint32_t start_ = 0, length_ = 1, window_ = 1;
};

// Devices, in an order that defines their ranks within the group, with a tag space and a
// sequence of its own. Every operation on a group (reshard, collective) is started by every
// member, in the same order on every member (as on an MPI communicator); operations on
// different groups, and several operations in flight on one group, never confuse their messages,
// whatever order they complete in. Copies share the same group.
class Group {
 public:
  Group() = default;
  const std::vector<int>& devices() const;
  int size() const { return static_cast<int>(devices().size()); }
  bool contains(int device) const { return index_of(device) >= 0; }
  int index_of(int device) const;  // the device's rank in the group, -1 if not a member
  Communicator& comm() const;

  // The tags of this device's next operation on the group, `streams` message streams long (at
  // most the group's window; see TagBlock). `op` is the operation, tracked until it completes:
  // a later reservation that needs its tags finishes it first. Every member reserves the same
  // lengths in the same order.
  TagBlock reserve(std::size_t streams, std::weak_ptr<InFlight> op = {}) const;
  // For an operation that sends nothing (node memory): a 64-bit name of the group's next
  // operation, the same on every member, taken from the same sequence.
  std::uint64_t next_id() const;
  // Tags a group holds: operations whose streams add up to more than this, in flight at once,
  // are finished in order (a reservation waits for the oldest that holds its tags).
  std::uint32_t window() const;

  struct State;

 private:
  friend class Communicator;
  explicit Group(std::shared_ptr<State> s) : s_(std::move(s)) {}
  std::shared_ptr<State> s_;
};

class Communicator {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Communicator(std::unique_ptr<Transport> transport);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string backend() const;
  Transport& transport() { return *transport_; }
  const TransportCaps& caps() const { return caps_; }

  // Every device of the world, in id order.
  const Group& world() const { return world_; }
  // A group of `devices` (in that order). Every device of the communicator creates its groups
  // in the same order, members or not (as MPI_Comm_create): the n-th group is the same on all
  // of them. Throws ValidationError("group", ...) for an empty list, a device twice, one
  // outside the world, or more groups alive at once than the transport's tags can keep apart.
  Group group(std::vector<int> devices);

  // Point-to-point and multicast over the transport; tags come from a group's TagBlock.
  Request isend(const Region& from, int dst, int tag);
  Request irecv(const Region& to, int src, int tag);
  // From `root` to the other devices of `chain` (root first, then in forwarding order): the
  // root passes its source region, the others their destination region. Travels as the
  // transport says (TransportCaps::multicast); a chain pipelines chunks of at most
  // Transport::chain_chunk(), each member forwarding a chunk as soon as it arrived. `group` > 0
  // makes it a tree of chains over the receivers, `fork` > 0 splits them in two chains from the
  // root (meshcast/multicast_tree.h; Op::group, Op::fork): every member passes the same. A
  // native multicast or a fan-out ignores the order and the tree.
  Request ibcast(const Region& region, int root, std::span<const int> chain, int tag,
                 std::int64_t group = 0, std::int64_t fork = 0);
  // Brackets the posts of one phase (for transports that batch them).
  void begin_batch() { transport_->begin_batch(); }
  void end_batch() { transport_->end_batch(); }

  // Work on this device's own memory (host, or the transport's device memory), complete on
  // return (Transport::settle).
  void copy(const Region& from, const Region& to) {
    transport_->copy(from, to);
    transport_->settle();
  }
  void zero(const Region& r) {
    transport_->zero(r);
    transport_->settle();
  }
  void add(const Region& from, const Region& to, DType dtype) {
    transport_->add(from, to, dtype);
    transport_->settle();
  }
  void convert(const Region& from, DType from_type, const Region& to, DType to_type) {
    transport_->convert(from, from_type, to, to_type);
    transport_->settle();
  }
  std::shared_ptr<void> scratch(std::size_t bytes) { return transport_->scratch(bytes); }
  // Scratch that stays allocated for the next operation asking as much or less (a sync's
  // staging, every step): a fresh buffer pays its page faults on every use. Holds one buffer;
  // one still in use is never handed out twice.
  std::shared_ptr<void> kept_scratch(std::size_t bytes);

  // Completes a request (throws CommError if a peer failed); the request is reset. Every chain
  // of this device moves on while it waits.
  void wait(Request& r);
  void wait_all(std::span<Request> rs);
  // wait_all() on requests into memory that a failure frees as it unwinds (the caller's stack):
  // a failure first cancels them (cancel_and_settle), so that a receive a late peer matches does
  // not write into it afterwards.
  void wait_all_or_cancel(std::span<Request> rs);
  // After a failure: cancels each request and waits up to a second for them to end
  // (settle_cancelled). Best effort (MPI and UCX cannot stop what a peer already matched; the
  // peers, told, end theirs): throws nothing.
  void cancel_and_settle(std::span<Request> rs) noexcept;
  // True once a request completed (it stays valid; wait() on it returns at once).
  bool test(Request& r);
  // Moves this device's chains and its operations in flight on a step, as a wait does while it
  // blocks, at most once every 50 us and a fifth of the time: an operation's test() calls it
  // when not yet done, so that a loop testing one operation does not starve another that a
  // peer waits on, while a caller that tests each of many operations in turn does not poll
  // every one for each.
  void progress();
  // Drops a request in flight (Transport::cancel on each of its parts); the request is reset.
  // Its parts and their staging are kept until settle_cancelled() finds them ended.
  void cancel(Request& r);
  // Waits until the requests cancelled since the last call have ended or `until` has passed
  // (see Transport::settle_cancelled); true when their regions are the caller's again. Those
  // still going then are kept, and not waited for again.
  bool settle_cancelled(Clock::time_point until);
  // Every device of the world; collective. This device's chains complete first (their members
  // posted them too), so that none of its peers waits, behind the barrier, on a chunk it forwards.
  void barrier();

  // A check this device runs about every 50 ms while it blocks (a wait, a barrier, a collective
  // spinning on node memory): a Python binding's test for Ctrl-C. What it throws ends the wait
  // as any failure of this device does: the communicator is given up (abandon_for), its peers
  // end at once with an error naming this device, and the exception reaches the caller. Null:
  // none.
  void set_interrupt(std::function<void()> check) { interrupt_ = std::move(check); }

  // Gives up on what is in flight: the peers end with `why` at once (Transport::abort). Once: a
  // later call (an operation that fails because of the first) tells them nothing new. The
  // communicator is given up with it: every later operation that takes a group's tags or id
  // (reserve(), next_id(): a reshard, a sync, a collective, agree()) and every barrier throws
  // at once a CommError naming what `why` names, since its peers gave it up too and would leave
  // it to wait out its timeout. (A bare isend/irecv is not checked.) Those operations also
  // start by taking in a peer's notice that it gave the communicator up (Transport::check_peers),
  // which gives it up here too: a device whose sends complete at once would not hear it else.
  void abandon(const Error& why);
  // abandon() with what `e` says: an Error naming a failed device passes it on; anything else
  // says that this device failed. reshard() and the collectives call it as they throw.
  void abandon_for(const std::exception& e);

  // Every member of `group` learns whether any member failed: each passes its own error (null
  // when it succeeded); all of them then throw the same error, the failure of the member
  // first in group order (Error::agreed()), or all return. Collective over the group; a member
  // that died is reported as a peer failure (not agreed: the communicator is given up).
  void agree(const Group& group, const Error* mine);

  // Node memory (Transport::node_segment) and one step of spinning on it: moves this device's
  // chains on, then Transport::idle for `peers`.
  std::byte* node_segment(int device) { return transport_->node_segment(device); }
  std::size_t node_segment_bytes() const { return transport_->node_segment_bytes(); }
  void idle(std::span<const int> peers, int polls, Clock::time_point since);

 private:
  struct Chain;
  struct Composite;
  Request chain(const Region& region, std::span<const int> members, int tag, std::int64_t group,
                std::int64_t fork);
  bool advance_chain(Chain& c);
  bool advance_chains();
  // Polls every operation in flight on this device's groups (InFlight::poll), once at a time;
  // nothing where the transport matches in issue order (TransportCaps::ordered_matching).
  void poll_in_flight();
  void prune_in_flight();  // drops the done and the gone
  void wait_request(Request::Impl& r);
  void interrupt_point();  // runs interrupt_ if it is due
  void init_groups();

  friend class detail::WaitHook;
  friend class Group;
  // Run now and then while a wait blocks (detail::WaitHook, lib/exec/signatures.h): a check
  // that may end the wait by throwing.
  std::function<void()> while_waiting_;
  std::function<void()> interrupt_;  // set_interrupt's
  Clock::time_point next_interrupt_{};
  std::optional<CommError> abandoned_;  // abandon()'s why
  // Throws what abandoned_ says, or the notice of a peer that gave the communicator up.
  void check_live();

  std::unique_ptr<Transport> transport_;
  TransportCaps caps_;
  int rank_, size_;
  std::shared_ptr<void> kept_;
  std::size_t kept_bytes_ = 0;
  std::vector<std::weak_ptr<Chain>> chains_;
  Group world_;
  std::uint32_t window_ = 1, contexts_ = 1;  // tags per group, and groups the tag space holds
  std::uint64_t groups_made_ = 0;
  std::vector<std::weak_ptr<Group::State>> live_;   // per context: the group that holds it
  std::vector<std::weak_ptr<InFlight>> in_flight_;  // of every group (Group::reserve)
  std::vector<Request> cancelled_;  // cancel()'s, until settle_cancelled() finds them ended
  std::vector<Request> given_up_;   // still going at a settle_cancelled() deadline
  std::size_t prune_in_flight_at_ = 64;
  bool polling_ = false;               // inside poll_in_flight
  Clock::time_point next_progress_{};  // progress() does nothing before then
};

}  // namespace meshcast
