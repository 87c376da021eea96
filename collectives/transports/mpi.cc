// The MPI transport. Regions travel without a pack: contiguous ones as bytes, strided ones as an
// MPI subarray datatype. Native broadcasts (MpiOptions::broadcast) use MPI_Ibcast on a
// sub-communicator cached per device set; chains are the engine's. Waits poll with a deadline
// (idle) so that a lost peer becomes a CommError, not a hang.
#include "meshcast/mpi.h"

#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "arrived.h"
#include "meshcast/error.h"
#include "meshcast/units.h"
#include "watchdog.h"

namespace meshcast {
namespace {

std::string error_string(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(msg, static_cast<std::size_t>(len));
}

// A failed MPI call of this process.
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw InternalError("mpi", std::string(what) + ": " + error_string(rc));
}

// Tests `req` until it completes; between tests `waiting(polls, waited)` may give up by throwing
// (a caller's timeout), and after a short spin the thread pauses 100 us so as not to hold a core.
template <class Waiting>
void poll_until_done(MPI_Request& req, Waiting&& waiting) {
  const auto since = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    waiting(polls, std::chrono::steady_clock::now() - since);
    if (polls > 64) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

struct MpiRequest : Request::Impl {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Datatype type = MPI_DATATYPE_NULL;  // owned, when not a predefined type
  std::vector<int> peers;                 // for error messages
  bool collective = false;                // MPI cannot cancel these
  std::int64_t expect = -1;               // a receive's bytes: MPI takes a shorter message silently
  ~MpiRequest() override {
    if (type != MPI_DATATYPE_NULL) (void)MPI_Type_free(&type);  // a destructor reports nothing
  }
};

// A region on the wire: always ONE (pointer, count, datatype) whose type signature is the
// region's bytes, so that a contiguous side matches a strided side of the same transfer.
struct Wire {
  void* ptr;
  int count;
  MPI_Datatype type;
  bool owned;
};

Wire wire_of(const Region& r) {
  auto* base = static_cast<std::byte*>(r.base);
  const std::size_t bytes = r.bytes();
  if (r.is_contiguous()) {
    void* p = r.origin();
    if (bytes <= INT_MAX) return {p, static_cast<int>(bytes), MPI_BYTE, false};
    // Beyond int counts: 1 MiB blocks plus the remainder, as one struct type.
    constexpr int kBlock = 1 << 20;
    MPI_Datatype block, big;
    check(MPI_Type_contiguous(kBlock, MPI_BYTE, &block), "MPI_Type_contiguous");
    int lens[2] = {static_cast<int>(bytes / kBlock), static_cast<int>(bytes % kBlock)};
    MPI_Aint disp[2] = {0, static_cast<MPI_Aint>(bytes / kBlock) * kBlock};
    MPI_Datatype types[2] = {block, MPI_BYTE};
    check(MPI_Type_create_struct(2, lens, disp, types, &big), "MPI_Type_create_struct");
    check(MPI_Type_free(&block), "MPI_Type_free");
    check(MPI_Type_commit(&big), "MPI_Type_commit");
    return {p, 1, big, true};
  }
  for (auto e : r.extent)
    if (e > INT_MAX) throw ValidationError("region", "a strided dimension exceeds MPI's int range");
  const int rank = static_cast<int>(r.extent.size());
  std::vector<int> sizes(r.extent.begin(), r.extent.end()), sub(r.count.begin(), r.count.end()),
      start(r.offset.begin(), r.offset.end());
  MPI_Datatype elem, box;
  check(MPI_Type_contiguous(static_cast<int>(r.elem_size), MPI_BYTE, &elem), "MPI_Type_contiguous");
  check(MPI_Type_create_subarray(rank, sizes.data(), sub.data(), start.data(), MPI_ORDER_C, elem,
                                 &box),
        "MPI_Type_create_subarray");
  check(MPI_Type_free(&elem), "MPI_Type_free");
  check(MPI_Type_commit(&box), "MPI_Type_commit");
  return {base, 1, box, true};
}

// A request for one wire piece; `post` starts the MPI operation into req->req.
template <class Post>
Request start(const Region& r, int peer, Post&& post) {
  auto req = std::make_shared<MpiRequest>();
  const Wire w = wire_of(r);
  if (w.owned) req->type = w.type;
  req->peers = {peer};
  post(w, &req->req);
  return Request(std::move(req));
}

int rank_of(MPI_Comm c) {
  int r = 0;
  check(MPI_Comm_rank(c, &r), "MPI_Comm_rank");
  return r;
}
int size_of(MPI_Comm c) {
  int n = 0;
  check(MPI_Comm_size(c, &n), "MPI_Comm_size");
  return n;
}

// The world rank of each rank of `sub` (a communicator made from `world`).
std::vector<int> world_ranks(MPI_Comm sub, MPI_Comm world) {
  MPI_Group g = MPI_GROUP_NULL, w = MPI_GROUP_NULL;
  check(MPI_Comm_group(sub, &g), "MPI_Comm_group");
  check(MPI_Comm_group(world, &w), "MPI_Comm_group");
  const int n = size_of(sub);
  std::vector<int> mine(static_cast<std::size_t>(n)), theirs(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) mine[static_cast<std::size_t>(i)] = i;
  check(MPI_Group_translate_ranks(g, n, mine.data(), w, theirs.data()),
        "MPI_Group_translate_ranks");
  check(MPI_Group_free(&g), "MPI_Group_free");
  check(MPI_Group_free(&w), "MPI_Group_free");
  return theirs;
}

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, const MpiOptions& o)
      : comm_(comm),
        rank_(rank_of(comm)),
        size_(size_of(comm)),
        opt_(o),
        watchdog_(control_, rank_, size_, o.timeout_seconds) {
    control_.comm = comm_;
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    // Control messages use the three highest tags; data tags stay below them (caps().max_tag).
    int* ub = nullptr;
    int found = 0;
    check(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found), "MPI_Comm_get_attr");
    control_.top_tag = found && ub ? *ub : 32767;  // the least MPI guarantees
    // Each rank's node: the lowest world rank of its shared-memory communicator.
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
          "MPI_Comm_split_type");
    int leader = world_ranks(node, comm_).front();
    node_of_.resize(static_cast<std::size_t>(size_));
    check(MPI_Allgather(&leader, 1, MPI_INT, node_of_.data(), 1, MPI_INT, comm_), "MPI_Allgather");
    std::vector<detail::ProcessId> processes(static_cast<std::size_t>(size_));
    const detail::ProcessId me = detail::this_process();
    check(MPI_Allgather(me.data(), 3, MPI_UINT64_T, processes.data(), 3, MPI_UINT64_T, comm_),
          "MPI_Allgather");
    watchdog_.set_processes(processes);
    map_node_memory(node, o.node_segment_bytes);
    check(MPI_Comm_free(&node), "MPI_Comm_free");
  }
  // Destructors report nothing: the frees below are best effort.
  ~MpiTransport() override {
    for (auto* v : {&cancelled_, &given_up_})
      for (auto& c : *v) {  // never ended: left to MPI (as a dead peer's are)
        (void)MPI_Request_free(&c.req);
        if (c.type != MPI_DATATYPE_NULL) (void)MPI_Type_free(&c.type);
      }
    for (auto& [k, c] : groups_) (void)MPI_Comm_free(&c);
    // Freeing the window is collective on the node: not with a failed peer (it could hang),
    // whichever transport of this process saw the failure.
    if (window_ != MPI_WIN_NULL && !failed()) (void)MPI_Win_free(&window_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  TransportCaps caps() const override {
    TransportCaps c;
    c.multicast = opt_.broadcast == MpiOptions::Broadcast::Native ? TransportCaps::Multicast::Native
                                                                  : TransportCaps::Multicast::Chain;
    c.ordered_matching = c.multicast == TransportCaps::Multicast::Native;  // (communicators')
    c.max_tag = control_.tag(Control::Kind::Pong) - 1;                     // the lowest control tag
    c.chain_staging_bytes = opt_.staging_bytes;
    return c;
  }
  // After a failure MPI_Finalize may wait forever on a dead rank: the session skips it.
  bool failed() const { return watchdog_.failed() || peer_failed_; }
  // Another transport of this process (UCX, NCCL) saw a peer fail.
  void mark_failed() { peer_failed_ = true; }

  Request post_send(const Region& from, int dst, int tag) override {
    return p2p(from, dst, tag, true);
  }
  Request post_recv(const Region& to, int src, int tag) override {
    return p2p(to, src, tag, false);
  }

  Request post_broadcast(const Region& region, int root, std::span<const int> group,
                         int tag) override {
    std::vector<int> members(group.begin(), group.end());
    std::sort(members.begin(), members.end());
    MPI_Comm sub = group_comm(members);
    const int sub_root =
        static_cast<int>(std::lower_bound(members.begin(), members.end(), root) - members.begin());
    // MPI matches collectives on one communicator in call order, not by tag (see
    // MpiOptions::broadcast).
    (void)tag;
    Request r = start(region, root, [&](const Wire& w, MPI_Request* q) {
      check(MPI_Ibcast(w.ptr, w.count, w.type, sub_root, sub, q), "MPI_Ibcast");
    });
    static_cast<MpiRequest*>(r.get())->collective = true;
    return r;
  }

  // A chain that crosses nodes moves in network chunks (see MpiOptions::network_chunk_bytes).
  std::size_t chain_chunk(std::span<const int> members) const override {
    const bool crosses = std::any_of(members.begin(), members.end(),
                                     [&](int d) { return !same_node(d, members.front()); });
    return crosses ? std::min(opt_.chunk_bytes, opt_.network_chunk_bytes) : opt_.chunk_bytes;
  }

  bool test(Request::Impl& impl) override {
    auto& r = static_cast<MpiRequest&>(impl);
    int done = 0;
    MPI_Status st;
    const bool active = r.req != MPI_REQUEST_NULL;  // a completed one reads back as done again
    const int rc = MPI_Test(&r.req, &done, r.expect >= 0 ? &st : MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS) {
      if (done && r.expect >= 0) {  // once: a completed request reads back as an empty one
        MPI_Count got = 0;
        check(MPI_Get_elements_x(&st, MPI_BYTE, &got), "MPI_Get_elements_x");
        detail::check_arrived(r.peers.front(), got, std::exchange(r.expect, -1));
      }
      if (!done)
        watchdog_.watch_sometimes();
      else if (active)
        watchdog_.progressed();
      return done != 0;
    }
    // A transfer MPI failed (a peer left, or sent more than was expected): the peer's doing.
    int error_class = 0;
    if (r.expect >= 0 && MPI_Error_class(rc, &error_class) == MPI_SUCCESS &&
        error_class == MPI_ERR_TRUNCATE)
      detail::arrived_longer(r.peers.front(), std::exchange(r.expect, -1));
    const std::string why = "transfer failed: " + error_string(rc);
    if (r.peers.empty()) throw CommError("mpi", why);
    watchdog_.peer_failed(r.peers.front(), why);
  }

  void idle(const Request::Impl* waiting, std::span<const int> peers, int polls,
            Clock::time_point since) override {
    if ((polls & 15) == 0) watchdog_.watch();  // (its probe also lets MPI progress)
    watchdog_.check_wait(
        since,
        waiting ? std::span<const int>(static_cast<const MpiRequest*>(waiting)->peers) : peers);
    // Spin briefly for latency, then yield the core (2-core machines run several ranks).
    // sched_yield, not a sleep: sleep_for(5 us) takes ~80 us here and, since vader moves a
    // large message only inside MPI calls of both sides, sleeping capped point-to-point at
    // ~1 GB/s (0.2x MPI_Send/MPI_Recv, bench/mpi_reshard group a); yield returns at once on
    // an idle core.
    if (polls > 64) sched_yield();
  }

  // Waits for a collective of the session's own exchanges (MpiSession::sum, allgather): blocking
  // MPI would wait for ever on a rank that died (mpirun --enable-recovery keeps the others
  // running). A dead peer on this machine, or a notice, is named at once; a silent one after
  // `timeout` seconds (Watchdog::diagnose).
  void wait_exchange(MPI_Request& req, double timeout) {
    poll_until_done(req, [&](int polls, Clock::duration waited) {
      // Watched only after a second: a rank that gave its part and ended (it reported its own
      // failure through this exchange) is not the others' failure, and they complete within
      // milliseconds of its part.
      if ((polls & 15) == 0 && waited > std::chrono::seconds(1)) watchdog_.watch();
      if (waited > std::chrono::duration<double>(timeout)) watchdog_.diagnose({}, timeout, true);
    });
  }

  void cancel(Request::Impl& impl) override {
    auto& r = static_cast<MpiRequest&>(impl);
    // MPI forbids cancelling or freeing a collective's request: it is left to complete (best
    // effort, as Transport::cancel allows).
    if (r.req == MPI_REQUEST_NULL || r.collective) return;
    check(MPI_Cancel(&r.req), "MPI_Cancel");
    // Open MPI cancels no send: one the peer matched goes on reading its region until it ends,
    // and a freed request would leave that to MPI_Finalize, after the region was freed.
    cancelled_.push_back(
        {std::exchange(r.req, MPI_REQUEST_NULL), std::exchange(r.type, MPI_DATATYPE_NULL)});
  }

  bool settle_cancelled(Clock::time_point until) override {
    const auto ended = [](std::vector<Cancelled>& v) {
      std::erase_if(v, [](Cancelled& c) {
        int done = 0;
        // An error ends it too: its peer failed, and MPI moves nothing more for it.
        if (MPI_Test(&c.req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
        if (done && c.type != MPI_DATATYPE_NULL) (void)MPI_Type_free(&c.type);
        return done != 0;
      });
    };
    ended(given_up_);  // looked at, not waited for: a later caller's wait is its own
    for (int polls = 0;; ++polls) {
      ended(cancelled_);
      if (cancelled_.empty()) return true;
      if (Clock::now() >= until) {
        given_up_.insert(given_up_.end(), cancelled_.begin(), cancelled_.end());
        cancelled_.clear();
        return false;
      }
      if (polls > 64) sched_yield();
    }
  }

  std::byte* node_segment(int device) override {
    return segment_bytes_ && same_node(device, rank_) ? segments_[static_cast<std::size_t>(device)]
                                                      : nullptr;
  }
  std::size_t node_segment_bytes() const override { return segment_bytes_; }

  void barrier(const std::function<void()>& meanwhile) override {
    MpiRequest r;
    r.collective = true;
    check(MPI_Ibarrier(comm_, &r.req), "MPI_Ibarrier");
    const auto since = Clock::now();
    for (int polls = 0; !test(r);) {
      idle(&r, {}, ++polls, since);
      meanwhile();
    }
  }

  void check_peers() override { watchdog_.check_notices(); }

  void abort(const Error& why) override {
    watchdog_.abandon(why);
    detail::linger([&] { return control_.drain(); });
  }

 private:
  // Control messages on the three highest tags. Sends to a peer MPI cannot reach are dropped:
  // the peer is gone, and the watchdog names it.
  struct Control final : detail::ControlChannel {
    MPI_Comm comm = MPI_COMM_NULL;
    int top_tag = 0;
    struct Out {
      MPI_Request req;
      std::string payload;
    };
    std::vector<std::unique_ptr<Out>> out;

    int tag(Kind k) const { return top_tag - static_cast<int>(k); }
    void post(int peer, Kind kind, const std::string& payload) override {
      auto o = std::make_unique<Out>(Out{MPI_REQUEST_NULL, payload});
      if (MPI_Isend(o->payload.data(), static_cast<int>(o->payload.size()), MPI_CHAR, peer,
                    tag(kind), comm, &o->req) == MPI_SUCCESS)
        out.push_back(std::move(o));
      drain();
    }
    // Two passes: Open MPI's MPI_Iprobe looks for a match before it moves traffic on, so a
    // message that came while this rank made no MPI call is found only by the next probe.
    std::optional<Message> poll() override {
      for (int pass = 0; pass < 2; ++pass)
        for (Kind k : {Kind::Fail, Kind::Ping, Kind::Pong}) {
          int flag = 0;
          MPI_Status st;
          check(MPI_Iprobe(MPI_ANY_SOURCE, tag(k), comm, &flag, &st), "MPI_Iprobe");
          if (!flag) continue;
          int n = 0;
          check(MPI_Get_count(&st, MPI_CHAR, &n), "MPI_Get_count");
          std::string payload(static_cast<std::size_t>(n), '\0');
          check(
              MPI_Recv(payload.data(), n, MPI_CHAR, st.MPI_SOURCE, tag(k), comm, MPI_STATUS_IGNORE),
              "MPI_Recv");
          return Message{st.MPI_SOURCE, k, std::move(payload)};
        }
      return std::nullopt;
    }
    // Forgets sends that left (or failed); true when none is in flight.
    bool drain() {
      std::erase_if(out, [](const std::unique_ptr<Out>& o) {
        int f = 0;
        return MPI_Test(&o->req, &f, MPI_STATUS_IGNORE) != MPI_SUCCESS || f != 0;
      });
      return out.empty();
    }
    ~Control() override {
      for (auto& o : out) (void)MPI_Request_free(&o->req);  // a dead peer never takes them
    }
  };

  Request p2p(const Region& r, int peer, int tag, bool send) {
    if (peer < 0 || peer >= size_)
      throw ValidationError("peer", "device " + std::to_string(peer) +
                                        " is outside the MPI world of " + std::to_string(size_) +
                                        " ranks");
    Request q = start(r, peer, [&](const Wire& w, MPI_Request* q) {
      if (send)
        check(MPI_Isend(w.ptr, w.count, w.type, peer, tag, comm_, q), "MPI_Isend");
      else
        check(MPI_Irecv(w.ptr, w.count, w.type, peer, tag, comm_, q), "MPI_Irecv");
    });
    if (!send) static_cast<MpiRequest*>(q.get())->expect = static_cast<std::int64_t>(r.bytes());
    return q;
  }

  // Sub-communicators are created once per device set; every member creates them in plan
  // order, so the blocking creation cannot deadlock.
  MPI_Comm group_comm(const std::vector<int>& members) {
    auto it = groups_.find(members);
    if (it != groups_.end()) return it->second;
    MPI_Group world, g;
    check(MPI_Comm_group(comm_, &world), "MPI_Comm_group");
    check(MPI_Group_incl(world, static_cast<int>(members.size()), members.data(), &g),
          "MPI_Group_incl");
    MPI_Comm c;
    check(MPI_Comm_create_group(comm_, g, 0x6d63, &c), "MPI_Comm_create_group");
    check(MPI_Group_free(&g), "MPI_Group_free");
    check(MPI_Group_free(&world), "MPI_Group_free");
    groups_.emplace(members, c);
    check(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    return c;
  }

  // A rank outside the communicator is on no node (its send fails with MPI's error later).
  bool same_node(int a, int b) const {
    const auto in = [&](int r) { return r >= 0 && r < size_; };
    return in(a) && in(b) &&
           node_of_[static_cast<std::size_t>(a)] == node_of_[static_cast<std::size_t>(b)];
  }

  // One shared window per node, `bytes` per rank (rounded to cache lines); every rank maps
  // its node peers' segments. Where MPI cannot make one, there is no node memory: the window's
  // calls are checked by hand for that.
  void map_node_memory(MPI_Comm node, std::size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    unsigned long long least = bytes;  // the same size on every rank, or none
    check(MPI_Allreduce(MPI_IN_PLACE, &least, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm_),
          "MPI_Allreduce");
    if (least == 0) return;
    std::byte* mine = nullptr;
    check(MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    // 64 bytes more than a segment, to start it on a cache line: Open MPI places the bases 8
    // bytes past one.
    int ok = MPI_Win_allocate_shared(static_cast<MPI_Aint>(least + 64), 64, MPI_INFO_NULL, node,
                                     &mine, &window_) == MPI_SUCCESS;
    const auto aligned = [](void* p) {
      const auto a = reinterpret_cast<std::uintptr_t>(p);
      return reinterpret_cast<std::byte*>((a + 63) / 64 * 64);
    };
    // Every node peer's segment, on a cache line (node.cc's lines and atomics).
    std::vector<std::byte*> segments(static_cast<std::size_t>(size_), nullptr);
    if (ok) {
      const std::vector<int> ranks = world_ranks(node, comm_);
      for (int i = 0; i < static_cast<int>(ranks.size()) && ok; ++i) {
        MPI_Aint size = 0;
        int unit = 0;
        void* base = nullptr;
        ok = MPI_Win_shared_query(window_, i, &size, &unit, &base) == MPI_SUCCESS &&
             static_cast<unsigned long long>(size) >= least + 64;
        segments[static_cast<std::size_t>(ranks[static_cast<std::size_t>(i)])] = aligned(base);
      }
    }
    check(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
    if (!ok) {
      if (window_ != MPI_WIN_NULL) check(MPI_Win_free(&window_), "MPI_Win_free");
      return;
    }
    std::memset(aligned(mine), 0, least);
    segments_ = std::move(segments);
    segment_bytes_ = least;
    check(MPI_Barrier(node), "MPI_Barrier");  // every segment zeroed before anyone uses it
  }

  MPI_Comm comm_;
  int rank_, size_;
  std::vector<int> node_of_;  // rank -> lowest world rank on its shared-memory node
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<std::byte*> segments_;  // rank -> its segment, where on this node
  std::size_t segment_bytes_ = 0;
  MpiOptions opt_;
  Control control_;
  detail::Watchdog watchdog_;
  std::map<std::vector<int>, MPI_Comm> groups_;
  bool peer_failed_ = false;
  struct Cancelled {
    MPI_Request req;
    MPI_Datatype type;  // owned, when not a predefined type
  };
  std::vector<Cancelled> cancelled_;  // cancel()'s, until settle_cancelled() finds them ended
  std::vector<Cancelled> given_up_;   // still going at a settle_cancelled() deadline
};

}  // namespace

// The buffers of a session's exchange. One that fails is left pending (MPI cannot cancel a
// collective): its buffers are kept with the session, which makes no MPI call after a failure.
struct ExchangeBuffers {
  long long value = 0, total = 0;
  int len = 0;
  std::vector<int> lens, offs;
  std::vector<unsigned char> mine, all;
};

struct MpiSession::Impl {
  MPI_Comm comm = MPI_COMM_WORLD;  // the session's: the world, or a duplicate of an attached one
  bool owns = false;
  bool skip_finalize = false;
  MpiTransport* transport = nullptr;  // the world's
  std::unique_ptr<Communicator> world;
  double exchange_timeout = 60;  // MpiOptions::exchange_timeout_seconds
  std::vector<std::unique_ptr<ExchangeBuffers>> failed_exchanges;
};

MpiSession::MpiSession(int* argc, char*** argv, MpiOptions options)
    : impl_(std::make_unique<Impl>()) {
  int inited = 0;
  check(MPI_Initialized(&inited), "MPI_Initialized");
  if (!inited) {
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    impl_->owns = true;
  }
  auto transport = std::make_unique<MpiTransport>(MPI_COMM_WORLD, options);
  impl_->transport = transport.get();
  impl_->exchange_timeout = options.exchange_timeout_seconds;
  impl_->world = std::make_unique<Communicator>(std::move(transport));
}

MpiSession::MpiSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<MpiSession> MpiSession::attach(const void* mpi_comm, MpiOptions options) {
  int inited = 0, finalized = 0;
  check(MPI_Initialized(&inited), "MPI_Initialized");
  check(MPI_Finalized(&finalized), "MPI_Finalized");
  if (!inited || finalized)
    throw ValidationError("comm", inited ? "MPI is already finalized" : "MPI is not initialised");
  if (!mpi_comm) throw ValidationError("comm", "null MPI communicator");
  auto impl = std::make_unique<Impl>();
  // Non-blocking, bounded by the timeout: a rank that never attaches (it failed before, or
  // exited) would hold the others in MPI_Comm_dup for ever. The others then fail by name; the
  // duplicate, never completed, cannot be cancelled and is left to the process's end (as is the
  // barrier below, with the duplicate it was on).
  const auto start = std::chrono::steady_clock::now();
  const auto within_timeout = [&](int, std::chrono::steady_clock::duration) {
    if (std::chrono::steady_clock::now() - start >
        std::chrono::duration<double>(options.timeout_seconds))
      throw CommError("comm", "not every rank of the communicator attached within " +
                                  human_seconds(options.timeout_seconds) +
                                  " (each calls this collectively, with the same communicator)");
  };
  MPI_Request dup = MPI_REQUEST_NULL;
  check(MPI_Comm_idup(*static_cast<const MPI_Comm*>(mpi_comm), &impl->comm, &dup), "MPI_Comm_idup");
  poll_until_done(dup, within_timeout);
  // The duplicate also completes for a rank that comes after another gave up on it (it completes
  // there as that one's MPI finalizes): a barrier on it, bounded alike, before the transport's
  // blocking collectives (MPI_Comm_split_type), which would wait for that one for ever.
  MPI_Request here = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(impl->comm, &here), "MPI_Ibarrier");
  poll_until_done(here, within_timeout);
  auto transport = std::make_unique<MpiTransport>(impl->comm, options);
  impl->transport = transport.get();
  impl->exchange_timeout = options.exchange_timeout_seconds;
  impl->world = std::make_unique<Communicator>(std::move(transport));
  return std::unique_ptr<MpiSession>(new MpiSession(std::move(impl)));
}

MpiSession::~MpiSession() {
  int finalized = 0;
  if (MPI_Finalized(&finalized) == MPI_SUCCESS && finalized) {
    // An attached session outlived the host program's MPI (mpi4py finalizes at exit): any MPI
    // call now is erroneous, so the endpoint is left to the process's end.
    (void)impl_->world.release();
    return;
  }
  if (impl_->skip_finalize) impl_->transport->mark_failed();
  // The end is collective (MPI_Win_free waits for the node, MPI_Finalize for the job): a peer
  // that died after its last transfer left both waiting forever. A barrier first, watched for a
  // peer that died (its pid ended, or it gave notice), which then skips them; a live peer slow
  // to end (still computing) is waited for, as MPI_Finalize would. Not while an exception
  // unwinds here: the peers may wait on this process for something else.
  if (!impl_->transport->failed() && std::uncaught_exceptions() == 0) {
    try {
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Ibarrier(impl_->comm, &req), "MPI_Ibarrier");
      impl_->transport->wait_exchange(req, std::numeric_limits<double>::infinity());
    } catch (const std::exception&) {
      impl_->transport->mark_failed();
    }
  }
  const bool failed = impl_->transport->failed();
  impl_->world.reset();
  if (impl_->comm != MPI_COMM_WORLD && !failed) (void)MPI_Comm_free(&impl_->comm);
  // With a failed peer, finalizing could hang: leave it to process exit (mpirun reports it).
  // A destructor reports nothing: MPI_Finalize's status is not looked at.
  if (impl_->owns && !failed) (void)MPI_Finalize();
}

Communicator& MpiSession::world() { return *impl_->world; }

int MpiSession::rank() const { return impl_->world->rank(); }
int MpiSession::size() const { return impl_->world->size(); }

void MpiSession::on_failure() { impl_->skip_finalize = true; }

void MpiSession::on_peer_failure(const Error& why) {
  impl_->skip_finalize = true;
  int finalized = 0;  // as in ~MpiSession: after MPI_Finalize no MPI call is allowed
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  // Given up, as a device that learned of a failure gives its communicator up: its peers will.
  if (!impl_->transport->failed()) impl_->world->abandon(why);
}

long long MpiSession::sum(long long value) {
  auto b = std::make_unique<ExchangeBuffers>();
  b->value = value;
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(&b->value, &b->total, 1, MPI_LONG_LONG, MPI_SUM, impl_->comm, &req),
        "MPI_Iallreduce");
  try {
    impl_->transport->wait_exchange(req, impl_->exchange_timeout);
  } catch (...) {
    impl_->failed_exchanges.push_back(std::move(b));
    throw;
  }
  return b->total;
}

std::vector<std::vector<unsigned char>> MpiSession::allgather(
    const std::vector<unsigned char>& mine) {
  const int n = size_of(impl_->comm);
  auto b = std::make_unique<ExchangeBuffers>();
  b->mine = mine;
  b->len = static_cast<int>(mine.size());
  b->lens.resize(static_cast<std::size_t>(n));
  b->offs.resize(static_cast<std::size_t>(n));
  MPI_Request req = MPI_REQUEST_NULL;
  try {
    check(MPI_Iallgather(&b->len, 1, MPI_INT, b->lens.data(), 1, MPI_INT, impl_->comm, &req),
          "MPI_Iallgather");
    impl_->transport->wait_exchange(req, impl_->exchange_timeout);
    int total = 0;
    for (int i = 0; i < n; ++i) {
      b->offs[static_cast<std::size_t>(i)] = total;
      total += b->lens[static_cast<std::size_t>(i)];
    }
    b->all.resize(static_cast<std::size_t>(total));
    check(MPI_Iallgatherv(b->mine.data(), b->len, MPI_BYTE, b->all.data(), b->lens.data(),
                          b->offs.data(), MPI_BYTE, impl_->comm, &req),
          "MPI_Iallgatherv");
    impl_->transport->wait_exchange(req, impl_->exchange_timeout);
  } catch (...) {
    impl_->failed_exchanges.push_back(std::move(b));
    throw;
  }
  std::vector<std::vector<unsigned char>> out;
  for (int i = 0; i < n; ++i) {
    const auto* p = b->all.data() + b->offs[static_cast<std::size_t>(i)];
    out.emplace_back(p, p + b->lens[static_cast<std::size_t>(i)]);
  }
  return out;
}

void MpiSession::abort(int code) {
  (void)MPI_Abort(impl_->comm, code);  // returns only if it failed: end this process anyway
  std::abort();
}

}  // namespace meshcast
