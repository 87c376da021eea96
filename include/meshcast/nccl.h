// The NCCL backend: one process per GPU, device id d = rank d, local buffers in GPU memory.
// Point-to-point transfers of a phase are issued as one NCCL group; strided boxes are packed and
// unpacked by CUDA kernels on the communicator's stream. The NCCL unique id is exchanged through
// a Bootstrap (MpiSession under mpirun, or TcpBootstrap). Built when CUDA and NCCL are found
// (target meshcast::nccl).
#pragma once

#include <cstddef>
#include <memory>

#include "meshcast/bootstrap.h"
#include "meshcast/communicator.h"

namespace meshcast {

struct NcclOptions {
  // A wait that sees no completion for this long aborts the communicator with a CommError.
  double timeout_seconds = 60;
};

class NcclSession {
 public:
  // Collective over the ranks of `bootstrap` (an MpiSession, a TcpBootstrap). Uses GPU (rank
  // mod GPU count). Throws CommError("nccl", ...) when no GPU can be used, e.g. "no CUDA
  // device: ...".
  explicit NcclSession(Bootstrap& bootstrap, NcclOptions options = {});
  ~NcclSession();
  NcclSession(const NcclSession&) = delete;
  NcclSession& operator=(const NcclSession&) = delete;

  Communicator& world();
  // GPU memory of `bytes` bytes, and copies between it and the host (blocking).
  std::shared_ptr<void> allocate(std::size_t bytes);
  void upload(const void* host, void* device, std::size_t bytes);
  void download(const void* device, void* host, std::size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshcast
