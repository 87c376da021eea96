// The transport conformance suite (support/conformance_cases.h) across processes:
//   conformance mpi|mpi-native|ucx [MODE]   under mpirun (ucx starts through MPI)
//   conformance ucx-tcp N [MODE]            starts N processes itself, which meet through
//                                           TcpBootstrap on 127.0.0.1 and never initialise MPI
// MODE cases (the default): every case in order; exits 0 when all passed on this rank (rank 0
// prints one line per case). throw / exit / stall: device 1 throws mid-operation / exits / stops
// answering; each survivor prints "survivor R ok: ..." when it got a CommError naming device 1
// within the bound, else a line with FAIL. Chains move in chunks of 4093 bytes staged through 3 of
// them (many chunks, slots reused), so that multicasts exercise the engine's pipelining.
// ends: device 0 sends a small tensor to every other device and returns at once, ending its
// session; the others post their receives a second later, and each must get every element.
// busy: device 1 waits on device 0, and devices 3.. in a barrier, for three timeouts while device
// 0 exchanges messages with device 2: every device must print "busy R ok" (no false failure).
// dies: device 1 dies (exits, its session left as it is) right after the last operation, a
// byte from each survivor to it; each survivor must end its session (a collective end:
// MPI_Win_free, MPI_Finalize, which waited forever on the dead device) and print "survivor R
// ended".
#include <meshcast/meshcast.h>
#include <meshcast/mpi.h>
#include <meshcast/testing.h>
#ifdef MESHCAST_HAS_UCX
#include <meshcast/ucx.h>
#endif

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "support/conformance_cases.h"

using namespace meshcast;

namespace {

constexpr std::size_t kChunk = 4093, kStaging = 3 * kChunk;
constexpr int kVictim = 1;
constexpr double kBound = 10;  // seconds a survivor may take to learn of the failure

// Seconds a wait goes without progress before it checks its peers: short where a failure is
// the point (a peer that leaves is noticed by its process or connection ending, not by this).
// A stalled peer is named after the timeout plus the liveness check's grace (as long again):
// 4 s, well inside the bound on sanitized ranks beside another test.
double timeout_for(const std::string& mode) {
  return mode == "cases" ? 60 : mode == "stall" ? 2 : 3;
}

// Mode ends: a session's end is collective (UcxSession), so device 0, whose send completed once
// its data was on its way, stays until its peers received it. (Its peers took its process for
// failed when it left before them.)
int ends_early(Communicator& comm, const std::string& who) {
  const int n = comm.size(), me = comm.rank();
  const Shape shape{3, 5};
  const Layout src = Layout::parse(shape, DType::f64, "1@0:RR");
  const Layout dst = Layout::parse(shape, DType::f64,
                                   std::to_string(n - 1) + "@1-" + std::to_string(n - 1) + ":RR");
  const Plan p = plan(src, dst);
  std::vector<double> in(me == 0 ? 15 : 0), out(me == 0 ? 0 : 15, -1);
  if (me == 0) {
    fill_source(src, me, in.data());
    reshard(p, comm.world(), in.data(), nullptr);
    return 0;  // the session ends now, with the data maybe still on its way
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  reshard(p, comm.world(), nullptr, out.data());
  const auto wrong = count_mismatches(dst, me, out.data());
  std::printf("%sdevice %d %s: %lld wrong\n", who.c_str(), me, wrong ? "FAIL" : "ok",
              static_cast<long long>(wrong));
  return wrong ? 1 : 0;
}

int run(Communicator& comm, const std::string& backend, const std::string& mode) {
  const std::string who = "conformance " + backend + " " + mode + ": ";
  if (mode == "cases") {
    for (const auto& c : conformance::cases()) {
      try {
        c.run(comm);
      } catch (const std::exception& e) {
        std::printf("%s%s: FAIL %s\n", who.c_str(), c.name, e.what());
        std::fflush(stdout);
        comm.abandon_for(e);  // the others end at once, naming this device
        return 1;
      }
      if (comm.rank() == 0) std::printf("%s%s ok\n", who.c_str(), c.name);
    }
    if (comm.rank() == 0)
      std::printf("%s%d devices, all %zu cases passed\n", who.c_str(), comm.size(),
                  conformance::cases().size());
    return 0;
  }
  if (comm.size() < 2) {
    std::printf("%sFAIL needs at least 2 devices\n", who.c_str());
    return 1;
  }
  try {
    if (mode == "ends") return ends_early(comm, who);
    if (mode == "dies") {
      // Each survivor's last operation is a byte to the victim, which dies once it has them
      // all: nothing of theirs waits on it any more, and their sessions end after it died.
      const TagBlock tags = comm.world().reserve(1);
      std::vector<char> bytes(static_cast<std::size_t>(comm.size()));
      const auto byte = [&](int d) {
        return Region::contiguous(&bytes[static_cast<std::size_t>(d)], 1);
      };
      if (comm.rank() == kVictim) {
        std::vector<Request> rs;
        for (int d = 0; d < comm.size(); ++d)
          if (d != kVictim) rs.push_back(comm.irecv(byte(d), d, tags.tag(0)));
        comm.wait_all(rs);
        std::fflush(stdout);
        _exit(0);
      }
      Request r = comm.isend(byte(comm.rank()), kVictim, tags.tag(0));
      comm.wait(r);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      return 0;
    }
    if (mode == "busy") {  // no failure: every device must come through
      const std::string did = conformance::device_busy_elsewhere(comm, 3 * timeout_for(mode));
      std::printf("%sbusy %d ok: %s\n", who.c_str(), comm.rank(), did.c_str());
      std::fflush(stdout);
      return 0;
    }
    std::string line;
    if (mode == "throw")
      line = conformance::device_throws(comm, kVictim, kBound);
    else if (mode == "exit")
      line = conformance::device_exits(comm, kVictim, kBound, [] {
        std::fflush(stdout);
        _exit(0);
      });
    else
      line = conformance::device_stalls(comm, kVictim, kBound, kBound + 2);
    std::printf("%s%s %d ok: %s\n", who.c_str(), comm.rank() == kVictim ? "victim" : "survivor",
                comm.rank(), line.c_str());
  } catch (const std::exception& e) {
    const bool planned = comm.rank() == kVictim && std::string(e.what()) == "injected failure";
    std::printf("%s%s %d: %s\n", who.c_str(), planned ? "victim" : "FAIL device", comm.rank(),
                e.what());
    std::fflush(stdout);
    return planned ? 0 : 1;
  }
  std::fflush(stdout);
  return 0;
}

#ifdef MESHCAST_HAS_UCX
UcxOptions ucx_options(const std::string& mode) {
  UcxOptions o;
  o.timeout_seconds = timeout_for(mode);
  o.chunk_bytes = kChunk;
  o.staging_bytes = kStaging;
  return o;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("conformance: free port");
    std::exit(1);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// One process of the TCP job.
int tcp_rank(int rank, int n, int port, const std::string& mode) {
  try {
    TcpBootstrap boot("127.0.0.1", port, rank, n, 60, "conformance:" + std::to_string(port));
    UcxSession ucx(boot, ucx_options(mode));
    return run(ucx.world(), "ucx-tcp", mode);
  } catch (const std::exception& e) {
    std::printf("conformance ucx-tcp %s: FAIL device %d: %s\n", mode.c_str(), rank, e.what());
    return 1;
  }
}

// Starts the N processes (rank 0 last: the others retry until it listens) and waits for them,
// within a bound; every one must exit 0.
int launch_tcp(int n, const std::string& mode) {
  const int port = free_port();
  std::vector<pid_t> pids(static_cast<std::size_t>(n), -1);
  for (int r = n - 1; r >= 0; --r) {
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("conformance: fork");
      return 1;
    }
    if (pid == 0) {
      const int rc = tcp_rank(r, n, port, mode);
      std::fflush(stdout);
      _exit(rc);
    }
    pids[static_cast<std::size_t>(r)] = pid;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  int failed = 0, left = n;
  while (left > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        ++failed;
        std::printf("conformance ucx-tcp %s: process %d ended with status %d\n", mode.c_str(),
                    static_cast<int>(pid), status);
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > until) {
      std::printf("conformance ucx-tcp %s: FAIL %d processes still running after 300 s\n",
                  mode.c_str(), left);
      for (pid_t p : pids) ::kill(p, SIGKILL);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return failed == 0 ? 0 : 1;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "mpi";
  const bool tcp = backend == "ucx-tcp";
  const std::string mode = argc > (tcp ? 3 : 2) ? argv[tcp ? 3 : 2] : "cases";
  if (mode != "cases" && mode != "throw" && mode != "exit" && mode != "stall" && mode != "ends" &&
      mode != "busy" && mode != "dies") {
    std::fprintf(stderr,
                 "usage: conformance mpi|mpi-native|ucx [cases|throw|exit|stall|ends|busy|dies]\n"
                 "       conformance ucx-tcp N [cases|throw|exit|stall|ends|busy]\n");
    return 2;
  }
  if (tcp) {
#ifdef MESHCAST_HAS_UCX
    return launch_tcp(argc > 2 ? std::atoi(argv[2]) : 4, mode);
#else
    return 77;  // not built with UCX
#endif
  }
  MpiOptions opt;
  opt.timeout_seconds = timeout_for(mode);
  opt.chunk_bytes = opt.network_chunk_bytes = kChunk;
  opt.staging_bytes = kStaging;
  if (backend == "mpi-native") opt.broadcast = MpiOptions::Broadcast::Native;
  int rc = 77, rank = -1;  // 77: a backend this build lacks
  {
    MpiSession mpi(&argc, &argv, opt);
    rank = mpi.rank();
    if (backend == "mpi" || backend == "mpi-native") rc = run(mpi.world(), backend, mode);
#ifdef MESHCAST_HAS_UCX
    if (backend == "ucx") {
      UcxSession ucx(mpi, ucx_options(mode));
      rc = run(ucx.world(), backend, mode);
    }
#endif
  }
  if (mode == "dies" && rc == 0)
    std::printf("conformance %s dies: survivor %d ended\n", backend.c_str(), rank);
  return rc;
}
