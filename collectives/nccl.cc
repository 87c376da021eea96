// The NCCL backend. NCCL point-to-point calls must be issued together with their peers' calls,
// so posts are queued and the whole phase is issued as one ncclGroupStart/End at the first wait
// (the executor posts a phase, then waits). Strided boxes are packed before the group and
// unpacked after it on the same stream. Waits poll the stream with a deadline and abort the
// communicator on timeout or on NCCL's asynchronous error.
#include "meshcast/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "meshcast/error.h"
#include "nccl_kernels.h"

namespace meshcast {
namespace {

using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError("nccl", std::string(what) + ": " + cudaGetErrorString(e));
}
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw CommError("nccl", std::string(what) + ": " + ncclGetErrorString(r));
}

struct NcclRequest : Request::Impl {
  cudaEvent_t done = nullptr;  // recorded after the group that carries it
  int peer = -1;
  ~NcclRequest() override {
    if (done) cudaEventDestroy(done);
  }
};

// A transfer waiting for the phase's group.
struct Posted {
  enum Kind { Send, Recv, Bcast } kind;
  void* ptr;
  std::size_t bytes;
  int peer;  // Bcast: root
  Region unpack_to;
  bool unpack = false;
  std::shared_ptr<void> staging;
  std::shared_ptr<NcclRequest> req;
};

class NcclComm final : public Communicator {
 public:
  NcclComm(int rank, int size, const ncclUniqueId& id, double timeout)
      : rank_(rank), size_(size), timeout_(timeout) {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    nccl_check(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
  }
  ~NcclComm() override {
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  Request isend(const Region& from, int dst, int tag) override {
    (void)tag;  // NCCL matches point-to-point calls of a pair in issue order: plan order
    Posted p = stage(from, dst, Posted::Send);
    if (p.staging)
      cuda_check(detail::gpu_copy(from, Region::packed_like(from, p.ptr), stream_), "pack");
    return queue(std::move(p));
  }
  Request irecv(const Region& to, int src, int tag) override {
    (void)tag;
    return queue(stage(to, src, Posted::Recv));
  }
  Request ibcast(const Region& region, int root, std::span<const int> group, int tag) override {
    if (static_cast<int>(group.size()) != size_)  // sub-groups: sends from the root
      return Communicator::ibcast(region, root, group, tag);
    Posted p = stage(region, root, Posted::Bcast);
    if (p.staging && rank_ == root)
      cuda_check(detail::gpu_copy(region, Region::packed_like(region, p.ptr), stream_), "pack");
    if (rank_ == root) p.unpack = false;
    return queue(std::move(p));
  }

  void barrier() override {
    auto one = scratch(sizeof(float));
    nccl_check(ncclAllReduce(one.get(), one.get(), 1, ncclFloat, ncclSum, comm_, stream_),
               "ncclAllReduce");
    sync();
  }

  void copy(const Region& from, const Region& to) override {
    cuda_check(detail::gpu_copy(from, to, stream_), "copy kernel");
    sync();
  }
  void zero(const Region& r) override {
    cuda_check(detail::gpu_zero(r, stream_), "zero kernel");
    sync();
  }
  void add(const Region& from, const Region& to, DType dtype) override {
    cuda_check(detail::gpu_add(from, to, dtype, stream_), "add kernel");
    sync();
  }
  std::shared_ptr<void> scratch(std::size_t bytes) override {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  }

 protected:
  void wait_one(Request::Impl& impl) override {
    flush();
    auto& r = static_cast<NcclRequest&>(impl);
    poll([&] { return cudaEventQuery(r.done); }, r.peer);
  }

  bool test_one(Request::Impl& impl) override {
    flush();
    const cudaError_t e = cudaEventQuery(static_cast<NcclRequest&>(impl).done);
    if (e == cudaErrorNotReady) return false;
    cuda_check(e, "cudaEventQuery");
    return true;
  }

 private:
  Posted stage(const Region& r, int peer, Posted::Kind kind) {
    if (peer < 0 || peer >= size_)
      throw ValidationError("peer", "device " + std::to_string(peer) + " is outside the world");
    if (r.count.size() > static_cast<std::size_t>(detail::kMaxRank))
      throw ValidationError("region", "the NCCL backend supports tensors of rank <= 8");
    Posted p{kind, nullptr, r.bytes(), peer, r, false, nullptr, std::make_shared<NcclRequest>()};
    p.req->peer = peer;
    if (r.is_contiguous()) {
      p.ptr = r.origin();
    } else {
      p.staging = scratch(r.bytes());
      p.ptr = p.staging.get();
      p.unpack = kind != Posted::Send;
    }
    return p;
  }

  Request queue(Posted p) {
    Request r(p.req);
    posted_.push_back(std::move(p));
    return r;
  }

  // Issues every queued transfer as one group, then the unpacks, then each request's event.
  void flush() {
    if (posted_.empty()) return;
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (auto& p : posted_) {
      ncclResult_t rc = ncclSuccess;
      switch (p.kind) {
        case Posted::Send:
          rc = ncclSend(p.ptr, p.bytes, ncclUint8, p.peer, comm_, stream_);
          break;
        case Posted::Recv:
          rc = ncclRecv(p.ptr, p.bytes, ncclUint8, p.peer, comm_, stream_);
          break;
        case Posted::Bcast:
          rc = ncclBroadcast(p.ptr, p.ptr, p.bytes, ncclUint8, p.peer, comm_, stream_);
          break;
      }
      if (rc != ncclSuccess) {
        ncclGroupEnd();
        nccl_check(rc, "ncclSend/ncclRecv/ncclBroadcast");
      }
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    for (auto& p : posted_) {
      if (p.unpack)
        cuda_check(detail::gpu_copy(Region::packed_like(p.unpack_to, p.ptr), p.unpack_to, stream_),
                   "unpack");
      cuda_check(cudaEventCreateWithFlags(&p.req->done, cudaEventDisableTiming), "cudaEventCreate");
      cuda_check(cudaEventRecord(p.req->done, stream_), "cudaEventRecord");
    }
    // Staging buffers must outlive the stream's use of them.
    for (auto& p : posted_)
      if (p.staging) in_flight_.push_back(std::move(p.staging));
    posted_.clear();
  }

  void sync() {
    flush();
    poll([&] { return cudaStreamQuery(stream_); }, -1);
    in_flight_.clear();
  }

  template <class Query>
  void poll(Query&& query, int peer) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    int polls = 0;
    while (true) {
      const cudaError_t e = query();
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda_check(e, "stream");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess || Clock::now() > deadline) {
        ncclCommAbort(comm_);
        throw CommError("device " + std::to_string(peer),
                        async != ncclSuccess
                            ? std::string("NCCL error: ") + ncclGetErrorString(async)
                            : "no progress for " + std::to_string(timeout_) + " s");
      }
      if (++polls > 64) sched_yield();  // as in mpi.cc: a sleep costs ~80 us here
    }
  }

  int rank_, size_;
  double timeout_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::vector<Posted> posted_;
  std::vector<std::shared_ptr<void>> in_flight_;
};

}  // namespace

struct NcclSession::Impl {
  std::unique_ptr<NcclComm> world;
};

NcclSession::NcclSession(Bootstrap& bootstrap, NcclOptions options)
    : impl_(std::make_unique<Impl>()) {
  const int rank = bootstrap.rank(), size = bootstrap.size();
  int gpus = 0;
  const cudaError_t e = cudaGetDeviceCount(&gpus);
  // Every rank must agree before the collective init below: count ranks without a GPU.
  const long long without = bootstrap.sum(e != cudaSuccess || gpus == 0 ? 1 : 0);
  if (without)
    throw CommError("nccl",
                    e != cudaSuccess
                        ? std::string("no CUDA device: ") + cudaGetErrorString(e)
                        : std::string("no CUDA device on ") + std::to_string(without) + " rank(s)");
  cuda_check(cudaSetDevice(rank % gpus), "cudaSetDevice");
  ncclUniqueId id{};
  if (rank == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<unsigned char> mine(reinterpret_cast<unsigned char*>(&id),
                                  reinterpret_cast<unsigned char*>(&id) + sizeof id);
  const auto all = bootstrap.allgather(mine);
  std::memcpy(&id, all[0].data(), sizeof id);
  impl_->world = std::make_unique<NcclComm>(rank, size, id, options.timeout_seconds);
}

NcclSession::~NcclSession() = default;

Communicator& NcclSession::world() { return *impl_->world; }

std::shared_ptr<void> NcclSession::allocate(std::size_t bytes) {
  return impl_->world->scratch(bytes);
}

void NcclSession::upload(const void* host, void* device, std::size_t bytes) {
  cuda_check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

void NcclSession::download(const void* device, void* host, std::size_t bytes) {
  cuda_check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace meshcast
