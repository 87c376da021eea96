// The NCCL transport. NCCL point-to-point calls must be issued together with their peers' calls:
// the posts of a batch (the engine's phase) are queued and issued as one ncclGroupStart/End at
// end_batch(); a post outside a batch is issued at once, as a group of its own. Strided boxes
// are packed on the stream before the group and unpacked after it. A request completes with an
// event recorded after its group (and its unpacks). Waits poll the event with a deadline, and
// abort the communicator on timeout or on NCCL's asynchronous error. Work on the device's own
// memory runs on a second stream, so that it never waits behind transfers in flight; it is
// queued, and the transfers' stream waits for it before its next pack or group (the engine
// posts a send only after the copies that fill its box). settle() waits for it on the host.
//
// Device memory comes from CUDA's stream-ordered allocator: cudaFree waits for the whole device,
// and so for an NCCL transfer in flight that may wait on a peer, which may wait on this device.
#include "meshcast/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshcast/error.h"
#include "nccl_kernels.h"

namespace meshcast {
namespace {

using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw InternalError("cuda", std::string(what) + ": " + cudaGetErrorString(e));
}

// A remote failure is the peers' (CommError); any other failed call is this process's.
void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  std::string cause = std::string(what) + ": " + ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) cause += std::string(" (") + last + ")";
  if (r == ncclRemoteError) throw CommError("nccl", cause);
  throw InternalError("nccl", cause);
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", s);
  return text;
}

// A region the kernels and NCCL can use: rank <= kMaxRank, and GPU memory (host memory
// would fault the kernels or NCCL, far from the caller's mistake).
void check_region(const Region& r, int device) {
  if (r.count.size() > static_cast<std::size_t>(detail::kMaxRank))
    throw ValidationError("region", "the NCCL transport supports tensors of rank <= " +
                                        std::to_string(detail::kMaxRank));
  if (r.elements() == 0) return;
  cudaPointerAttributes at{};
  cuda_check(cudaPointerGetAttributes(&at, r.base), "cudaPointerGetAttributes");
  if (at.type == cudaMemoryTypeUnregistered)
    throw ValidationError("buffer",
                          "host memory given to the nccl transport: its buffers must be GPU "
                          "memory (NcclSession::allocate, or a CUDA allocation)");
  if (at.type == cudaMemoryTypeDevice && at.device != device)
    throw ValidationError("buffer", "memory of GPU " + std::to_string(at.device) +
                                        " given to the nccl transport of GPU " +
                                        std::to_string(device));
}

// Device memory allocated in the order of `stream`, and freed in the order of `free_on` once
// the last owner lets go (a deleter cannot throw: a failed free leaves nothing to undo).
std::shared_ptr<void> stream_memory(std::size_t bytes, cudaStream_t stream, cudaStream_t free_on) {
  void* p = nullptr;
  cuda_check(cudaMallocAsync(&p, bytes ? bytes : 1, stream), "cudaMallocAsync");
  return std::shared_ptr<void>(p, [free_on](void* q) { (void)cudaFreeAsync(q, free_on); });
}

// Device memory for the caller, usable on any stream at once (its stream is idle), freed on
// the legacy stream: it may outlive the transport's streams.
std::shared_ptr<void> caller_memory(std::size_t bytes, cudaStream_t idle) {
  auto p = stream_memory(bytes, idle, cudaStreamLegacy);
  cuda_check(cudaStreamSynchronize(idle), "cudaMallocAsync");
  return p;
}

struct NcclRequest : Request::Impl {
  cudaEvent_t done = nullptr;  // recorded once its group is issued
  bool issued = false;
  int peer = -1;  // the device it waits on, for errors (-1: several)
  ~NcclRequest() override {
    if (done) (void)cudaEventDestroy(done);  // nothing to undo if it fails
  }
};

// A transfer waiting for its group. A strided box travels through `staging`, freed in stream
// order after the group (and the unpack) that uses it.
struct Op {
  enum Kind { Send, Recv, Bcast };
  Op(Kind k, std::size_t n, int p, std::shared_ptr<NcclRequest> r)
      : kind(k), bytes(n), peer(p), req(std::move(r)) {}
  Kind kind;
  std::size_t bytes;
  int peer;  // Bcast: the root
  std::shared_ptr<NcclRequest> req;
  void* ptr = nullptr;
  std::shared_ptr<void> staging;
  std::optional<Region> unpack_to;  // a strided destination, unpacked from ptr after the group
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(int rank, int size, const ncclUniqueId& id, double timeout, Bootstrap* bootstrap)
      : rank_(rank), size_(size), timeout_(timeout), bootstrap_(bootstrap) {
    try {
      cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      cuda_check(cudaStreamCreateWithFlags(&local_, cudaStreamNonBlocking), "cudaStreamCreate");
      alive_ = std::make_shared<cudaStream_t>(local_);
      cuda_check(cudaEventCreateWithFlags(&settled_, cudaEventDisableTiming), "cudaEventCreate");
      cuda_check(cudaEventCreateWithFlags(&handed_, cudaEventDisableTiming), "cudaEventCreate");
      cuda_check(cudaGetDevice(&device_), "cudaGetDevice");
      barrier_buf_ = caller_memory(sizeof(float), local_);
      nccl_check(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
    } catch (...) {
      release();
      throw;
    }
  }
  ~NcclTransport() override { release(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  TransportCaps caps() const override {
    TransportCaps c;
    // ncclBroadcast over the whole world; post_broadcast sends from the root to a sub-group.
    c.multicast = TransportCaps::Multicast::Native;
    c.batches = true;
    c.device_memory = true;
    c.ordered_matching = true;
    // NCCL has no tags (a pair's transfers match in issue order): any tag will do.
    c.max_tag = INT_MAX - 16;
    return c;
  }

  Request post_send(const Region& from, int dst, int tag) override {
    (void)tag;
    Op op(Op::Send, from.bytes(), dst, request(dst));
    stage(from, op, true);
    return issue_or_queue(std::move(op));
  }
  Request post_recv(const Region& to, int src, int tag) override {
    (void)tag;
    Op op(Op::Recv, to.bytes(), src, request(src));
    stage(to, op, false);
    return issue_or_queue(std::move(op));
  }
  Request post_broadcast(const Region& region, int root, std::span<const int> group,
                         int tag) override {
    (void)tag;
    for (int d : group) check_peer(d);
    const bool mine = rank_ == root;
    Op op(mine ? Op::Send : Op::Recv, region.bytes(), root, request(mine ? -1 : root));
    if (mine)
      stage(region, op, true);
    else
      stage(region, op, false);
    if (static_cast<int>(group.size()) == size_) {  // the whole world: NCCL's collective
      op.kind = Op::Bcast;
      return issue_or_queue(std::move(op));
    }
    if (!mine) return issue_or_queue(std::move(op));
    // The root sends to each member; the sends share one request (they end in one group).
    Request r(op.req);
    if (group.size() < 2) {  // nobody to send to: complete once the pack is done
      cuda_check(cudaEventRecord(op.req->done, stream_), "cudaEventRecord");
      op.req->issued = true;
      return r;
    }
    ++batch_depth_;
    for (int d : group)
      if (d != root) {
        queue_.push_back(op);
        queue_.back().peer = d;
      }
    end_batch();
    return r;
  }

  bool test(Request::Impl& impl) override {
    auto& r = static_cast<NcclRequest&>(impl);
    live();  // after an abort, what completes holds nothing
    if (!r.issued) return false;
    const cudaError_t e = cudaEventQuery(r.done);
    if (e == cudaErrorNotReady) return false;
    cuda_check(e, "cudaEventQuery");
    return true;
  }

  void idle(const Request::Impl* waiting, std::span<const int> peers, int polls,
            Clock::time_point since) override {
    const auto* r = static_cast<const NcclRequest*>(waiting);
    if (r && !r->issued)
      throw InternalError("nccl", "a wait on a request whose batch is still open");
    watch(r ? r->peer : peers.empty() ? -1 : peers.front(), since);
    if (polls > 64) sched_yield();  // as in mpi.cc: a sleep costs ~80 us here
  }

  // A request of an open batch is dropped from it; one issued cannot be recalled (abort() ends
  // it).
  void cancel(Request::Impl& impl) override {
    std::erase_if(queue_, [&](const Op& op) { return op.req.get() == &impl; });
  }

  void begin_batch() override { ++batch_depth_; }
  void end_batch() override {
    if (batch_depth_ > 0 && --batch_depth_ == 0) flush();
  }

  // Local work is queued, not waited for one kernel at a time: a host wait per kernel cost
  // 11-16 us on an H200, per tensor of a sync and per segment a message packs.
  void copy(const Region& from, const Region& to) override {
    check_region(from, device_);
    check_region(to, device_);
    queue(detail::gpu_copy(from, to, local_), "copy kernel");
  }
  void zero(const Region& r) override {
    check_region(r, device_);
    queue(detail::gpu_zero(r, local_), "zero kernel");
  }
  void add(const Region& from, const Region& to, DType dtype) override {
    check_region(from, device_);
    check_region(to, device_);
    queue(detail::gpu_add(from, to, dtype, local_), "add kernel");
  }
  // Local work waits on no peer: a plain wait ends.
  void settle() override {
    if (!queued_) return;
    cuda_check(cudaEventRecord(settled_, local_), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(settled_), "local work");
    queued_ = false;
  }
  // No conversion kernel yet: the host loop of the default would read device memory.
  void convert(const Region& from, DType from_type, const Region& to, DType to_type) override {
    if (from_type != to_type)
      throw ValidationError("cast",
                            "the nccl transport does not convert dtypes yet; sync without --cast");
    copy(from, to);
  }
  // Allocated and freed in the order of local_ (after the local work that may use it; the
  // engine frees staging only after the transfers using it completed), on the legacy stream
  // once this transport is gone.
  std::shared_ptr<void> scratch(std::size_t bytes) override {
    void* p = nullptr;
    cuda_check(cudaMallocAsync(&p, bytes ? bytes : 1, local_), "cudaMallocAsync");
    cuda_check(cudaStreamSynchronize(local_), "cudaMallocAsync");
    return std::shared_ptr<void>(p, [alive = std::weak_ptr<cudaStream_t>(alive_)](void* q) {
      const auto stream = alive.lock();
      (void)cudaFreeAsync(q, stream ? *stream : cudaStreamLegacy);
    });
  }

  // `meanwhile` is not called: whatever it posted would queue on the stream behind the barrier.
  void barrier(const std::function<void()>& /*meanwhile*/) override {
    live();
    nccl_check(ncclAllReduce(barrier_buf_.get(), barrier_buf_.get(), 1, ncclFloat, ncclSum, comm_,
                             stream_),
               "ncclAllReduce", comm_);
    const auto since = Clock::now();
    for (int polls = 1;; ++polls) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda_check(e, "cudaStreamQuery");
      watch(-1, since);
      if (polls > 64) sched_yield();
    }
  }

  // NCCL tells the peers nothing: they end with NCCL's remote error or their own timeout.
  // Aborting ends this device's transfers, so that none reads or writes its buffers any more.
  void abort(const Error& why) override {
    if (!aborted_) aborted_ = why;
    if (!comm_) return;
    (void)ncclCommAbort(comm_);  // best effort: `why` is the error to report, not this one
    comm_ = nullptr;
    queue_.clear();
  }

 private:
  // Destroying a communicator waits for its transfers: one still in flight (its peer gone)
  // would hang there, so such a communicator is aborted instead. Teardown cannot throw.
  void release() noexcept {
    alive_.reset();  // scratch freed from now on goes by the legacy stream
    if (comm_) {
      if (queue_.empty() && cudaStreamQuery(stream_) == cudaSuccess)
        (void)ncclCommDestroy(comm_);
      else
        (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    queue_.clear();  // their staging is freed on stream_: before it goes
    barrier_buf_.reset();
    if (settled_) (void)cudaEventDestroy(settled_);
    if (handed_) (void)cudaEventDestroy(handed_);
    if (local_) (void)cudaStreamDestroy(local_);
    if (stream_) (void)cudaStreamDestroy(stream_);
  }

  void check_peer(int peer) const {
    if (peer < 0 || peer >= size_)
      throw ValidationError("peer", "device " + std::to_string(peer) + " is outside the world");
  }
  // A communicator aborted earlier takes nothing new.
  void live() const {
    if (aborted_) throw Error(*aborted_);
  }

  std::shared_ptr<NcclRequest> request(int peer) {
    live();
    if (peer >= 0) check_peer(peer);
    auto req = std::make_shared<NcclRequest>();
    req->peer = peer;
    cuda_check(cudaEventCreateWithFlags(&req->done, cudaEventDisableTiming), "cudaEventCreate");
    return req;
  }
  // Where a send reads `r` from (in place, or a packed copy made on the stream now), or where a
  // receive writes it (in place, or a buffer unpacked after the group).
  void stage(const Region& r, Op& op, bool send) {
    check_region(r, device_);
    if (r.is_contiguous()) {
      op.ptr = r.origin();
      return;
    }
    after_local();
    op.staging = stream_memory(r.bytes(), stream_, stream_);
    op.ptr = op.staging.get();
    if (send)
      cuda_check(detail::gpu_copy(r, Region::packed_like(r, op.ptr), stream_), "pack");
    else
      op.unpack_to = r;
  }

  Request issue_or_queue(Op op) {
    Request r(op.req);
    queue_.push_back(std::move(op));
    if (batch_depth_ == 0) flush();
    return r;
  }

  // Issues the queue as one group, then the unpacks, then each request's event; the staging
  // buffers are freed (in stream order, after all that) as `ops` goes.
  void flush() {
    if (queue_.empty()) return;
    live();
    std::vector<Op> ops;
    ops.swap(queue_);
    after_local();
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (const Op& op : ops) {
      ncclResult_t rc = ncclSuccess;
      switch (op.kind) {
        case Op::Send:
          rc = ncclSend(op.ptr, op.bytes, ncclUint8, op.peer, comm_, stream_);
          break;
        case Op::Recv:
          rc = ncclRecv(op.ptr, op.bytes, ncclUint8, op.peer, comm_, stream_);
          break;
        case Op::Bcast:
          rc = ncclBroadcast(op.ptr, op.ptr, op.bytes, ncclUint8, op.peer, comm_, stream_);
          break;
      }
      if (rc != ncclSuccess) {
        (void)ncclGroupEnd();  // closes the group; `rc` is the error to report
        nccl_check(rc, "ncclSend/ncclRecv/ncclBroadcast", comm_);
      }
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd", comm_);
    for (const Op& op : ops)
      if (op.unpack_to)
        cuda_check(
            detail::gpu_copy(Region::packed_like(*op.unpack_to, op.ptr), *op.unpack_to, stream_),
            "unpack");
    for (const Op& op : ops)
      if (!op.req->issued) {  // the root's sends of a multicast share one request
        cuda_check(cudaEventRecord(op.req->done, stream_), "cudaEventRecord");
        op.req->issued = true;
      }
  }

  void queue(cudaError_t launched, const char* what) {
    cuda_check(launched, what);
    queued_ = handing_ = true;
  }
  // The transfers' stream waits for the local work queued so far: before a pack or a group
  // reads what it wrote.
  void after_local() {
    if (!handing_) return;
    cuda_check(cudaEventRecord(handed_, local_), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, handed_, 0), "cudaStreamWaitEvent");
    handing_ = false;
  }

  // NCCL's asynchronous error (a peer failed or left) or no progress since `since`: this
  // communicator cannot go on. Aborts it and throws a CommError naming `peer` when known.
  void watch(int peer, Clock::time_point since) {
    live();
    ncclResult_t async = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", comm_);
    std::string cause;
    if (async != ncclSuccess && async != ncclInProgress)
      cause = std::string("NCCL error: ") + ncclGetErrorString(async);
    else if (Clock::now() - since > std::chrono::duration<double>(timeout_))
      cause = "no progress for " + seconds_text(timeout_);
    else
      return;
    const CommError e = peer >= 0 ? CommError(peer, cause) : CommError("nccl", cause);
    abort(e);
    if (bootstrap_) bootstrap_->on_failure();
    throw e;
  }

  int rank_, size_;
  double timeout_;
  Bootstrap* bootstrap_;
  cudaStream_t stream_ = nullptr;        // transfers, packs and unpacks, in issue order
  cudaStream_t local_ = nullptr;         // copy, zero, add; allocations
  std::shared_ptr<cudaStream_t> alive_;  // local_, while it lives: scratch frees in its order
  cudaEvent_t settled_ = nullptr;        // settle(): recorded after the queued local work
  cudaEvent_t handed_ = nullptr;         // after_local(): stream_ waits for it
  bool queued_ = false;                  // local work queued since the last settle()
  bool handing_ = false;                 // ... since the last after_local()
  int device_ = -1;                      // the GPU of this transport
  ncclComm_t comm_ = nullptr;
  std::shared_ptr<void> barrier_buf_;
  int batch_depth_ = 0;
  std::vector<Op> queue_;
  std::optional<Error> aborted_;
};

// Bytes of a string, for the bootstrap's all-gather.
std::vector<unsigned char> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<unsigned char>& b) { return {b.begin(), b.end()}; }

// Picks this rank's GPU: its index among the ranks of its host, modulo the GPUs it sees (a
// launcher may give each process a CUDA_VISIBLE_DEVICES of its own). Collective; every rank
// throws the same CommError("nccl", ...) when a rank has no GPU or two ranks share one (NCCL
// would refuse or hang).
void choose_gpu(Bootstrap& bootstrap) {
  const int rank = bootstrap.rank();
  char name[256] = {};
  (void)gethostname(name, sizeof name - 1);  // "" on failure: the ranks look like one host
  const std::string host(name);
  const auto hosts = bootstrap.allgather(bytes_of(host));
  int local = 0;
  for (int r = 0; r < rank; ++r)
    if (text_of(hosts[static_cast<std::size_t>(r)]) == host) ++local;

  // This rank's GPU by PCI bus id, or "!cause".
  std::string mine = "!";
  int gpus = 0;
  cudaError_t e = cudaGetDeviceCount(&gpus);
  if (e == cudaSuccess && gpus == 0) e = cudaErrorNoDevice;
  if (e == cudaSuccess) e = cudaSetDevice(local % gpus);
  char bus[64] = {};
  if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(bus, sizeof bus - 1, local % gpus);
  mine = e == cudaSuccess ? bus : mine + cudaGetErrorString(e);
  const auto all = bootstrap.allgather(bytes_of(mine));

  int without = 0;
  for (const auto& b : all) without += !b.empty() && b[0] == '!';
  // This process has no usable GPU: its own failure (exit 1); the others name how many lack one.
  if (mine[0] == '!') throw InternalError("nccl", "no CUDA device: " + mine.substr(1));
  if (without) throw CommError("nccl", "no CUDA device on " + std::to_string(without) + " rank(s)");
  std::map<std::string, int> first;  // host and bus id -> the first rank there
  for (int r = 0; r < bootstrap.size(); ++r) {
    const auto where = text_of(hosts[static_cast<std::size_t>(r)]) + " " +
                       text_of(all[static_cast<std::size_t>(r)]);
    const auto [it, fresh] = first.emplace(where, r);
    if (!fresh)
      throw CommError("nccl", "ranks " + std::to_string(it->second) + " and " + std::to_string(r) +
                                  " share GPU " + text_of(all[static_cast<std::size_t>(r)]) +
                                  " on host " + text_of(hosts[static_cast<std::size_t>(r)]) +
                                  ": NCCL needs a GPU per rank");
  }
}

}  // namespace

struct NcclSession::Impl {
  std::unique_ptr<Communicator> world;
};

NcclSession::NcclSession(Bootstrap& bootstrap, NcclOptions options)
    : impl_(std::make_unique<Impl>()) {
  choose_gpu(bootstrap);
  // Rank 0's id, or its error (any other length), for every rank to see.
  std::vector<unsigned char> mine;
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    mine = r == ncclSuccess ? std::vector<unsigned char>(id.internal, id.internal + sizeof id)
                            : bytes_of(std::string("!ncclGetUniqueId: ") + ncclGetErrorString(r));
  }
  const auto all = bootstrap.allgather(mine);
  if (all[0].size() != sizeof id) {  // an error text, "!..."
    const std::string cause = text_of(all[0]).substr(1);
    if (bootstrap.rank() == 0) throw InternalError("nccl", cause);
    throw CommError(0, cause);
  }
  std::memcpy(&id, all[0].data(), sizeof id);
  impl_->world = std::make_unique<Communicator>(std::make_unique<NcclTransport>(
      bootstrap.rank(), bootstrap.size(), id, options.timeout_seconds, &bootstrap));
}

NcclSession::~NcclSession() = default;

Communicator& NcclSession::world() { return *impl_->world; }

// The caller's memory, freed on the legacy stream: after the work of the caller's (blocking)
// streams that may use it, not in the order of the transport's.
std::shared_ptr<void> NcclSession::allocate(std::size_t bytes) {
  return caller_memory(bytes, cudaStreamLegacy);
}

void NcclSession::upload(const void* host, void* device, std::size_t bytes) {
  cuda_check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

void NcclSession::download(const void* device, void* host, std::size_t bytes) {
  cuda_check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace meshcast
