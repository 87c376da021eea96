// The process backends of `meshcast reshard` and `meshcast sync`: one process per device, under
// mpirun or, for ucx and nccl, started by torchrun, srun or by hand with a TCP rendezvous
// (MESHCAST_RENDEZVOUS, MESHCAST_RANK, MESHCAST_SIZE, or the launcher's variables:
// TcpBootstrap::from_env; MPI is then never initialised). Every rank parses the same options and
// plans once the backend has started (a rank whose input fails fails every rank alike, with
// --topology auto after discovering the job's topology together); the ranks then check that
// their plans agree (a rank given other options would otherwise hang or corrupt), and run, time
// and verify together. Only rank 0 prints. Built only when the MPI backend is.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "cli.h"
#include "lib/support/text.h"
#include "meshcast/bootstrap.h"
#include "meshcast/discover.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/mpi.h"
#include "meshcast/reshard.h"
#include "meshcast/testing.h"
#ifdef MESHCAST_HAS_UCX
#include "meshcast/ucx.h"
#endif
#ifdef MESHCAST_HAS_NCCL
#include "meshcast/nccl.h"
#endif

namespace meshcast::cli {

std::string digest(const std::string& text) {
  return std::to_string(std::hash<std::string>{}(text));
}

void agree(Bootstrap& boot, const std::vector<std::pair<std::string, std::string>>& settings) {
  // One short record per rank, a line per setting (values are bounded: numbers, words, hashes).
  std::string mine;
  for (const auto& [name, value] : settings) mine += value + '\n';
  const auto all = boot.allgather(std::vector<unsigned char>(mine.begin(), mine.end()));
  std::vector<std::vector<std::string>> values;  // [rank][setting]
  for (const auto& record : all) {
    values.emplace_back();
    std::string line;
    for (unsigned char c : record)
      if (c == '\n')
        values.back().push_back(std::exchange(line, {}));
      else
        line += static_cast<char>(c);
  }
  for (std::size_t i = 0; i < settings.size(); ++i) {
    std::map<std::string, std::vector<int>> holders;  // value -> ranks
    for (std::size_t r = 0; r < values.size(); ++r)
      holders[i < values[r].size() ? values[r][i] : "?"].push_back(static_cast<int>(r));
    if (holders.size() < 2) continue;
    // The value most ranks have is taken as meant, on a tie the lowest rank's (not the order of
    // the values, which are hashes); the others are named (a bounded list).
    const auto most = std::max_element(holders.begin(), holders.end(), [](auto& x, auto& y) {
      if (x.second.size() != y.second.size()) return x.second.size() < y.second.size();
      return x.second.front() > y.second.front();
    });
    std::vector<int> odd;
    for (auto it = holders.begin(); it != holders.end(); ++it)
      if (it != most) odd.insert(odd.end(), it->second.begin(), it->second.end());
    std::sort(odd.begin(), odd.end());
    std::string list;
    for (std::size_t k = 0; k < std::min<std::size_t>(odd.size(), 8); ++k) {
      if (k) list += ',';  // not ("," + ...): GCC 12 -O3 warns of a false -Wrestrict there
      list += std::to_string(odd[k]);
    }
    if (odd.size() > 8) list += " and " + std::to_string(odd.size() - 8) + " more";
    const std::string& name = settings[i].first;
    throw ValidationError(name,
                          (odd.size() > 1 ? "ranks " + list + " were" : "rank " + list + " was") +
                              " started with a different " + name + " than the " +
                              std::to_string(most->second.size()) +
                              " others (every rank must be given the same options)");
  }
}

void checked_together(Bootstrap& boot, const std::function<void()>& checks) {
  // A record per rank: empty, or its exit status, a newline and its error's line (bounded).
  std::exception_ptr failure;
  std::string mine;
  try {
    checks();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    mine = std::to_string(exit_status(e)) + '\n' + one_line(e.what()).substr(0, 1000);
  }
  const auto all = boot.allgather(std::vector<unsigned char>(mine.begin(), mine.end()));
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    if (static_cast<int>(r) == boot.rank()) std::rethrow_exception(failure);
    const std::string record(all[r].begin(), all[r].end());
    const std::size_t nl = record.find('\n');
    const int status = nl == std::string::npos ? 1 : std::atoi(record.substr(0, nl).c_str());
    const ErrorKind kind = status == 2   ? ErrorKind::BadInput
                           : status == 3 ? ErrorKind::PeerFailure
                           : status == 4 ? ErrorKind::Io
                                         : ErrorKind::Internal;
    throw Error(kind, "rank " + std::to_string(r),
                record.substr(nl == std::string::npos ? 0 : nl + 1));
  }
}

void check_job_capacity(Bootstrap& boot, std::int64_t mine, const std::string& field) {
  // Every rank's record (host name, its bytes, the memory it may use there) to every rank, which
  // all judge alike: a refusal on some ranks only would leave the others waiting.
  // A bad MESHCAST_HOSTNAME, or a rank's bytes over its own MESHCAST_MAX_BUFFER_BYTES (which
  // may differ by rank), refused on every rank.
  std::string host;
  checked_together(boot, [&] {
    host = discover_host_name();
    check_limit("buffer bytes", mine, limits().buffer_bytes, "BUFFER_BYTES");
  });
  const std::string record = host + '\n' + std::to_string(mine) + '\n' +
                             std::to_string(static_cast<std::int64_t>(usable_memory_bytes()));
  const auto all = boot.allgather(std::vector<unsigned char>(record.begin(), record.end()));
  struct Host {
    double need = 0, usable = 0;
    int ranks = 0;
  };
  std::map<std::string, Host> hosts;
  for (std::size_t r = 0; r < all.size(); ++r) {
    std::istringstream in(std::string(all[r].begin(), all[r].end()));
    std::string name;
    std::int64_t bytes = 0, usable = 0;
    std::getline(in, name);
    in >> bytes >> usable;
    Host& h = hosts[name];
    h.need += static_cast<double>(bytes);
    h.usable = h.ranks++ == 0 ? static_cast<double>(usable) : std::min(h.usable, double(usable));
  }
  for (const auto& [name, h] : hosts)
    if (h.usable > 0 && h.need > h.usable)
      throw ValidationError(field, "the " + std::to_string(h.ranks) + " ranks on host " + name +
                                       " need " + human_bytes(static_cast<std::int64_t>(h.need)) +
                                       " of tile buffers together, more than the " +
                                       human_bytes(static_cast<std::int64_t>(h.usable)) + " (" +
                                       std::to_string(static_cast<int>(kMemoryShare * 100)) +
                                       "% of its memory) a run may take there");
}

namespace {
// MESHCAST_TIMEOUT: seconds without progress after which a wait checks its peers and fails
// naming the silent ones (a stopped process); default 60. A process that ended is named sooner.
double peer_timeout() {
  const char* text = std::getenv("MESHCAST_TIMEOUT");
  if (!text) return 60;
  char* end = nullptr;
  const double t = std::strtod(text, &end);
  if (!detail::plain_decimal(text) || end == text || *end != '\0' || !(t >= 1 && t <= 86400))
    throw ValidationError("MESHCAST_TIMEOUT",
                          "expected seconds in [1, 86400], got " + detail::quote(text));
  return t;
}

// The started backends, torn down in reverse order of their start.
struct Sessions {
  std::unique_ptr<TcpBootstrap> tcp;
  std::unique_ptr<MpiSession> mpi;
#ifdef MESHCAST_HAS_UCX
  std::unique_ptr<UcxSession> ucx;
#endif
#ifdef MESHCAST_HAS_NCCL
  std::unique_ptr<NcclSession> nccl;
#endif
};

// MPI's start waits in the launcher (PMIx) for every rank of the job: one that died there,
// under mpirun --enable-recovery, left the others waiting for ever. A process whose MPI has
// not started within the rendezvous timeout says so and exits 3, as for a peer found failed
// later (the CLI may; the library leaves it to its caller).
class StartWatch {
 public:
  explicit StartWatch(double seconds)
      : thread_([this, seconds] {
          std::unique_lock lock(mutex_);
          if (done_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                                [&] { return done_; }))
            return;
          std::fprintf(
              stderr,
              "meshcast: mpi: MPI did not start within %g s: a rank of the job ended or never "
              "started (or the job starts slower: raise MESHCAST_RENDEZVOUS_TIMEOUT)\n",
              seconds);
          std::_Exit(3);
        }) {}
  ~StartWatch() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  StartWatch(const StartWatch&) = delete;
  StartWatch& operator=(const StartWatch&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;  // last: it starts once the rest is made
};

void start_and_run(const std::string& backend, const std::function<void(ProcessSession&)>& fn,
                   Sessions& s) {
  // Read first: a bad value is refused before the rendezvous waits for the others (set for
  // the job, as it mostly is, every rank refuses it at once; a rank alone given one is named
  // missing by the others at the rendezvous timeout).
  const double timeout = peer_timeout();
  // The bootstrap: a TCP rendezvous when the environment gives one (ucx, nccl), else MPI.
  std::string size_from;
  if (backend != "mpi")
    if (const auto env = LaunchEnv::detect()) {
      s.tcp = TcpBootstrap::from_launch(*env);
      if (s.tcp) size_from = env->size_from;
    }
  MpiOptions mpi_options;
  mpi_options.timeout_seconds = timeout;
  mpi_options.exchange_timeout_seconds =
      LaunchEnv::timeout_from([](const char* name) { return std::getenv(name); });
  if (!s.tcp) {
    const StartWatch watch(mpi_options.exchange_timeout_seconds);
    s.mpi = std::make_unique<MpiSession>(nullptr, nullptr, mpi_options);
  }
  Bootstrap& boot = s.tcp ? static_cast<Bootstrap&>(*s.tcp) : *s.mpi;
  // Every rank on one backend before any starts its own: a ucx rank's first exchange (its
  // worker address) met an mpi rank's first check, and each read the other's bytes.
  agree(boot, {{"backend", backend}});
  Communicator* comm = s.mpi ? &s.mpi->world() : nullptr;
#ifdef MESHCAST_HAS_UCX
  UcxOptions ucx_options;
  ucx_options.timeout_seconds = timeout;
  if (backend == "ucx") comm = &(s.ucx = std::make_unique<UcxSession>(boot, ucx_options))->world();
#endif
#ifdef MESHCAST_HAS_NCCL
  if (backend == "nccl") comm = &(s.nccl = std::make_unique<NcclSession>(boot))->world();
#endif
  if (!comm || comm->backend() != backend)
    throw ValidationError("backend", backend + " is not built into this meshcast");
  ProcessSession session{*comm, boot, size_from};
#ifdef MESHCAST_HAS_NCCL
  session.nccl = s.nccl.get();
#endif
  fn(session);
}
}  // namespace

void with_process_backend(const std::string& backend,
                          const std::function<void(ProcessSession&)>& fn) {
  Sessions sessions;  // outside the try: alive while a failure is reported
  try {
    start_and_run(backend, fn, sessions);
  } catch (const std::exception& e) {
    // Reported and ended here, with every session still standing: destroying one after a peer
    // failed would free shared windows or finalize MPI, which could wait forever on that peer
    // (and the error would never show).
    report_error(e);
    std::cout.flush();
    std::_Exit(exit_status(e));
  }
}

Topology discover_job_topology(ProcessSession& session, const std::string& topology) {
  std::string preset;
  if (!is_auto_topology(topology, &preset))
    throw InternalError("topology", "discover_job_topology without auto");
  if (session.comm.caps().device_memory)  // the same on every rank: all refuse alike
    throw ValidationError("topology", "auto is not available with --backend " +
                                          session.comm.backend() +
                                          " (its transport works on device memory): give a "
                                          "file or a preset");
  // A bad host name (MESHCAST_HOSTNAME) refused as "rank R: ..." on every rank: discovery's
  // own agreement gives every rank the error alone, as if each had it.
  checked_together(session.boot, [] { (void)discover_host_name(); });
  DiscoverOptions o;
  o.preset = preset;
  return discover_topology(session.comm, o);
}

void require_ranks(const ProcessSession& session, std::int64_t needed, const std::string& why,
                   bool exactly) {
  const std::int64_t size = session.comm.size();
  if (size == needed || (size > needed && !exactly)) return;
  const std::string count = (exactly ? "exactly " : "at least ") + std::to_string(needed);
  if (!session.size_from.empty())
    throw ValidationError(session.size_from, why + ", so it must be " + count + " (it is " +
                                                 std::to_string(size) + ")");
  throw ValidationError("backend", why + ", so mpirun must start " + count + " ranks (it started " +
                                       std::to_string(size) + ")");
}

ProcessRun run_plan_on(const Plan& p, ProcessSession& session, int iters, bool verify) {
  Communicator* comm = &session.comm;
  Bootstrap& boot = session.boot;
  const std::int64_t needed = std::int64_t{p.devices().back()} + 1;  // ids reach 2^31 - 1
  require_ranks(session, needed, "the meshes use device ids up to " + std::to_string(needed - 1),
                false);
  agree(boot, {{"plan", std::to_string(std::hash<std::string>{}(p.to_json()))},
               {"iters", std::to_string(iters)},
               {"verify", verify ? "on" : "off"},
               {"backend", session.comm.backend()}});

  const int me = comm->rank();
  const Layout& src = p.src();
  const Layout& dst = p.dst();
  const std::size_t elem = dtype_size(src.dtype());
  check_job_capacity(
      boot,
      (src.mesh().contains(me) ? src.local_elements(me) : 0) * std::int64_t(elem) +
          (dst.mesh().contains(me) ? dst.local_elements(me) : 0) * std::int64_t(elem) +
          reshard_scratch_bytes(p, me),
      "shape");
  std::vector<std::byte> in, out;
  if (src.mesh().contains(me)) {
    in.resize(static_cast<std::size_t>(src.local_elements(me)) * elem);
    fill_source(src, me, in.data());
  }
  if (dst.mesh().contains(me)) out.resize(static_cast<std::size_t>(dst.local_elements(me)) * elem);
  RankBuffers buffers(session.nccl);
  void* src_buf = buffers.place(in);
  void* dst_buf = buffers.place(out);
  ProcessRun result;
  result.root = me == 0;
  for (int it = -1; it < iters; ++it) {  // iteration -1 warms up
    comm->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    reshard(p, *comm, src_buf, dst_buf);
    comm->barrier();
    if (it >= 0)
      result.run.seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  buffers.fetch(dst_buf, out);
  if (verify)
    result.run.mismatches =
        boot.sum(dst.mesh().contains(me) ? count_mismatches(dst, me, out.data()) : 0);
  return result;
}

}  // namespace meshcast::cli
