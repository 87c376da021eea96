// The UCX backend (UCP tag API): one process per device, device id d = rank d. Worker addresses
// are exchanged through MPI at start-up, so jobs are launched with mpirun; data then moves over
// UCX only. Built when UCX and MPI are found (target meshcast::ucx).
#pragma once

#include <cstddef>
#include <memory>

#include "meshcast/communicator.h"
#include "meshcast/mpi.h"

namespace meshcast {

struct UcxOptions {
  // A wait that sees no completion for this long fails with CommError naming the peers.
  double timeout_seconds = 60;
  // Multicasts travel as pipelined chains of chunks of this size (Communicator::ibcast_chain).
  std::size_t chunk_bytes = std::size_t{1} << 20;
};

class UcxSession {
 public:
  // Collective over the MPI world of `bootstrap`.
  explicit UcxSession(MpiSession& bootstrap, UcxOptions options = {});
  ~UcxSession();
  UcxSession(const UcxSession&) = delete;
  UcxSession& operator=(const UcxSession&) = delete;

  Communicator& world();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshcast
