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
#include <map>
#include <thread>

#include "meshcast/error.h"

namespace meshcast {
namespace {

using Clock = std::chrono::steady_clock;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw CommError("mpi", std::string(what) + ": " + std::string(msg, static_cast<std::size_t>(len)));
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
    std::int64_t off = 0, stride = 1;  // element offset of the box origin
    for (std::size_t d = r.extent.size(); d-- > 0;) {
      off += r.offset[d] * stride;
      stride *= r.extent[d];
    }
    void* p = base + off * static_cast<std::int64_t>(r.elem_size);
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

class MpiComm final : public Communicator {
 public:
  MpiComm(MPI_Comm comm, const MpiOptions& o) : comm_(comm), timeout_(o.timeout_seconds), opt_(o) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    // Control messages use the highest tags, above every plan tag (< 32768).
    int* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found);
    const int top = found && ub ? *ub : 32767 + 3;
    tag_fail_ = top;
    tag_ping_ = top - 1;
    tag_pong_ = top - 2;
  }
  ~MpiComm() override {
    for (auto& [k, c] : groups_) MPI_Comm_free(&c);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  // After a failure MPI_Finalize may wait forever on a dead rank: the session skips it.
  bool failed() const { return failed_; }

  Request isend(const Region& from, int dst, int tag) override {
    return p2p(from, dst, tag, true);
  }
  Request irecv(const Region& to, int src, int tag) override { return p2p(to, src, tag, false); }

  Request ibcast(const Region& region, int root, std::span<const int> group, int tag) override {
    if (opt_.broadcast == MpiOptions::Broadcast::Chain)
      return ibcast_chain(region, root, group, tag, opt_.chunk_bytes);
    std::vector<int> members(group.begin(), group.end());
    std::sort(members.begin(), members.end());
    MPI_Comm sub = group_comm(members);
    const int sub_root = static_cast<int>(std::lower_bound(members.begin(), members.end(), root) -
                                          members.begin());
    (void)tag;  // collectives on one communicator match in call order, which is plan order
    return start(region, root, [&](const Wire& w, MPI_Request* q) {
      check(MPI_Ibcast(w.ptr, w.count, w.type, sub_root, sub, q), "MPI_Ibcast");
    });
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
      if ((polls & 15) == 0) watch();
      if (Clock::now() > deadline) diagnose(r.peers);
      // Spin briefly for latency, then yield the core (2-core machines run several ranks).
      // sched_yield, not a sleep: a sleep lasts >= ~55 us (timer slack) and, since vader moves a
      // large message only inside MPI calls of both sides, capped point-to-point at ~1 GB/s
      // (0.2x MPI_Send/MPI_Recv, bench/mpi_reshard group a); yield returns at once on an idle core.
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
    failed_ = true;
    notice_ = field + "\n" + cause;
    std::vector<MPI_Request> sent;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      sent.emplace_back();
      MPI_Isend(notice_.data(), static_cast<int>(notice_.size()), MPI_CHAR, p, tag_fail_, comm_,
                &sent.back());
    }
    // Small messages leave at once; do not wait long for ranks that are gone.
    const auto until = Clock::now() + std::chrono::seconds(1);
    int done = 0;
    while (!done && Clock::now() < until) {
      MPI_Testall(static_cast<int>(sent.size()), sent.data(), &done, MPI_STATUSES_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (auto& q : sent)
      if (q != MPI_REQUEST_NULL) MPI_Request_free(&q);
  }

 private:
  // Serves control traffic while waiting: answers liveness pings, and throws the error another
  // device abandoned with.
  void watch() {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, tag_fail_, comm_, &flag, &st);
    if (flag) {
      int n = 0;
      MPI_Get_count(&st, MPI_CHAR, &n);
      std::string msg(static_cast<std::size_t>(n), '\0');
      MPI_Recv(msg.data(), n, MPI_CHAR, st.MPI_SOURCE, tag_fail_, comm_, MPI_STATUS_IGNORE);
      const auto nl = msg.find('\n');
      failed_ = true;
      throw CommError(msg.substr(0, nl), nl == std::string::npos ? "failed" : msg.substr(nl + 1));
    }
    while (true) {
      MPI_Iprobe(MPI_ANY_SOURCE, tag_ping_, comm_, &flag, &st);
      if (!flag) break;
      MPI_Recv(nullptr, 0, MPI_BYTE, st.MPI_SOURCE, tag_ping_, comm_, MPI_STATUS_IGNORE);
      control_.emplace_back();
      MPI_Isend(nullptr, 0, MPI_BYTE, st.MPI_SOURCE, tag_pong_, comm_, &control_.back());
    }
    std::erase_if(control_, [](MPI_Request& q) {
      int f = 0;
      MPI_Test(&q, &f, MPI_STATUS_IGNORE);
      return f != 0;
    });
  }

  // No progress until the deadline: ask every other rank whether it is alive. Those that do
  // not answer within a grace period have failed; if all answer, the devices disagree.
  [[noreturn]] void diagnose(const std::vector<int>& peers) {
    std::vector<MPI_Request> pings;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      pings.emplace_back();
      MPI_Isend(nullptr, 0, MPI_BYTE, p, tag_ping_, comm_, &pings.back());
    }
    std::vector<char> answered(static_cast<std::size_t>(size_), 0);
    answered[static_cast<std::size_t>(rank_)] = 1;
    int missing = size_ - 1;
    const auto until = Clock::now() + std::chrono::duration<double>(std::min(5.0, timeout_));
    while (missing > 0 && Clock::now() < until) {
      watch();
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, tag_pong_, comm_, &flag, &st);
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      MPI_Recv(nullptr, 0, MPI_BYTE, st.MPI_SOURCE, tag_pong_, comm_, MPI_STATUS_IGNORE);
      if (!answered[static_cast<std::size_t>(st.MPI_SOURCE)]) --missing;
      answered[static_cast<std::size_t>(st.MPI_SOURCE)] = 1;
    }
    for (auto& q : pings)
      if (q != MPI_REQUEST_NULL) MPI_Request_free(&q);
    failed_ = true;
    std::string failed, waited;
    for (int p = 0; p < size_; ++p)
      if (!answered[static_cast<std::size_t>(p)]) failed += (failed.empty() ? "" : ",") + std::to_string(p);
    for (int p : peers) waited += (waited.empty() ? "" : ",") + std::to_string(p);
    if (!failed.empty())
      throw CommError("device " + failed, "failed: no progress for " + std::to_string(timeout_) +
                                              " s and no answer to a liveness check");
    throw CommError("device " + waited, "no progress for " + std::to_string(timeout_) +
                                            " s although every device is alive (plans disagree?)");
  }

  Request p2p(const Region& r, int peer, int tag, bool send) {
    if (peer < 0 || peer >= size_)
      throw ValidationError("peer", "device " + std::to_string(peer) + " is outside the MPI world of " +
                                        std::to_string(size_) + " ranks");
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

  MPI_Comm comm_;
  int rank_ = 0, size_ = 0;
  double timeout_;
  MpiOptions opt_;
  int tag_fail_ = 0, tag_ping_ = 0, tag_pong_ = 0;
  std::vector<MPI_Request> control_;  // pongs in flight
  std::string notice_;                // the abandon message being sent
  bool failed_ = false;
  std::map<std::vector<int>, MPI_Comm> groups_;
};

}  // namespace

struct MpiSession::Impl {
  bool owns = false;
  std::unique_ptr<MpiComm> world;
};

MpiSession::MpiSession(int* argc, char*** argv, MpiOptions options) : impl_(std::make_unique<Impl>()) {
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
  const bool failed = impl_->world->failed();
  impl_->world.reset();
  // With a failed peer, finalizing could hang: leave it to process exit (mpirun reports it).
  if (impl_->owns && !failed) MPI_Finalize();
}

Communicator& MpiSession::world() { return *impl_->world; }

long long MpiSession::sum(long long value) {
  long long total = 0;
  check(MPI_Allreduce(&value, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  return total;
}

std::vector<std::vector<unsigned char>> MpiSession::allgather(const std::vector<unsigned char>& mine) {
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
