// How the processes of a job find each other before a transport starts: rank, size and an
// all-gather of small byte strings (UCX worker addresses, an NCCL unique id). MpiSession is one
// (meshcast/mpi.h, under mpirun); TcpBootstrap is another, for jobs started by torchrun, srun or
// by hand: every process is given the same rendezvous address, its rank and the job size, read
// from the variables its launcher sets (LaunchEnv).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshcast {

class Error;

// Who this process is in its job, as the environment says: rank, size, local rank and the
// rendezvous, from the variables a launcher sets. Sources, each field from the first that gives
// it:
//
//   rank        MESHCAST_RANK         > the launcher's (below)
//   size        MESHCAST_SIZE         > the launcher's
//   local rank  MESHCAST_LOCAL_RANK   > the launcher's; optional (-1 when nobody says)
//   rendezvous  MESHCAST_RENDEZVOUS=HOST:PORT > MASTER_ADDR and MASTER_PORT (meshcast listens
//               on MASTER_PORT + 1: MASTER_PORT itself is where torchrun's agent, or torch's
//               rank 0, serves its own TCP store) > for Slurm only, the first host of
//               SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), compressed lists such as
//               "node[01-04,07],gpu3" included, on port 10000 + (16 * SLURM_JOB_ID +
//               SLURM_STEP_ID) mod 20000 (distinct for 16 steps of a job, below the kernel's
//               ephemeral ports)
//
// The launcher, the first whose rank or size variable is set (the innermost launcher first:
// torchrun and mpirun run inside Slurm allocations and inherit Slurm's variables, which then
// describe the allocation's batch step or mpirun's daemons, not this process):
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK
//   openmpi   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK (without
//             a rendezvous variable there is no TCP rendezvous: MPI starts the job)
//   slurm     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
// MESHCAST_LAUNCHER=torchrun|openmpi|slurm picks one, =meshcast ignores them all (MESHCAST_*
// only), =auto (the default) detects. Any field may be overridden alone: MESHCAST_RENDEZVOUS
// with Slurm's ranks is fine; with MESHCAST_RANK and MESHCAST_SIZE both set the job is started
// by hand and no launcher's variable is read. MESHCAST_RENDEZVOUS_TIMEOUT (seconds, default
// 60) and the job key (TcpBootstrap::job_key_from_env) complete it.
//
// A variable that is malformed, out of range (a rank outside [0, size), a size above
// limits().devices, a port outside its range) or missing where needed throws ValidationError
// naming exactly that variable in one short line ("MASTER_PORT: expected a port in [1, 65534],
// got 'abc'"); only the variables used are read.
//
//   // RANK=1 WORLD_SIZE=4 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500
//   auto e = LaunchEnv::detect();  // torchrun: rank 1 of 4, rendezvous 10.0.0.1:29501
struct LaunchEnv {
  // Reads one variable: null when unset (std::getenv, or a map in tests).
  using Getenv = std::function<const char*(const char*)>;

  std::string launcher;  // "torchrun", "openmpi", "slurm", or "meshcast" (MESHCAST_* alone)
  int rank = 0;
  int size = 1;
  int local_rank = -1;  // -1: not given
  // The rendezvous; host empty when there is none (Open MPI without one: MPI bootstraps).
  std::string host;
  int port = 0;
  // The variables that gave size, host and port (for messages), e.g. "WORLD_SIZE",
  // "MASTER_ADDR", "MASTER_PORT".
  std::string size_from, host_from, port_from;
  double timeout_seconds = 60;
  std::string job_key;

  bool has_rendezvous() const { return !host.empty(); }
  // "HOST:PORT", an IPv6 host in brackets: "[::1]:29500".
  std::string rendezvous() const;
  // One line: "torchrun: rank 1 of 4 (local rank 1), rendezvous 10.0.0.1:29501".
  std::string str() const;

  // The job as `getenv` says; nullopt when neither MESHCAST_RENDEZVOUS, MESHCAST_RANK,
  // MESHCAST_SIZE nor a launcher's rank or size variable is set (a process started alone;
  // MASTER_ADDR alone is not a job). Throws ValidationError as above.
  static std::optional<LaunchEnv> from(const Getenv& getenv);
  // from(std::getenv).
  static std::optional<LaunchEnv> detect();
  // MESHCAST_RENDEZVOUS_TIMEOUT as `getenv` says (60 when unset), alone: also for a job that
  // MPI starts, whose launcher variables are not read. Throws ValidationError naming it.
  static double timeout_from(const Getenv& getenv);
};

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
  // As on_failure(), where the transport announced `why` (a CommError, naming the device that
  // failed where one is known) to its peers: a bootstrap with a channel of its own tells its
  // peers too (MpiSession: a rank still waiting in its sum then names that device, not one
  // whose process ended normally before it looked).
  virtual void on_peer_failure(const Error& why) {
    (void)why;
    on_failure();
  }

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

  // From the environment (LaunchEnv::detect): MESHCAST_RENDEZVOUS=HOST:PORT, MESHCAST_RANK,
  // MESHCAST_SIZE as before, or what torchrun, Open MPI's mpirun or Slurm's srun set. Null when
  // no launcher variable is set, or under mpirun without a rendezvous variable (MPI then starts
  // the job); a missing, malformed or too large variable throws ValidationError naming it (one
  // short line, whatever the variable holds), a bad rendezvous host too.
  static std::unique_ptr<TcpBootstrap> from_env();
  // The same from a LaunchEnv (null when it has no rendezvous).
  static std::unique_ptr<TcpBootstrap> from_launch(const LaunchEnv& env);

  // The job key from_env uses: MESHCAST_JOB_KEY when set and not empty; else the launcher's job
  // ids that are set (SLURM_JOB_ID and SLURM_STEP_ID, TORCHELASTIC_RUN_ID unless "none",
  // PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, PBS_JOBID, LSB_JOBID, FLUX_JOB_ID); else this
  // process's command line (/proc/self/cmdline, the program by its file name only). The derived
  // keys also hold `size` and `rendezvous` ("HOST:PORT"). Not a secret.
  static std::string job_key_from_env(const std::string& rendezvous, int size);
  // The same, reading the variables through `getenv`.
  static std::string job_key_from_env(const std::string& rendezvous, int size,
                                      const LaunchEnv::Getenv& getenv);

  int rank() const override;
  int size() const override;
  std::vector<std::vector<unsigned char>> allgather(
      const std::vector<unsigned char>& mine) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshcast
