// The UCX backend (UCP tag API): one process per device, device id d = rank d. Worker addresses
// are exchanged at start-up through a Bootstrap: MpiSession when launched by mpirun, or
// TcpBootstrap (a TCP rendezvous, e.g. TcpBootstrap::from_env()) without a launcher, in which
// case MPI is not used at all. Data then moves over UCX only. Built when UCX and MPI are found
// (target meshcast::ucx).
#pragma once

#include <cstddef>
#include <memory>

#include "meshcast/bootstrap.h"
#include "meshcast/communicator.h"

namespace meshcast {

struct UcxOptions {
  // A wait that sees no completion for this long fails with CommError naming the peers, unless
  // the job moves: as MpiOptions::timeout_seconds.
  double timeout_seconds = 60;
  // Multicasts travel as pipelined chains of chunks of this size (Communicator::ibcast);
  // the default is MpiOptions::chunk_bytes', measured there.
  std::size_t chunk_bytes = std::size_t{256} << 10;
  // The most scratch memory a chain stages a strided box through (as MpiOptions::staging_bytes).
  // Point-to-point transfers stage nothing: a strided region travels as a UCX generic datatype
  // that packs and unpacks the byte ranges UCX asks for.
  std::size_t staging_bytes = std::size_t{16} << 20;
};

class UcxSession {
 public:
  // Collective over the ranks of `bootstrap` (an MpiSession, a TcpBootstrap), which must outlive
  // the session: a session that saw a peer fail tells the bootstrap on destruction
  // (on_peer_failure() with the failure it announced, else on_failure()).
  // Its end is collective too, as MPI_Finalize is: the destructor waits in a barrier of the
  // session's transport until every rank ends its session (a send completes once its data is
  // on its way, so a process that left right after its last send was taken for failed by a
  // peer still receiving it), then closes its endpoints flushed. That barrier is skipped after a
  // failure and while an exception unwinds; a peer that never comes costs at most the timeout.
  explicit UcxSession(Bootstrap& bootstrap, UcxOptions options = {});
  ~UcxSession();
  UcxSession(const UcxSession&) = delete;
  UcxSession& operator=(const UcxSession&) = delete;

  Communicator& world();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshcast
