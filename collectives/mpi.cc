// The MPI backend. Regions travel without a pack: contiguous ones as bytes, strided ones as an
// MPI subarray datatype. Broadcasts use MPI_Ibcast on a sub-communicator cached per device set.
// Waits poll with a deadline so that a lost peer becomes a CommError, not a hang.
#include "meshcast/mpi.h"

#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "meshcast/error.h"
#include "watchdog.h"

namespace meshcast {
namespace {

using Clock = std::chrono::steady_clock;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw CommError("mpi",
                  std::string(what) + ": " + std::string(msg, static_cast<std::size_t>(len)));
}

struct MpiRequest : Request::Impl {
  std::vector<MPI_Request> reqs;
  MPI_Datatype type = MPI_DATATYPE_NULL;  // owned, when not a predefined type
  std::vector<int> peers;                 // for error messages
  ~MpiRequest() override {
    if (type != MPI_DATATYPE_NULL) MPI_Type_free(&type);
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
    MPI_Type_free(&block);
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
  MPI_Type_free(&elem);
  check(MPI_Type_commit(&box), "MPI_Type_commit");
  return {base, 1, box, true};
}

// A request for one wire piece; `post` starts the MPI operation into req->reqs[0].
template <class Post>
Request start(const Region& r, int peer, Post&& post) {
  auto req = std::make_shared<MpiRequest>();
  const Wire w = wire_of(r);
  if (w.owned) req->type = w.type;
  req->peers = {peer};
  req->reqs.emplace_back();
  post(w, &req->reqs.back());
  return Request(std::move(req));
}

int rank_of(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}
int size_of(MPI_Comm c) {
  int n = 0;
  MPI_Comm_size(c, &n);
  return n;
}

class MpiComm final : public Communicator {
 public:
  MpiComm(MPI_Comm comm, const MpiOptions& o)
      : comm_(comm),
        timeout_(o.timeout_seconds),
        opt_(o),
        watchdog_(control_, rank_of(comm), size_of(comm), o.timeout_seconds) {
    control_.comm = comm_;
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    // Control messages use the highest tags, above every plan tag (< 32768).
    int* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found);
    control_.top_tag = found && ub ? *ub : 32767 + 3;
    // Each rank's node: the lowest world rank of its shared-memory communicator.
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    int leader = rank_;
    MPI_Comm_group(node, &group);
    MPI_Comm_group(comm_, &world);
    int zero = 0;
    MPI_Group_translate_ranks(group, 1, &zero, world, &leader);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    node_of_.resize(static_cast<std::size_t>(size_));
    MPI_Allgather(&leader, 1, MPI_INT, node_of_.data(), 1, MPI_INT, comm_);
    std::vector<detail::ProcessId> processes(static_cast<std::size_t>(size_));
    const detail::ProcessId me = detail::this_process();
    MPI_Allgather(me.data(), 3, MPI_UINT64_T, processes.data(), 3, MPI_UINT64_T, comm_);
    watchdog_.set_processes(processes);
    map_node_memory(node, o.node_segment_bytes);
    MPI_Comm_free(&node);
  }
  ~MpiComm() override {
    for (auto& [k, c] : groups_) MPI_Comm_free(&c);
    // Freeing the window is collective on the node: not with a failed peer (it could hang),
    // whichever transport of this process saw the failure.
    if (window_ != MPI_WIN_NULL && !failed()) MPI_Win_free(&window_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  // After a failure MPI_Finalize may wait forever on a dead rank: the session skips it.
  bool failed() const { return watchdog_.failed() || peer_failed_; }
  // Another transport of this process (UCX, NCCL) saw a peer fail.
  void mark_failed() { peer_failed_ = true; }

  Request isend(const Region& from, int dst, int tag) override { return p2p(from, dst, tag, true); }
  Request irecv(const Region& to, int src, int tag) override { return p2p(to, src, tag, false); }

  Request ibcast(const Region& region, int root, std::span<const int> group, int tag) override {
    if (opt_.broadcast == MpiOptions::Broadcast::Chain) {
      const bool crosses =
          std::any_of(group.begin(), group.end(), [&](int d) { return !same_node(d, root); });
      const std::size_t chunk =
          crosses ? std::min(opt_.chunk_bytes, opt_.network_chunk_bytes) : opt_.chunk_bytes;
      return ibcast_chain(region, root, group, tag, chunk, opt_.staging_bytes);
    }
    std::vector<int> members(group.begin(), group.end());
    std::sort(members.begin(), members.end());
    MPI_Comm sub = group_comm(members);
    const int sub_root =
        static_cast<int>(std::lower_bound(members.begin(), members.end(), root) - members.begin());
    (void)tag;  // collectives on one communicator match in call order, which is plan order
    return start(region, root, [&](const Wire& w, MPI_Request* q) {
      check(MPI_Ibcast(w.ptr, w.count, w.type, sub_root, sub, q), "MPI_Ibcast");
    });
  }

  std::byte* node_segment(int device) override {
    return segment_bytes_ && same_node(device, rank_) ? segments_[static_cast<std::size_t>(device)]
                                                      : nullptr;
  }
  std::size_t node_segment_bytes() const override { return segment_bytes_; }
  void idle(std::span<const int> peers, int polls, Clock::time_point since) override {
    advance_chains();                          // chains forward what arrived
    if ((polls & 15) == 0) watchdog_.watch();  // (its probe also lets MPI progress)
    if (Clock::now() - since > std::chrono::duration<double>(timeout_))
      watchdog_.diagnose(std::vector<int>(peers.begin(), peers.end()));
    if (polls > 64) sched_yield();
  }

  void barrier() override {
    auto req = std::make_shared<MpiRequest>();
    req->reqs.emplace_back();
    check(MPI_Ibarrier(comm_, &req->reqs.back()), "MPI_Ibarrier");
    wait_one(*req);
  }

 protected:
  void wait_one(Request::Impl& impl) override {
    auto& r = static_cast<MpiRequest&>(impl);
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    int polls = 0;
    while (true) {
      if (test_one(r)) return;
      if (advance_chains()) polls = 0;
      if ((polls & 15) == 0) watchdog_.watch();
      if (Clock::now() > deadline) watchdog_.diagnose(r.peers);
      // Spin briefly for latency, then yield the core (2-core machines run several ranks).
      // sched_yield, not a sleep: sleep_for(5 us) takes ~80 us here and, since vader moves a
      // large message only inside MPI calls of both sides, sleeping capped point-to-point at
      // ~1 GB/s (0.2x MPI_Send/MPI_Recv, bench/mpi_reshard group a); yield returns at once on
      // an idle core.
      if (++polls > 64) sched_yield();
    }
  }

  bool test_one(Request::Impl& impl) override {
    auto& r = static_cast<MpiRequest&>(impl);
    int done = 0;
    check(MPI_Testall(static_cast<int>(r.reqs.size()), r.reqs.data(), &done, MPI_STATUSES_IGNORE),
          "MPI_Testall");
    return done != 0;
  }

  void abandon(const std::string& field, const std::string& cause) override {
    watchdog_.abandon(field, cause);
    detail::linger([&] { return control_.drain(); });
  }

 private:
  // Control messages on the three highest tags.
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
      MPI_Isend(o->payload.data(), static_cast<int>(o->payload.size()), MPI_CHAR, peer, tag(kind),
                comm, &o->req);
      out.push_back(std::move(o));
      drain();
    }
    std::optional<Message> poll() override {
      for (Kind k : {Kind::Fail, Kind::Ping, Kind::Pong}) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, tag(k), comm, &flag, &st);
        if (!flag) continue;
        int n = 0;
        MPI_Get_count(&st, MPI_CHAR, &n);
        std::string payload(static_cast<std::size_t>(n), '\0');
        MPI_Recv(payload.data(), n, MPI_CHAR, st.MPI_SOURCE, tag(k), comm, MPI_STATUS_IGNORE);
        return Message{st.MPI_SOURCE, k, std::move(payload)};
      }
      return std::nullopt;
    }
    // Forgets sends that left; true when none is in flight.
    bool drain() {
      std::erase_if(out, [](const std::unique_ptr<Out>& o) {
        int f = 0;
        MPI_Test(&o->req, &f, MPI_STATUS_IGNORE);
        return f != 0;
      });
      return out.empty();
    }
    ~Control() override {
      for (auto& o : out) MPI_Request_free(&o->req);  // a dead peer never takes them
    }
  };

  Request p2p(const Region& r, int peer, int tag, bool send) {
    if (peer < 0 || peer >= size_)
      throw ValidationError("peer", "device " + std::to_string(peer) +
                                        " is outside the MPI world of " + std::to_string(size_) +
                                        " ranks");
    return start(r, peer, [&](const Wire& w, MPI_Request* q) {
      if (send)
        check(MPI_Isend(w.ptr, w.count, w.type, peer, tag, comm_, q), "MPI_Isend");
      else
        check(MPI_Irecv(w.ptr, w.count, w.type, peer, tag, comm_, q), "MPI_Irecv");
    });
  }

  // Sub-communicators are created once per device set; every member creates them in plan
  // order, so the blocking creation cannot deadlock.
  MPI_Comm group_comm(const std::vector<int>& members) {
    auto it = groups_.find(members);
    if (it != groups_.end()) return it->second;
    MPI_Group world, g;
    MPI_Comm_group(comm_, &world);
    MPI_Group_incl(world, static_cast<int>(members.size()), members.data(), &g);
    MPI_Comm c;
    check(MPI_Comm_create_group(comm_, g, 0x6d63, &c), "MPI_Comm_create_group");
    MPI_Group_free(&g);
    MPI_Group_free(&world);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    groups_.emplace(members, c);
    return c;
  }

  // A rank outside the communicator is on no node (its send fails with MPI's error later).
  bool same_node(int a, int b) const {
    const auto in = [&](int r) { return r >= 0 && r < size_; };
    return in(a) && in(b) &&
           node_of_[static_cast<std::size_t>(a)] == node_of_[static_cast<std::size_t>(b)];
  }

  // One shared window per node, `bytes` per rank (rounded to cache lines); every rank maps
  // its node peers' segments. Where MPI cannot make one, there is no node memory.
  void map_node_memory(MPI_Comm node, std::size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    unsigned long long least = bytes;  // the same size on every rank, or none
    MPI_Allreduce(MPI_IN_PLACE, &least, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm_);
    if (least == 0) return;
    std::byte* mine = nullptr;
    MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
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
      MPI_Group node_group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
      MPI_Comm_group(node, &node_group);
      MPI_Comm_group(comm_, &world);
      for (int i = 0; i < size_of(node) && ok; ++i) {
        int r = 0;
        MPI_Group_translate_ranks(node_group, 1, &i, world, &r);
        MPI_Aint size = 0;
        int unit = 0;
        void* base = nullptr;
        ok = MPI_Win_shared_query(window_, i, &size, &unit, &base) == MPI_SUCCESS &&
             static_cast<unsigned long long>(size) >= least + 64;
        segments[static_cast<std::size_t>(r)] = aligned(base);
      }
      MPI_Group_free(&node_group);
      MPI_Group_free(&world);
    }
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm_);
    if (!ok) {
      if (window_ != MPI_WIN_NULL) MPI_Win_free(&window_);
      return;
    }
    std::memset(aligned(mine), 0, least);
    segments_ = std::move(segments);
    segment_bytes_ = least;
    MPI_Barrier(node);  // every segment zeroed before anyone uses it
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 0;
  std::vector<int> node_of_;  // rank -> lowest world rank on its shared-memory node
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<std::byte*> segments_;  // rank -> its segment, where on this node
  std::size_t segment_bytes_ = 0;
  double timeout_;
  MpiOptions opt_;
  Control control_;
  detail::Watchdog watchdog_;
  std::map<std::vector<int>, MPI_Comm> groups_;
  bool peer_failed_ = false;
};

}  // namespace

struct MpiSession::Impl {
  bool owns = false;
  bool skip_finalize = false;
  std::unique_ptr<MpiComm> world;
};

MpiSession::MpiSession(int* argc, char*** argv, MpiOptions options)
    : impl_(std::make_unique<Impl>()) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    impl_->owns = true;
  }
  impl_->world = std::make_unique<MpiComm>(MPI_COMM_WORLD, options);
}

MpiSession::~MpiSession() {
  if (impl_->skip_finalize) impl_->world->mark_failed();
  const bool failed = impl_->world->failed();
  impl_->world.reset();
  // With a failed peer, finalizing could hang: leave it to process exit (mpirun reports it).
  if (impl_->owns && !failed) MPI_Finalize();
}

Communicator& MpiSession::world() { return *impl_->world; }

int MpiSession::rank() const { return impl_->world->rank(); }
int MpiSession::size() const { return impl_->world->size(); }

void MpiSession::on_failure() { impl_->skip_finalize = true; }

long long MpiSession::sum(long long value) {
  long long total = 0;
  check(MPI_Allreduce(&value, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  return total;
}

std::vector<std::vector<unsigned char>> MpiSession::allgather(
    const std::vector<unsigned char>& mine) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(n)), offs(static_cast<std::size_t>(n));
  check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
  int total = 0;
  for (int i = 0; i < n; ++i) {
    offs[static_cast<std::size_t>(i)] = total;
    total += lens[static_cast<std::size_t>(i)];
  }
  std::vector<unsigned char> all(static_cast<std::size_t>(total));
  check(MPI_Allgatherv(mine.data(), len, MPI_BYTE, all.data(), lens.data(), offs.data(), MPI_BYTE,
                       MPI_COMM_WORLD),
        "MPI_Allgatherv");
  std::vector<std::vector<unsigned char>> out;
  for (int i = 0; i < n; ++i) {
    const auto* p = all.data() + offs[static_cast<std::size_t>(i)];
    out.emplace_back(p, p + lens[static_cast<std::size_t>(i)]);
  }
  return out;
}

void MpiSession::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

}  // namespace meshcast
