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
// whole table back; the connections stay open until destruction.
//
// Only the ranks of one job meet: every rank presents `job_key` (any text; equal in every rank
// of a job, different between jobs that could share a port) in its hello, and rank 0 answers
// with its own. Rank 0 rejects a connection whose key differs (another job: that connection gets
// the error, the slot stays free), one that is not a meshcast hello (a stranger), and one that
// sends nothing within min(timeout, 10 s) (idle); it reads every hello concurrently, so none of
// these delays the others. A rank that reaches a rank 0 of another job throws CommError; a second
// rank 0 on the same port cannot listen (CommError "... already in use"); a duplicate rank id, or
// one that disagrees on `size`, ends the rendezvous with a CommError naming it.
//
// Failures: a rank that does not connect, answer or send within `timeout_seconds` (per round),
// or whose connection closes (it ended or was killed), makes every other rank throw
// CommError("bootstrap", ...) naming it: rank 0 sees it at once and tells the others. Idle
// connections carry TCP keepalive probes, so a peer whose host vanished is noticed in about 8 s.
// After a failure every call throws. Nothing hangs. Throws ValidationError naming `host`,
// `port`, `rank`, `size` (also above limits().devices) or `timeout` for bad arguments.
// The constructor is collective (it returns once this rank is connected).
//
//   TcpBootstrap boot("127.0.0.1", 29500, rank, 4, 60, "my-job");  // in each of 4 processes
//   UcxSession ucx(boot);                                          // meshcast/ucx.h
class TcpBootstrap final : public Bootstrap {
 public:
  TcpBootstrap(std::string host, int port, int rank, int size, double timeout_seconds = 60,
               const std::string& job_key = "");
  ~TcpBootstrap() override;
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  // From the environment: MESHCAST_RENDEZVOUS=HOST:PORT (an IPv6 host in brackets:
  // [::1]:29500), MESHCAST_RANK, MESHCAST_SIZE (at most limits().devices), optionally
  // MESHCAST_RENDEZVOUS_TIMEOUT (seconds, default 60), and the job key of job_key_from_env.
  // Null when MESHCAST_RENDEZVOUS is unset; a missing, malformed or too large variable throws
  // ValidationError naming it (one short line, whatever the variable holds).
  static std::unique_ptr<TcpBootstrap> from_env();

  // The job key from_env uses: MESHCAST_JOB_KEY when set and not empty; else the launcher's job
  // ids that are set (SLURM_JOB_ID and SLURM_STEP_ID, TORCHELASTIC_RUN_ID unless "none",
  // PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, PBS_JOBID, LSB_JOBID, FLUX_JOB_ID); else this
  // process's command line (/proc/self/cmdline, the program by its file name only). The derived
  // keys also hold `size` and `rendezvous` (MESHCAST_SIZE, MESHCAST_RENDEZVOUS). Not a secret.
  static std::string job_key_from_env(const std::string& rendezvous, int size);

  int rank() const override;
  int size() const override;
  std::vector<std::vector<unsigned char>> allgather(
      const std::vector<unsigned char>& mine) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshcast
