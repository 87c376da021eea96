// How the processes of a job find each other before a transport starts: rank, size and an
// all-gather of small byte strings (UCX worker addresses, an NCCL unique id). MpiSession is one
// (meshcast/mpi.h, under mpirun); TcpBootstrap is another, for jobs started without a launcher:
// every process is given the same rendezvous address, its rank and the job size.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace meshcast {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's bytes, in rank order. Collective: every rank calls the collectives of a
  // bootstrap (allgather, sum, barrier) in the same order.
  virtual std::vector<std::vector<unsigned char>> allgather(
      const std::vector<unsigned char>& mine) = 0;
  // A transport started through this bootstrap saw a peer fail: tearing down what would wait on
  // that peer could hang (MpiSession then skips MPI_Finalize). The default does nothing.
  virtual void on_failure() {}

  // The sum of `value` over every rank (e.g. verification totals); collective. The default goes
  // through allgather.
  virtual long long sum(long long value);
  // Returns once every rank called it; collective.
  void barrier();
};

// A bootstrap over TCP: rank 0 listens on host:port (the rendezvous) and accepts one connection
// from each other rank; the others connect, retrying until `timeout_seconds` have passed (rank 0
// may start later). Each allgather round, every rank sends its bytes to rank 0, which sends the
// whole table back; the connections stay open until destruction. A rank that does not connect,
// answer or send within `timeout_seconds` (per round) makes the others throw
// CommError("bootstrap", ...), as does a closed connection; nothing hangs. Throws
// ValidationError naming `host`, `port`, `rank`, `size` or `timeout` for bad arguments.
// The constructor is collective (it returns once this rank is connected).
//
//   TcpBootstrap boot("127.0.0.1", 29500, rank, 4);  // in each of 4 processes
//   UcxSession ucx(boot);                            // meshcast/ucx.h
class TcpBootstrap final : public Bootstrap {
 public:
  TcpBootstrap(std::string host, int port, int rank, int size, double timeout_seconds = 60);
  ~TcpBootstrap() override;
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  // From the environment: MESHCAST_RENDEZVOUS=HOST:PORT (an IPv6 host in brackets:
  // [::1]:29500), MESHCAST_RANK, MESHCAST_SIZE, and optionally MESHCAST_RENDEZVOUS_TIMEOUT
  // (seconds, default 60). Null when MESHCAST_RENDEZVOUS is unset; a missing or malformed
  // variable throws ValidationError naming it.
  static std::unique_ptr<TcpBootstrap> from_env();

  int rank() const override;
  int size() const override;
  std::vector<std::vector<unsigned char>> allgather(
      const std::vector<unsigned char>& mine) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshcast
