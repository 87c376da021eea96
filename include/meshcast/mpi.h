// The MPI backend: one process per device, device id d = rank d of MPI_COMM_WORLD. Built when
// MPI is found (target meshcast::mpi); this header needs no MPI headers.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "meshcast/bootstrap.h"
#include "meshcast/communicator.h"

namespace meshcast {

struct MpiOptions {
  // A wait that sees no completion for this long checks which ranks are alive (a grace of up
  // to 5 s) and fails with a CommError naming the dead ones (or, if all are alive and none
  // completed a request in the last half of it, its peers). From half of it on, every rank is
  // asked every half timeout how many requests it completed: while that grows, the job moves
  // (the device waited on is busy with other transfers first) and the wait goes on.
  // A rank whose reshard throws tells the others at once (Communicator::abandon). The survivors'
  // CommError names the device that failed (Error::device()).
  double timeout_seconds = 60;
  // The session's own exchanges as a Bootstrap (sum, allgather: a job's startup checks, its
  // verification totals) wait this long for a silent rank (a dead one on this machine, or one
  // that told the others it failed, is named at once); under the CLI,
  // MESHCAST_RENDEZVOUS_TIMEOUT.
  double exchange_timeout_seconds = 60;
  // How a multicast travels: `chain`, a pipelined chain of point-to-point chunks (see
  // Communicator::ibcast), or `native`, MPI_Ibcast on a sub-communicator cached per device
  // set. The default is the faster of the two in bench/mpi_broadcast.cc here. MPI matches the
  // broadcasts of one sub-communicator in call order, not by tag: with `native`, the members of
  // a device set start their multicasts over it in the same order, whatever groups they are on.
  enum class Broadcast { Chain, Native } broadcast = Broadcast::Chain;
  // The chunk of a chain inside one node. 256 KiB: in shared memory it is within 4% of 1 MiB
  // (bench/mpi_reshard group b).
  std::size_t chunk_bytes = std::size_t{256} << 10;
  // The chunk of a chain that crosses hosts (ranks MPI does not place in one shared-memory
  // node), when smaller than chunk_bytes. 32 KiB stays below Open MPI's TCP eager limit
  // (64 KiB with the header), so a chunk needs no rendezvous: its clear-to-send reply would
  // queue behind the data the next host forwards on its own shaped link, adding ~12 ms per
  // network hop. On the emulated hosts a chain to 4x2 devices at 16 MiB reached 0.92 of the
  // link-bound optimum with it, 0.76 with 256 KiB (bench/cluster_suite --chunk-kib).
  std::size_t network_chunk_bytes = std::size_t{32} << 10;
  // The most scratch memory a chain stages a strided box through, per chain and device (at
  // least one chunk; a contiguous box needs none). Point-to-point transfers stage nothing:
  // strided regions travel as MPI datatypes.
  std::size_t staging_bytes = std::size_t{16} << 20;
  // Node memory per rank (an MPI shared-memory window on each node, Communicator::node_segment)
  // that the blocking collectives copy through when a group shares one node; 0: none, every
  // collective sends. Larger pieces go through it in chunks of about this size.
  std::size_t node_segment_bytes = std::size_t{4} << 20;
};

// Initialises MPI (if nobody did) and finalises it on destruction (if it initialised it and no
// peer failed: finalizing with a dead rank can hang, so then the process just ends).
// world() is this process's endpoint on MPI_COMM_WORLD (or the attached communicator). As a
// Bootstrap (rank, size, allgather, sum over that communicator) it starts the other transports
// under mpirun.
class MpiSession : public Bootstrap {
 public:
  MpiSession(int* argc, char*** argv, MpiOptions options = {});
  // A session over a communicator of a program that initialised MPI itself (mpi4py, a host
  // application): `mpi_comm` points at its MPI_Comm. The session works on a duplicate (its
  // messages never meet the caller's) and device id d is rank d of that communicator; it never
  // finalizes MPI. Collective over the communicator: CommError("comm") where not every rank
  // calls it within options.timeout_seconds. Throws ValidationError("comm") when MPI is not
  // initialised or already finalized.
  static std::unique_ptr<MpiSession> attach(const void* mpi_comm, MpiOptions options = {});
  ~MpiSession() override;
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  Communicator& world();
  int rank() const override;
  int size() const override;
  // Sums a count over every rank (for verification totals); collective.
  long long sum(long long value) override;
  // Every rank's bytes, in rank order (bootstrapping other transports); collective.
  std::vector<std::vector<unsigned char>> allgather(
      const std::vector<unsigned char>& mine) override;
  // Another transport of this process saw a peer fail: do not finalize MPI (it could hang).
  void on_failure() override;
  // Also announces `why` on MPI's control channel (nothing once MPI is finalized).
  void on_peer_failure(const Error& why) override;
  // Ends every process of the job with this exit code (after an unrecoverable error).
  [[noreturn]] void abort(int code);

 private:
  struct Impl;
  explicit MpiSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshcast
