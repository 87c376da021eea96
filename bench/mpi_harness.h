// The measuring harness of bench/mpi_reshard.cc: configuration, one row per (case, subject,
// baseline), and Bench::measure, which verifies every method once on poisoned buffers and then
// times them alternately (rotating order), each iteration's time being the slowest rank's.
#pragma once

#include <meshcast/meshcast.h>
#include <meshcast/mpi.h>
#include <meshcast/testing.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mpi_baselines.h"
#include "smoke.h"
#include "stats.h"

namespace mcbench {

using namespace meshcast;

inline constexpr std::int64_t kMiB = 1 << 20;

struct Config {
  std::string groups = "a,b,c,d";
  bool fit = false, smoke = false, native = false;
  int iters = 5, warmup = 1;
  std::int64_t max_bytes = std::int64_t{1} << 40;
  std::size_t chunk = MpiOptions{}.chunk_bytes;
  std::size_t network_chunk = MpiOptions{}.network_chunk_bytes;  // chains that cross hosts
  std::size_t chain_chunk() const { return std::min(chunk, network_chunk); }  // across hosts
  std::string backend = "mpi", json, filter;
  bool has(char g) const { return groups.find(g) != std::string::npos; }
  bool wants(const std::string& name) const { return name.find(filter) != std::string::npos; }
};

struct Row {
  std::string group, name, subject, baseline;
  int ranks = 0;
  std::int64_t bytes = 0;
  double time = 0, base_time = 0;
  long long wrong = 0;
  int iters = 0;
};

// One way of doing a case's work, as measure() runs it: run() is timed. Its verification run
// poisons `out` first and counts the wrong elements of `check` (the layout `out` holds on this
// rank) afterwards; a result that is not one layout's tile (a collective's) brings its own
// `reset` (before the run) and `wrong` (this rank's wrong elements after it) instead.
struct Method {
  std::string name;
  std::function<void()> run;
  void* out = nullptr;
  std::size_t out_bytes = 0;
  const Layout* check = nullptr;
  std::function<void()> reset = {};
  std::function<long long()> wrong = {};
};

// A barrier that sleeps between polls: ranks outside a case wait here without taking a core.
inline void quiet_barrier(MPI_Comm comm) {
  MPI_Request r;
  mpi_check(MPI_Ibarrier(comm, &r), "MPI_Ibarrier");
  int done = 0;
  // Back off to 20 ms: a dozen idle ranks waking every 0.5 ms took enough of 2 cores to slow
  // the measured ranks by 20-30% (bench/cluster_suite, 20 ranks).
  std::chrono::microseconds nap(200);
  while (true) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(20000));
  }
}

// The harness's one timing loop: `warmup` untimed and `iters` timed iterations, in each of which
// every function runs once, in an order rotated from one iteration to the next, so that a drift
// of this shared machine's load hits all of them alike (their ratios are the figures). A barrier
// on `comm` starts each run, and a run's time is the slowest rank's. Returns each function's
// median time in seconds, the same on every rank of `comm`.
inline std::vector<double> timed(MPI_Comm comm, int warmup, int iters,
                                 const std::vector<std::function<void()>>& fs) {
  const std::size_t n = fs.size();
  const int total = warmup + iters;
  std::vector<double> t(static_cast<std::size_t>(total) * n, 0);
  for (int it = 0; it < total; ++it)
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t j = (k + static_cast<std::size_t>(it)) % n;
      MPI_Barrier(comm);
      const double t0 = MPI_Wtime();
      fs[j]();
      t[static_cast<std::size_t>(it) * n + j] = MPI_Wtime() - t0;
    }
  mpi_check(
      MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, comm),
      "MPI_Allreduce");
  std::vector<double> med(n);
  for (std::size_t j = 0; j < n; ++j) {
    std::vector<double> v;
    for (int it = warmup; it < total; ++it) v.push_back(t[static_cast<std::size_t>(it) * n + j]);
    med[j] = meshcast::bench::median(v);
  }
  return med;
}
inline double timed(MPI_Comm comm, int warmup, int iters, const std::function<void()>& f) {
  return timed(comm, warmup, iters, std::vector<std::function<void()>>{f}).front();
}

// Every MPI suite's measurement: verifies each method once (reset or poison, run, count wrong
// elements, summed over `comm`), then times them all together (timed()). Returns the median
// times (s) and the wrong-element counts, per method, on every rank of `comm`.
struct Measured {
  std::vector<double> seconds;
  std::vector<long long> wrong;
};
inline Measured measure(MPI_Comm comm, int warmup, int iters, const std::vector<Method>& ms) {
  int me = 0;  // count_mismatches' device: the world rank
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  Measured out;
  std::vector<std::function<void()>> runs;
  for (const Method& m : ms) {
    if (m.reset) m.reset();
    if (m.out_bytes) std::memset(m.out, 0xA5, m.out_bytes);
    MPI_Barrier(comm);
    m.run();
    long long w = m.wrong                  ? m.wrong()
                  : m.out_bytes && m.check ? count_mismatches(*m.check, me, m.out)
                                           : 0;
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_LONG_LONG, MPI_SUM, comm), "MPI_Allreduce");
    out.wrong.push_back(w);
    runs.push_back(m.run);
  }
  out.seconds = timed(comm, warmup, iters, runs);
  return out;
}

class Bench {
 public:
  Bench(MpiSession& mpi, Communicator& comm, Config cfg)
      : mpi_(mpi), comm_(comm), cfg_(std::move(cfg)) {
    MPI_Comm_rank(MPI_COMM_WORLD, &me_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
    comms_.push_back(&comm_);
  }
  // Another communicator whose reshards run in cases (on_ranks gives it a group); collective.
  void add_comm(Communicator& c) { comms_.push_back(&c); }
  void drop_added_comms() { comms_.resize(1); }
  // The group of the running case's ranks on `c` (a reshard is started by every member).
  const Group& group(Communicator& c) const {
    for (std::size_t i = 0; i < comms_.size(); ++i)
      if (comms_[i] == &c) return groups_[i];
    throw std::logic_error("bench: a communicator that was not added");
  }
  int me() const { return me_; }
  int world() const { return world_; }
  const Config& cfg() const { return cfg_; }
  Communicator& comm() { return comm_; }
  MpiSession& mpi() { return mpi_; }
  const std::vector<Row>& rows() const { return rows_; }
  bool failed() const { return failed_; }

  // Whether a case needing `ranks` ranks runs in this world.
  bool runs(int ranks) const { return cfg_.fit ? ranks <= world_ : ranks == world_; }

  // Runs body(part) on world ranks [0, ranks) with `part` their communicator, while the other ranks
  // sleep; collective over the world. A failure on a participant is reported and counted.
  void on_ranks(int ranks, const std::string& what, const std::function<void(MPI_Comm)>& body) {
    std::vector<int> members(static_cast<std::size_t>(ranks));
    for (int i = 0; i < ranks; ++i) members[static_cast<std::size_t>(i)] = i;
    on_ranks(members, what, body);
  }
  // The same on the given world ranks (`part` orders them by world rank).
  void on_ranks(const std::vector<int>& members, const std::string& what,
                const std::function<void(MPI_Comm)>& body) {
    const bool in = std::find(members.begin(), members.end(), me_) != members.end();
    // Every rank makes the case's groups, in the same order (Communicator::group's rule).
    groups_.clear();
    for (Communicator* c : comms_) groups_.push_back(c->group(members));
    MPI_Comm part = MPI_COMM_NULL;
    mpi_check(MPI_Comm_split(MPI_COMM_WORLD, in ? 0 : MPI_UNDEFINED, me_, &part), "MPI_Comm_split");
    if (part != MPI_COMM_NULL) {
      try {
        body(part);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s: %s\n", me_, what.c_str(), e.what());
        std::fflush(stderr);
        mpi_.abort(1);  // a half-finished collective cannot be recovered
      }
      MPI_Comm_free(&part);
    }
    groups_.clear();
    quiet_barrier(MPI_COMM_WORLD);
  }

  // measure() with this run's iterations, on the running case's ranks `part`.
  Measured measure(MPI_Comm part, const std::vector<Method>& ms) const {
    return mcbench::measure(part, cfg_.warmup, cfg_.iters, ms);
  }

  // Adds (and on rank 0 prints) one row per baseline: ms[subject] against ms[baseline], or
  // against every other method when baseline < 0.
  void report(const std::string& group, const std::string& name, int ranks, std::int64_t bytes,
              const std::vector<Method>& ms, const std::vector<double>& t,
              const std::vector<long long>& wrong, std::size_t subject = 0, int baseline = -1) {
    for (std::size_t j = 0; j < ms.size(); ++j) {
      if (j == subject || (baseline >= 0 && j != static_cast<std::size_t>(baseline))) continue;
      Row r{group,      name, ms[subject].name,          ms[j].name, ranks, bytes,
            t[subject], t[j], wrong[subject] + wrong[j], cfg_.iters};
      if (r.wrong) failed_ = true;
      rows_.push_back(r);
      if (me_ == 0) print(r);
    }
  }

  static void header() {
    std::printf("%-3s %-44s %-18s %5s %12s %10s %8s %-18s %10s %8s %7s %7s\n", "#", "case",
                "subject", "ranks", "bytes", "time(ms)", "GB/s", "baseline", "base(ms)", "baseGB/s",
                "ratio", "#wrong");
    std::fflush(stdout);
  }
  static void print(const Row& r) {
    const double b = static_cast<double>(r.bytes);
    std::printf("%-3s %-44s %-18s %5d %12lld %10.3f %8.2f %-18s %10.3f %8.2f %7.2f %7lld\n",
                r.group.c_str(), r.name.c_str(), r.subject.c_str(), r.ranks,
                static_cast<long long>(r.bytes), r.time * 1e3, b / r.time / 1e9, r.baseline.c_str(),
                r.base_time * 1e3, b / r.base_time / 1e9, r.base_time / r.time, r.wrong);
    std::fflush(stdout);
  }

 private:
  MpiSession& mpi_;
  Communicator& comm_;
  std::vector<Communicator*> comms_;  // those whose case groups on_ranks makes
  std::vector<Group> groups_;         // the running case's, one per communicator
  Config cfg_;
  int me_ = 0, world_ = 1;
  std::vector<Row> rows_;
  bool failed_ = false;
};

// "64M", "256K" or a plain byte count.
inline std::string size_name(std::int64_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + "M";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + "K";
  return std::to_string(bytes);
}

// The machine a run measured: host, cores, CPU model, MPI library, ranks, `extra`, load.
inline std::string machine(int world, const std::string& extra) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string model = "unknown CPU";
  std::ifstream cpu("/proc/cpuinfo");
  for (std::string line; std::getline(cpu, line);)
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(lib, &len);
  std::string mpi(lib, static_cast<std::size_t>(len));
  mpi = mpi.substr(0, mpi.find_first_of(",\n"));
  std::string load;
  std::getline(std::ifstream("/proc/loadavg"), load);
  load = load.substr(0, load.find(' ', load.find(' ', load.find(' ') + 1) + 1));
  std::ostringstream os;
  os << "host " << host << ", " << sysconf(_SC_NPROCESSORS_ONLN) << " cores (" << model << "), "
     << mpi << ", " << world << " ranks, " << extra << ", load average " << load;
  return os.str();
}

inline std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return stamp;
}

// The subject: meshcast's reshard of `src` -> `dst` on `group` (the case's ranks).
inline Method meshcast_method(std::string name, const Group& group, const Plan& p, const void* in,
                              void* out, std::size_t out_bytes) {
  const Layout* check = &p.dst();
  return {std::move(name), [&group, &p, in, out] { reshard(p, group, in, out); }, out, out_bytes,
          check};
}

// Local buffers of one rank for a move; the source filled with test data.
struct Buffers {
  std::vector<std::byte> in, out;
  Buffers(const Layout& src, const Layout& dst, int me) {
    const std::size_t elem = dtype_size(src.dtype());
    if (src.mesh().contains(me)) {
      in.resize(static_cast<std::size_t>(src.local_elements(me)) * elem);
      fill_source(src, me, in.data());
    }
    if (dst.mesh().contains(me))
      out.resize(static_cast<std::size_t>(dst.local_elements(me)) * elem);
  }
  const void* src() const { return in.empty() ? nullptr : in.data(); }
  void* dst() { return out.empty() ? nullptr : out.data(); }
};

}  // namespace mcbench
