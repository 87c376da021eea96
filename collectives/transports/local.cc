// The in-process backend. A send is matched with its receive in the receiver's inbox; the
// receiving thread then copies straight from the sender's region into its own (one copy, no
// staging), and marks both requests complete.
#include "meshcast/local.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "arrived.h"
#include "lib/support/parallel_for.h"
#include "lib/support/saturated.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/reshard.h"
#include "meshcast/testing.h"

namespace meshcast {
namespace {

using Clock = std::chrono::steady_clock;

// A send's region is read by the receiving thread; its owner may leave (and free the region) only
// once no receiver can still be reading it: states move Posted -> Copying -> Done under the
// receiver, or Posted -> Cancelled under the owner when it abandons the operation.
enum class SendState : int { Posted, Copying, Done, Cancelled };

struct LocalRequest : Request::Impl {
  Region region;
  int owner = -1;  // the peer: the receiver of a send, the sender of a receive
  int tag = 0;
  bool is_send = false;
  std::atomic<bool> done{false};
  std::atomic<SendState> state{SendState::Posted};  // sends only
  std::shared_ptr<LocalRequest> send;               // a matched receive: its send
  // A receive whose message had another length (what was sent; else -1): it completes, as MPI's
  // and UCX's do, and its test() fails once, naming the sender.
  std::int64_t wrong_length = -1;
};

std::uint64_t key(int peer, int tag) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(peer)) << 32) |
         static_cast<std::uint32_t>(tag);
}

// Requests waiting for their match, per (peer, tag), oldest first.
using Queues = std::unordered_map<std::uint64_t, std::deque<std::shared_ptr<LocalRequest>>>;

// The oldest request queued under `k`, taken out; null if none. A queue that empties is erased:
// tags cycle through a group's window, and the empty queues kept would grow with every
// operation (to 1.4 KB per pair of devices and tag).
std::shared_ptr<LocalRequest> take(Queues& queues, std::uint64_t k) {
  const auto it = queues.find(k);
  if (it == queues.end() || it->second.empty()) return nullptr;
  auto r = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues.erase(it);
  return r;
}

}  // namespace

struct LocalWorld::State {
  struct Inbox {
    std::mutex m;
    std::condition_variable cv;
    Queues unexpected, posted;
    std::vector<std::shared_ptr<LocalRequest>> ready;  // matched receives, to copy
  };
  State(int n, std::size_t segment_bytes)
      : inboxes(static_cast<std::size_t>(n)),
        left(static_cast<std::size_t>(n)),
        absent(static_cast<std::size_t>(n), 0),
        entered(static_cast<std::size_t>(n), 0),
        segment_bytes(segment_bytes) {
    // Zeroed, on cache lines, as node.cc expects of node memory.
    for (int d = 0; segment_bytes && d < n; ++d) {
      segments.emplace_back(
          static_cast<std::byte*>(::operator new[](segment_bytes, std::align_val_t{64})));
      std::memset(segments.back().get(), 0, segment_bytes);
    }
  }

  // The run's first failure, which every device waiting ends with: `rank`'s own error (its
  // function threw), or the one a device gave up with (abort), which names the device at fault.
  void fail(int rank, const std::string& why) { fail(rank, CommError(rank, "failed: " + why)); }
  void fail(int rank, const CommError& error) {
    {
      std::lock_guard<std::mutex> g(fail_m);
      if (failed_rank >= 0) return;
      failure = error;
      failed_rank = rank;
    }
    for (auto& ib : inboxes) {
      std::lock_guard<std::mutex> g(ib.m);
      ib.cv.notify_all();
    }
    std::lock_guard<std::mutex> g(barrier_m);
    barrier_cv.notify_all();
  }
  // A device's function has returned and its sends are withdrawn: what waits on it now waits
  // forever, so it fails at once instead of after the timeout.
  void leave(int rank) {
    left[static_cast<std::size_t>(rank)] = true;
    for (auto& ib : inboxes) {
      std::lock_guard<std::mutex> g(ib.m);
      ib.cv.notify_all();
    }
    std::lock_guard<std::mutex> g(barrier_m);
    if (first_left < 0) first_left = rank;
    barrier_cv.notify_all();
  }
  // Why waiting on a device that left is hopeless: it returned, or it never ran (run() was
  // given other devices).
  std::string gone(int rank) const {
    return absent[static_cast<std::size_t>(rank)]
               ? "is not running (not among the devices of LocalWorld::run)"
               : "returned from its function";
  }
  // A device's copies moved on, or it arrived at a barrier: every wait of the world goes on
  // while some device progresses (a device waited on may be busy with other transfers first; a
  // barrier waits for devices with more to do). A stall of all of them for the timeout fails.
  void moved() { last_moved.store(Clock::now().time_since_epoch().count()); }
  Clock::time_point moved_at() const { return Clock::time_point(Clock::duration(last_moved)); }
  void check() {
    if (failed_rank >= 0) {
      std::lock_guard<std::mutex> g(fail_m);
      throw *failure;
    }
  }

  std::vector<Inbox> inboxes;
  std::vector<std::atomic<bool>> left;  // per device: its function has returned (or never ran)
  std::vector<char> absent;             // per device: not run (set before any device starts)
  std::atomic<int> failed_rank{-1};
  std::atomic<Clock::rep> last_moved{0};  // moved()
  std::mutex fail_m;
  std::optional<CommError> failure;
  std::mutex barrier_m;
  std::condition_variable barrier_cv;
  std::vector<int> members;  // the devices running
  int participants = 0, arrived = 0;
  int first_left = -1;                 // the first device whose function returned
  std::uint64_t generation = 0;        // barriers passed
  std::vector<std::uint64_t> entered;  // per device: barriers it entered
  std::chrono::milliseconds timeout{60000};
  std::size_t segment_bytes;
  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::vector<std::unique_ptr<std::byte[], AlignedDelete>> segments;  // node memory, per device
};

namespace {

class LocalTransport final : public Transport {
 public:
  LocalTransport(LocalWorld::State& s, int rank) : s_(s), rank_(rank) {}
  // The Communicator's owner may free its buffers next: no receiver may be reading them.
  ~LocalTransport() override { retract_sends(); }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(s_.inboxes.size()); }
  std::string name() const override { return "local"; }
  TransportCaps caps() const override {
    TransportCaps c;
    // The receivers' threads copy concurrently: a send to each is as fast as a chain and
    // copies each byte once per receiver either way.
    c.multicast = TransportCaps::Multicast::Fanout;
    // Tags are only hash keys here; the headroom keeps the engine's arithmetic on its last
    // tag from overflowing.
    c.max_tag = std::numeric_limits<int>::max() - 16;
    return c;
  }
  std::byte* node_segment(int device) override {
    if (s_.segments.empty() || device < 0 || device >= size()) return nullptr;
    return s_.segments[static_cast<std::size_t>(device)].get();
  }
  std::size_t node_segment_bytes() const override { return s_.segment_bytes; }

  Request post_send(const Region& from, int dst, int tag) override {
    auto req = make(from, dst, tag, true);
    if (sends_.size() >= prune_at_) {  // amortised: a plan posts many sends per device
      std::erase_if(sends_, [](const auto& w) {
        const auto r = w.lock();
        return !r || r->state.load() == SendState::Done;
      });
      prune_at_ = std::max<std::size_t>(64, 2 * sends_.size());
    }
    sends_.push_back(req);
    auto& ib = s_.inboxes[static_cast<std::size_t>(dst)];
    std::lock_guard<std::mutex> g(ib.m);
    if (auto recv = take(ib.posted, key(rank_, tag))) {
      recv->send = req;
      ib.ready.push_back(std::move(recv));
      ib.cv.notify_all();
    } else {
      ib.unexpected[key(rank_, tag)].push_back(req);
    }
    return Request(req);
  }

  Request post_recv(const Region& to, int src, int tag) override {
    auto req = make(to, src, tag, false);
    auto& ib = s_.inboxes[static_cast<std::size_t>(rank_)];
    std::lock_guard<std::mutex> g(ib.m);
    if (auto send = take(ib.unexpected, key(src, tag))) {
      req->send = std::move(send);
      ib.ready.push_back(req);
    } else {
      ib.posted[key(src, tag)].push_back(req);
    }
    return Request(req);
  }

  bool test(Request::Impl& impl) override {
    progress();
    s_.check();
    auto& r = static_cast<LocalRequest&>(impl);
    if (r.done && r.wrong_length >= 0)
      detail::check_arrived(r.owner, std::exchange(r.wrong_length, -1),
                            static_cast<std::int64_t>(r.region.bytes()));
    if (!r.done) {  // as idle() finds it: a loop of test() alone would otherwise spin for ever
      auto& ib = s_.inboxes[static_cast<std::size_t>(rank_)];
      std::lock_guard<std::mutex> l(ib.m);
      check_owner_here(r, ib);
    }
    return r.done;
  }

  // A request: blocks on this device's inbox until it completes, a matched receive is ready to
  // copy (others may wait on it) or a device failed. Node memory, which nobody signals: spins,
  // then yields.
  void idle(const Request::Impl* waiting, std::span<const int> peers, int polls,
            Clock::time_point since) override {
    progress();
    s_.check();
    const auto deadline = std::max(since, s_.moved_at()) + s_.timeout;
    const auto* r = static_cast<const LocalRequest*>(waiting);
    if (!r) {
      // A peer that left after writing what the caller waits for: the caller checks once more
      // (this wait's next poll) before the peer's leaving counts.
      if (polls == 1) left_polls_ = 0;
      bool left = false;
      for (int p : peers)
        if (s_.left[static_cast<std::size_t>(p)]) {
          left = true;
          if (left_polls_ > 0)
            throw CommError(p, s_.gone(p) + " while device " + std::to_string(rank_) +
                                   " waits on its node memory");
        }
      left_polls_ = left ? left_polls_ + 1 : 0;
      if (left) return;
      if (Clock::now() > deadline)
        throw CommError(peers.empty() ? rank_ : peers.front(),
                        "no progress for " + std::to_string(s_.timeout.count()) +
                            " ms waiting on its node memory");
      if (polls > 16) std::this_thread::yield();
      return;
    }
    auto& ib = s_.inboxes[static_cast<std::size_t>(rank_)];
    std::unique_lock<std::mutex> l(ib.m);
    const auto& gone = s_.left[static_cast<std::size_t>(r->owner)];
    // Back every 10 ms while nothing happens: the waiter's checks run meanwhile
    // (Communicator::while_waiting_, every 64 polls).
    if (!ib.cv.wait_until(l, std::min(deadline, Clock::now() + std::chrono::milliseconds(10)), [&] {
          return r->done || !ib.ready.empty() || s_.failed_rank >= 0 || gone;
        })) {
      if (Clock::now() < deadline) return;
      throw CommError(r->owner, "no progress for " + std::to_string(s_.timeout.count()) +
                                    " ms (device " + std::to_string(rank_) +
                                    " waits on a transfer with it)");
    }
    if (s_.failed_rank < 0) check_owner_here(*r, ib);
  }

  void cancel(Request::Impl& impl) override {
    auto& r = static_cast<LocalRequest&>(impl);
    if (r.is_send) {
      retract(r);
      return;
    }
    // A receive is copied by this thread only: once out of the queues, nothing writes it.
    auto& ib = s_.inboxes[static_cast<std::size_t>(rank_)];
    std::lock_guard<std::mutex> g(ib.m);
    auto drop = [&](auto& q) {
      std::erase_if(q, [&](const std::shared_ptr<LocalRequest>& p) { return p.get() == &r; });
    };
    if (auto it = ib.posted.find(key(r.owner, r.tag)); it != ib.posted.end()) {
      drop(it->second);
      if (it->second.empty()) ib.posted.erase(it);
    }
    drop(ib.ready);
  }

  // Before the caller unwinds and frees its buffers: no receiver may start reading them, and
  // the one that may be reading now has finished. The peers end with `why` at once, as a
  // failure notice ends them on the other transports; the device it names is the one at fault.
  void abort(const Error& why) override {
    retract_sends();
    const int at_fault = why.device() >= 0 ? why.device() : rank_;
    s_.fail(at_fault, why.device() >= 0 ? CommError(why.device(), why.cause(), why.field())
                                        : CommError(why.field(), why.cause()));
  }

  void barrier(const std::function<void()>& meanwhile) override {
    std::unique_lock<std::mutex> l(s_.barrier_m);
    const auto gen = s_.generation;
    ++s_.entered[static_cast<std::size_t>(rank_)];
    if (++s_.arrived == s_.participants) {
      s_.arrived = 0;
      ++s_.generation;
      s_.barrier_cv.notify_all();
      return;
    }
    // Arriving is progress: devices still coming (a thousand threads allocating their buffers on
    // two cores) keep the others waiting, as copies do.
    s_.moved();
    const auto entered = Clock::now();
    const auto deadline = [&] { return std::max(entered, s_.moved_at()) + s_.timeout; };
    const auto passed = [&] {
      return s_.generation != gen || s_.failed_rank >= 0 || s_.first_left >= 0;
    };
    bool woken = false;
    // Back every millisecond, unlocked, for `meanwhile`, until the deadline; in a world of more
    // than 50 devices every participants x 20 us, so that the waiters' wake-ups (a million a
    // second for 1,000 every millisecond) leave the cores to the devices still coming.
    const auto poll = std::chrono::microseconds(std::max(1000, 20 * s_.participants));
    while (
        !(woken = s_.barrier_cv.wait_until(l, std::min(deadline(), Clock::now() + poll), passed)) &&
        Clock::now() < deadline()) {
      l.unlock();
      meanwhile();
      l.lock();
    }
    if (s_.generation != gen) return;
    s_.check();
    // Blame a device that has not entered: the one that returned, if it is one of them.
    int missing = -1;
    for (int d : s_.members)
      if (s_.entered[static_cast<std::size_t>(d)] <= gen && (missing < 0 || d == s_.first_left))
        missing = d;
    if (!woken)
      throw CommError(missing, "did not reach the barrier in " +
                                   std::to_string(s_.timeout.count()) +
                                   " ms of no device's progress (device " + std::to_string(rank_) +
                                   " waits in it)");
    throw CommError(missing, "returned from its function before the barrier that device " +
                                 std::to_string(rank_) + " waits in");
  }

 private:
  std::shared_ptr<LocalRequest> make(const Region& r, int peer, int tag, bool is_send) {
    if (peer < 0 || peer >= size())
      throw ValidationError("peer", "device " + std::to_string(peer) + " is outside the world");
    auto req = std::make_shared<LocalRequest>();
    req->region = r;
    req->owner = peer;
    req->tag = tag;
    req->is_send = is_send;
    return req;
  }

  // A request not done whose peer's function returned (its sends withdrawn, its copies done
  // before: `left` is set after) with nothing of it waiting in this device's inbox (`ib.m` held)
  // never completes.
  void check_owner_here(const LocalRequest& r, const LocalWorld::State::Inbox& ib) const {
    if (s_.left[static_cast<std::size_t>(r.owner)] && !r.done && ib.ready.empty())
      throw CommError(r.owner, s_.gone(r.owner) + " with a transfer of device " +
                                   std::to_string(rank_) + " pending");
  }

  // Copies every matched receive of this device; true if any.
  bool progress() {
    auto& ib = s_.inboxes[static_cast<std::size_t>(rank_)];
    std::vector<std::shared_ptr<LocalRequest>> todo;
    {
      std::lock_guard<std::mutex> g(ib.m);
      todo.swap(ib.ready);
    }
    for (auto& r : todo) {
      auto posted = SendState::Posted;
      if (!r->send->state.compare_exchange_strong(posted, SendState::Copying))
        continue;  // its sender gave up: the failure it reports ends this wait
      if (r->send->region.bytes() != r->region.bytes()) {
        r->wrong_length = static_cast<std::int64_t>(r->send->region.bytes());
      } else if (r->send->region.count == r->region.count &&
                 r->send->region.elem_size == r->region.elem_size) {
        copy_region(r->send->region, r->region);
      } else {  // shapes differ (one side packed): go through the row-major element order
        std::vector<std::byte> tmp(r->region.bytes());
        pack(r->send->region, tmp.data());
        unpack(tmp.data(), r->region);
      }
      r->done = true;
      auto& sender = s_.inboxes[static_cast<std::size_t>(r->owner)];
      r->send->done = true;
      r->send->state = SendState::Done;
      std::lock_guard<std::mutex> g(sender.m);
      sender.cv.notify_all();
    }
    if (todo.empty()) return false;
    s_.moved();  // progress of the world: every wait goes on (State::moved)
    return true;
  }

  // A send no receiver may start copying any more; returns once one copying it has finished.
  static void retract(LocalRequest& r) {
    auto posted = SendState::Posted;
    if (r.state.compare_exchange_strong(posted, SendState::Cancelled)) return;
    while (r.state.load() == SendState::Copying) std::this_thread::yield();
  }

  void retract_sends() {
    for (auto& w : sends_)
      if (auto r = w.lock()) retract(*r);
    sends_.clear();
  }

  LocalWorld::State& s_;
  int rank_;
  std::vector<std::weak_ptr<LocalRequest>> sends_;  // this device's sends not seen complete
  std::size_t prune_at_ = 64;
  int left_polls_ = 0;  // node memory: this wait's polls since a peer was seen gone
};

}  // namespace

LocalWorld::LocalWorld(int size, std::size_t node_segment_bytes, double timeout_seconds) {
  if (size < 1) throw ValidationError("size", "a world needs at least one device");
  check_limit("size", size, limits().devices, "DEVICES");
  if (!(timeout_seconds > 0 && timeout_seconds <= 1e6))
    throw ValidationError("timeout_seconds", "must be in (0, 1e6] seconds");
  // Every device's segment is allocated and zeroed here: bounded first, as buffers are.
  check_limit("node_segment_bytes",
              detail::saturated_int64(static_cast<double>(node_segment_bytes) * size),
              limits().buffer_bytes, "BUFFER_BYTES");
  state_ = std::make_shared<State>(size, node_segment_bytes);
  state_->timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_seconds * 1000));
}

LocalWorld::~LocalWorld() = default;

int LocalWorld::size() const { return static_cast<int>(state_->inboxes.size()); }

void LocalWorld::run(const std::function<void(Communicator&)>& fn,
                     const std::vector<int>& devices) {
  std::vector<int> ranks = devices;
  if (ranks.empty())
    for (int r = 0; r < size(); ++r) ranks.push_back(r);
  std::vector<bool> named(size());
  for (int r : ranks) {
    if (r < 0 || r >= size())
      throw ValidationError("devices", "device " + std::to_string(r) + " is outside the world");
    if (named[r])  // two threads would share its inbox
      throw ValidationError("devices", "device " + std::to_string(r) + " is named twice");
    named[r] = true;
  }
  // A thread each: bounded before any starts.
  check_limit("local devices", static_cast<std::int64_t>(ranks.size()), limits().local_threads,
              "LOCAL_THREADS");
  // A fresh world state for each run: nothing left from a failed one.
  const auto timeout = state_->timeout;
  state_ = std::make_shared<State>(size(), state_->segment_bytes);
  state_->timeout = timeout;
  state_->members = ranks;
  state_->participants = static_cast<int>(ranks.size());
  // A device not run never sends or receives: a wait on it fails at once, as on one returned.
  for (int r = 0; r < size(); ++r)
    if (!named[static_cast<std::size_t>(r)]) {
      state_->absent[static_cast<std::size_t>(r)] = 1;
      state_->left[static_cast<std::size_t>(r)] = true;
    }
  std::vector<std::exception_ptr> errors(ranks.size());
  // Tells the others that device i failed. The message is allocated: out of memory (the others'
  // threads hold it), that throws too, and a throw out of the thread ended the process. Then
  // the others learn of it as it leaves, and the run reports their failure, not its.
  const auto failed = [&](std::size_t i, const char* why) {
    try {
      state_->fail(ranks[i], why);
    } catch (...) {
    }
  };
  const auto device = [&](std::size_t i) {
    {
      std::unique_ptr<Communicator> comm;  // (its making may fail too: out of memory)
      try {
        comm = std::make_unique<Communicator>(std::make_unique<LocalTransport>(*state_, ranks[i]));
        fn(*comm);
      } catch (const std::exception& e) {
        errors[i] = std::current_exception();
        failed(i, e.what());
      } catch (...) {
        errors[i] = std::current_exception();
        failed(i, "unknown exception");
      }
    }  // its sends withdrawn
    state_->leave(ranks[i]);
  };
  std::vector<std::thread> threads;
  threads.reserve(ranks.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    try {
      threads.emplace_back(device, i);
    } catch (const std::exception& e) {
      // Out of threads or memory: the devices started would wait for ever on this one, so they
      // fail at once (or, with no memory even for that, after the timeout) and end first; the
      // error is built once their memory is back.
      failed(i, "could not start its thread");
      for (auto& t : threads) t.join();
      throw InternalError("local devices", "cannot start device " + std::to_string(ranks[i]) +
                                               "'s thread (" + std::to_string(i) + " of " +
                                               std::to_string(ranks.size()) +
                                               " started): " + e.what());
    }
  }
  for (auto& t : threads) t.join();
  // The failing device's own exception, not the CommErrors it caused elsewhere.
  const int first = state_->failed_rank;
  for (std::size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == first && errors[i]) std::rethrow_exception(errors[i]);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

LocalRun run_local(const Plan& plan, int iters, bool verify) {
  if (iters < 1) throw ValidationError("iters", "must be >= 1");
  const auto devices = plan.devices();
  const Layout& src = plan.src();
  const Layout& dst = plan.dst();
  const std::size_t elem = dtype_size(src.dtype());
  LocalWorld world(devices.back() + 1);
  LocalRun out;
  out.seconds.resize(static_cast<std::size_t>(iters));
  std::atomic<std::int64_t> mismatches{0};
  std::vector<Clock::time_point> starts(devices.size()), ends(devices.size());
  // Sources are filled before the devices start: inside the run, a device filling a tile of
  // 6e9 elements kept the others waiting in the first barrier past the world's timeout (exit 3).
  std::vector<std::vector<std::byte>> sources(devices.size());
  detail::parallel_for(devices.size(), [&](std::size_t k) {
    if (!src.mesh().contains(devices[k])) return;
    sources[k].resize(static_cast<std::size_t>(src.local_elements(devices[k])) * elem);
    fill_source(src, devices[k], sources[k].data());
  });
  world.run(
      [&](Communicator& comm) {
        const int me = comm.rank();
        // An iteration lasts from the first device's start to the last device's end: one
        // thread's view between barriers is wrong when it wakes late on a busy machine.
        const std::size_t slot = static_cast<std::size_t>(
            std::lower_bound(devices.begin(), devices.end(), me) - devices.begin());
        const std::vector<std::byte>& s = sources[slot];
        std::vector<std::byte> d;
        if (dst.mesh().contains(me))
          d.resize(static_cast<std::size_t>(dst.local_elements(me)) * elem);
        for (int it = -1; it < iters; ++it) {  // iteration -1 warms up
          comm.barrier();
          starts[slot] = Clock::now();
          reshard(plan, comm, s.empty() ? nullptr : s.data(), d.empty() ? nullptr : d.data());
          ends[slot] = Clock::now();
          comm.barrier();
          if (it >= 0 && slot == 0)
            out.seconds[static_cast<std::size_t>(it)] =
                std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) -
                                              *std::min_element(starts.begin(), starts.end()))
                    .count();
        }
        if (verify && dst.mesh().contains(me)) mismatches += count_mismatches(dst, me, d.data());
      },
      devices);
  out.mismatches = verify ? mismatches.load() : 0;
  return out;
}

}  // namespace meshcast
