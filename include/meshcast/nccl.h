// The NCCL transport: one process per GPU, device id d = rank d, local buffers in GPU memory.
// The transfers of a phase (the engine's batch) are issued as one NCCL group; strided boxes are
// packed and unpacked by CUDA kernels on the communicator's stream; a multicast to every device
// is an ncclBroadcast, one to fewer sends from the root. The NCCL unique id is exchanged through
// a Bootstrap (MpiSession under mpirun, or TcpBootstrap). Built when CUDA and NCCL are found
// (target meshcast::nccl).
#pragma once

#include <cstddef>
#include <memory>

#include "meshcast/bootstrap.h"
#include "meshcast/communicator.h"

namespace meshcast {

struct NcclOptions {
  // A wait that sees no completion for this long aborts the communicator with a CommError, as
  // does NCCL's asynchronous error (a peer failed).
  double timeout_seconds = 60;
};

class NcclSession {
 public:
  // Collective over the ranks of `bootstrap` (an MpiSession, a TcpBootstrap), which must outlive
  // the session (it hears of a peer's failure: Bootstrap::on_failure). A rank uses the GPU of
  // its index among the ranks of its host, modulo the GPUs it sees. Every rank throws when a GPU
  // cannot be used: InternalError("nccl", "no CUDA device: ...") where it has none itself,
  // CommError("nccl", ...) where others have none ("no CUDA device on 2 rank(s)") or two ranks
  // share one ("ranks 0 and 1 share GPU ..."); InternalError("nccl"/"cuda", ...) when a call
  // failed.
  explicit NcclSession(Bootstrap& bootstrap, NcclOptions options = {});
  ~NcclSession();
  NcclSession(const NcclSession&) = delete;
  NcclSession& operator=(const NcclSession&) = delete;

  Communicator& world();
  // GPU memory of `bytes` bytes, and copies between it and the host (blocking; throw
  // InternalError("cuda", ...)).
  std::shared_ptr<void> allocate(std::size_t bytes);
  void upload(const void* host, void* device, std::size_t bytes);
  void download(const void* device, void* host, std::size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshcast
