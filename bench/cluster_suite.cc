// The microbenchmark suite for clusters whose hosts each have one slow network link (the
// emulated hosts of bench/cluster/cluster.sh, or real ones): the paper's cases, every meshcast
// strategy, and the MPI / ScaLAPACK peers, measured in the same run. Under mpirun, world rank d
// is device d, and --topology must describe where the ranks run (checked against hostnames).
//
//   cluster.sh run --hosts 5 --ranks-per-host 4 -- cluster_suite --topology meshes/emulated.json
//        [--groups 1m,nm,2d] [--iters N] [--warmup N] [--json FILE] [--filter TEXT]
//        [--sizes-mib A,B] [--chunk-kib N]
//
// Groups (K devices per host, H hosts in the topology):
//   1m  1-to-m: a replicated 1-D f32 tensor from device 0 (host 0) to an h x k mesh on hosts
//       1..h, k devices each, for the paper's (h, k) = 1x1 1x2 1x3 1x4 2x2 3x2 4x2 (those that
//       fit), at each --sizes-mib (default 16, 64)
//   nm  n-to-m: a (256,256,256) f32 tensor from an hs x K mesh on hosts [0, hs) to one on hosts
//       [hs, 2hs) (hs = min(2, H/2)), the paper's specs, and hs x K -> 3 x K (S0RR -> S0RR) on
//       (384,256,170) when 3 more hosts exist
//   2d  2-D block layouts (4096 x 2048 f64) between the same meshes, with ScaLAPACK's p?gemr2d
// Methods: meshcast's sendrecv, allgather, broadcast with no balancing, greedy and search (a
// plan equal to an earlier method's is timed once and reported as the same), and the peers:
// one MPI_Send of the tensor across one link and MPI_Bcast (1m), a hand-written MPI_Alltoallv and
// all-gather-then-slice (all groups), Cp?gemr2d (2d).
//
// One row per (case, method), like nccl-tests: time = median over iterations of the slowest
// rank; GB/s = tensor bytes / time; opt = the link-bound optimum's time / time, the optimum
// being the least time any method can take when only the hosts' egress links (the topology's
// network bandwidth) limit: max(the bytes one host alone holds and another needs, the bytes
// that must enter hosts lacking them / the hosts involved) / bandwidth; #wrong = wrong elements
// of a verification run on poisoned buffers. MESHCAST_BENCH_SMOKE=1 picks tiny sizes. Exit
// status 1 if any element was wrong or a case failed, 2 on bad arguments.
#include <meshcast/cost.h>
#include <meshcast/mpi.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "args.h"
#include "methods.h"
#include "mpi_baselines.h"
#include "mpi_harness.h"

using namespace meshcast;
using namespace mcbench;

namespace {

struct Result {
  std::string group, name, method, same_as;
  std::int64_t bytes = 0;
  int receivers_outside = 0;  // 1m: receiving devices off the sender's host (r)
  int receiver_hosts = 0;     // 1m: h
  double time = 0, optimum = 0;
  long long wrong = 0;
  // meshcast's methods: the cost model's and the simulator's time for the method's plan; the
  // method that strategy auto (the planner's default) picks for the case.
  double predicted = 0, simulated = 0;
  std::string auto_pick;
  // The case and the plan options, so that a model can be re-evaluated offline
  // (`meshcast simulate --shape S --dtype D --src SRC --dst DST --strategy --balance`).
  std::string shape, dtype, src, dst, strategy, balance;
};

class Suite {
 public:
  Suite(Bench& b, const Topology& topo) : b_(b), topo_(topo) {
    hosts_ = topo.hosts();
    per_host_ = static_cast<int>(topo.device_count()) / hosts_;
    // The cases name devices as host * K + i: the file must place them so.
    for (int d = 0; d < static_cast<int>(topo.device_count()); ++d)
      if (!topo.covers(d) || topo.host_of(d) != d / per_host_)
        throw ValidationError("topology",
                              "the suite needs K devices on each host, device d on "
                              "host d / K; " +
                                  topo.name() + " is not so");
  }
  int hosts() const { return hosts_; }
  int per_host() const { return per_host_; }
  const std::vector<Result>& results() const { return results_; }
  bool failed() const { return failed_; }

  static void header() {
    std::printf("%-3s %-44s %8s %-18s %10s %8s %6s %7s  %s\n", "#", "case", "size", "method",
                "time(ms)", "GB/s", "opt", "#wrong", "note");
    std::fflush(stdout);
  }

  // Measures `src -> dst` on `members` (sorted world ranks) with every meshcast strategy and
  // the given peers (built inside the case, on its communicator).
  using Peers = std::function<std::vector<Method>(MPI_Comm, Buffers&, std::vector<int>&)>;
  void run_case(const std::string& group, const std::string& name, const Layout& src,
                const Layout& dst, const std::vector<int>& members, const Peers& peers,
                int receivers_outside = 0, int receiver_hosts = 0) {
    if (!b_.cfg().wants(name)) return;
    b_.on_ranks(members, name, [&](MPI_Comm part) {
      Buffers buf(src, dst, b_.me());
      std::vector<Plan> plans;
      std::vector<std::string> labels, same;         // same[i]: the earlier label with plan i's ops
      std::vector<std::pair<double, double>> model;  // per label: predicted, simulated
      std::vector<std::string> plan_labels;
      for (const PlanMethod& c : kPlanMethods) {
        PlanOptions po;
        po.strategy = c.strategy;
        po.balance = c.balance;
        po.chunk_bytes = chain_chunk();
        Plan p = plan(src, dst, topo_, po);
        model.emplace_back(p.stats().predicted_seconds, simulate(p, topo_, po.chunk_bytes).seconds);
        std::size_t k = 0;
        while (k < plans.size() && plans[k].ops() != p.ops()) ++k;
        labels.push_back(c.label);
        same.push_back(k < plans.size() ? plan_labels[k] : "");
        if (k == plans.size()) {
          plans.push_back(std::move(p));
          plan_labels.push_back(c.label);
        }
      }
      std::vector<Method> ms;
      for (std::size_t i = 0, k = 0; i < labels.size(); ++i)
        if (same[i].empty())
          ms.push_back(meshcast_method(labels[i], b_.group(b_.comm()), plans[k++], buf.src(),
                                       buf.dst(), buf.out.size()));
      std::vector<int> devices = members;
      for (Method& m : peers(part, buf, devices)) ms.push_back(std::move(m));
      PlanOptions auto_options;
      auto_options.chunk_bytes = chain_chunk();
      const Strategy picked = plan(src, dst, topo_, auto_options).strategy();
      const std::string auto_pick =
          picked == Strategy::Broadcast ? "broadcast+search" : to_string(picked);
      const auto [t, wrong] = b_.measure(part, ms);
      const double optimum = static_cast<double>(bound_bytes(src, dst)) / topo_.network().bandwidth;
      std::string shape;
      for (std::int64_t e : src.shape()) {
        if (!shape.empty()) shape += ',';
        shape += std::to_string(e);
      }
      auto add = [&](const std::string& method, std::size_t j, const std::string& same_as) {
        Result r;
        r.group = group;
        r.name = name;
        r.method = method;
        r.same_as = same_as;
        r.bytes = src.bytes();
        r.receivers_outside = receivers_outside;
        r.receiver_hosts = receiver_hosts;
        r.time = t[j];
        r.optimum = optimum;
        r.wrong = wrong[j];
        if (j < plans.size()) {
          const auto i = static_cast<std::size_t>(std::find(labels.begin(), labels.end(), method) -
                                                  labels.begin());
          std::tie(r.predicted, r.simulated) = model[i];
        }
        r.auto_pick = auto_pick;
        r.shape = shape;
        r.dtype = to_string(src.dtype());
        r.src = src.str();
        r.dst = dst.str();
        for (const PlanMethod& c : kPlanMethods)
          if (method == c.label) {
            r.strategy = to_string(c.strategy);
            r.balance = to_string(c.balance);
          }
        if (r.wrong) failed_ = true;
        results_.push_back(r);
        if (b_.me() == 0) print(r);
      };
      std::map<std::string, std::size_t> index;
      for (std::size_t j = 0; j < ms.size(); ++j) index[ms[j].name] = j;
      for (std::size_t i = 0; i < labels.size(); ++i)
        add(labels[i], index.at(same[i].empty() ? labels[i] : same[i]), same[i]);
      for (std::size_t j = plans.size(); j < ms.size(); ++j) add(ms[j].name, j, "");
    });
  }

 private:
  // The link-bound optimum's bytes (see the comment at the top).
  std::int64_t bound_bytes(const Layout& src, const Layout& dst) const {
    const std::int64_t elem = static_cast<std::int64_t>(dtype_size(dst.dtype()));
    std::vector<std::int64_t> only(static_cast<std::size_t>(hosts_), 0);
    std::int64_t enter = 0;
    std::set<int> involved;
    for (const Task& t : tasks(src, dst)) {
      std::set<int> have, need;
      for (const auto& g : t.sources)
        for (int d : g) have.insert(topo_.host_of(d));
      for (int d : t.destinations) need.insert(topo_.host_of(d));
      involved.insert(have.begin(), have.end());
      involved.insert(need.begin(), need.end());
      std::int64_t lacking = 0;
      for (int h : need) lacking += have.count(h) ? 0 : 1;
      const std::int64_t bytes = t.box.volume() * elem;
      enter += lacking * bytes;
      if (have.size() == 1 && lacking) only[static_cast<std::size_t>(*have.begin())] += bytes;
    }
    std::int64_t most = 0;
    for (std::int64_t o : only) most = std::max(most, o);
    const auto n = static_cast<std::int64_t>(std::max<std::size_t>(1, involved.size()));
    return std::max(most, (enter + n - 1) / n);
  }

  static void print(const Result& r) {
    const double gbs = static_cast<double>(r.bytes) / r.time / 1e9;
    std::printf("%-3s %-44s %8s %-18s %10.2f %8.3f %6.2f %7lld  %s\n", r.group.c_str(),
                r.name.c_str(), size_name(r.bytes).c_str(), r.method.c_str(), r.time * 1e3, gbs,
                r.optimum / r.time, r.wrong,
                r.same_as.empty() ? "" : ("same plan as " + r.same_as).c_str());
    std::fflush(stdout);
  }

  // The chunk the chains of these cases travel in: every case crosses hosts.
  std::int64_t chain_chunk() const { return static_cast<std::int64_t>(b_.cfg().chain_chunk()); }

  Bench& b_;
  const Topology& topo_;
  int hosts_ = 1, per_host_ = 1;
  std::vector<Result> results_;
  bool failed_ = false;
};

// "h x k @ [ids]" for a mesh of k devices on each of hosts first .. first+h-1.
std::string mesh_on(int first, int h, int k, int per_host, std::vector<int>* ids) {
  std::string s = std::to_string(h) + "x" + std::to_string(k) + "@[";
  for (int j = 0; j < h; ++j)
    for (int i = 0; i < k; ++i) {
      const int d = (first + j) * per_host + i;
      ids->push_back(d);
      if (j || i) s += ',';
      s += std::to_string(d);
    }
  return s + "]";
}

std::vector<int> sorted_union(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  return a;
}

// Peers of every group: MPI_Alltoallv and all-gather-then-slice, set up on the case's ranks.
Suite::Peers mpi_peers(const Layout& src, const Layout& dst, int me) {
  return [&src, &dst, me](MPI_Comm part, Buffers& buf, std::vector<int>& devices) {
    auto a2a = std::make_shared<AlltoallvMove>(src, dst, part, devices, me, buf.src(), buf.dst());
    auto ag =
        std::make_shared<AllgatherSliceMove>(src, dst, part, devices, me, buf.src(), buf.dst());
    return std::vector<Method>{
        {"MPI_Alltoallv", [a2a] { a2a->run(); }, buf.dst(), buf.out.size(), &dst},
        {"allgather+slice", [ag] { ag->run(); }, buf.dst(), buf.out.size(), &dst}};
  };
}

void group_1m(Suite& s, Bench& b, const std::vector<std::int64_t>& sizes) {
  const std::pair<int, int> shapes[] = {{1, 1}, {1, 2}, {1, 3}, {1, 4}, {2, 2}, {3, 2}, {4, 2}};
  for (std::int64_t bytes : sizes)
    for (const auto& [h, k] : shapes) {
      if (h + 1 > s.hosts() || k > s.per_host()) continue;
      std::vector<int> receivers;
      const std::string mesh = mesh_on(1, h, k, s.per_host(), &receivers);
      const Shape shape{bytes / 4};
      const Layout src = Layout::parse(shape, DType::f32, "1x1@0:R", "src");
      const Layout dst = Layout::parse(shape, DType::f32, mesh + ":R", "dst");
      const std::string name = "1x1>" + std::to_string(h) + "x" + std::to_string(k);
      const int me = b.me(), first = receivers.front();
      auto peers = [&, me, first, bytes](MPI_Comm part, Buffers& buf, std::vector<int>& devices) {
        std::vector<Method> ms = mpi_peers(src, dst, me)(part, buf, devices);
        const int to = union_rank(devices, first);
        void* out = me == first ? buf.dst() : nullptr;
        const void* in = buf.src();
        ms.push_back({"MPI_Send 1 link",
                      [=] {
                        if (me == 0)
                          mpi_check(MPI_Send(in, static_cast<int>(bytes), MPI_BYTE, to, 7, part),
                                    "MPI_Send");
                        else if (me == first)
                          mpi_check(MPI_Recv(out, static_cast<int>(bytes), MPI_BYTE, 0, 7, part,
                                             MPI_STATUS_IGNORE),
                                    "MPI_Recv");
                      },
                      out, me == first ? buf.out.size() : 0, &dst});
        void* bc = me == 0 ? const_cast<void*>(buf.src()) : buf.dst();
        ms.push_back({"MPI_Bcast",
                      [=] {
                        mpi_check(MPI_Bcast(bc, static_cast<int>(bytes), MPI_BYTE, 0, part),
                                  "MPI_Bcast");
                      },
                      buf.dst(), buf.out.size(), &dst});
        return ms;
      };
      s.run_case("1m", name, src, dst, sorted_union({0}, receivers), peers, h * k, h);
    }
}

void group_nm(Suite& s, Bench& b) {
  const int hs = std::min(2, s.hosts() / 2), k = s.per_host();
  if (hs < 1) return;
  const bool smoke = b.cfg().smoke;
  std::vector<int> a, c, e;
  const std::string from = mesh_on(0, hs, k, k, &a), to = mesh_on(hs, hs, k, k, &c);
  const char* specs[][2] = {{"S0RR", "S0RR"},   {"RRR", "RRR"},   {"RS0R", "S0RR"},
                            {"RS01R", "S01RR"}, {"S1RR", "S0RR"}, {"RS0R", "RRS0"}};
  const Shape shape = smoke ? Shape{16, 16, 16} : Shape{256, 256, 256};
  for (const auto& sp : specs) {
    const Layout src = Layout::parse(shape, DType::f32, from + ":" + sp[0], "src");
    const Layout dst = Layout::parse(shape, DType::f32, to + ":" + sp[1], "dst");
    const std::string name = std::to_string(hs) + "x" + std::to_string(k) + ">" +
                             std::to_string(hs) + "x" + std::to_string(k) + " " + sp[0] + ">" +
                             sp[1] + " " + shape_str(shape);
    s.run_case("nm", name, src, dst, sorted_union(a, c), mpi_peers(src, dst, b.me()));
  }
  if (s.hosts() < hs + 3) return;
  const std::string to3 = mesh_on(hs, 3, k, k, &e);
  const Shape shape3 = smoke ? Shape{24, 16, 10} : Shape{384, 256, 170};
  const Layout src = Layout::parse(shape3, DType::f32, from + ":S0RR", "src");
  const Layout dst = Layout::parse(shape3, DType::f32, to3 + ":S0RR", "dst");
  const std::string name = std::to_string(hs) + "x" + std::to_string(k) + ">3x" +
                           std::to_string(k) + " S0RR>S0RR " + shape_str(shape3);
  s.run_case("nm", name, src, dst, sorted_union(a, e), mpi_peers(src, dst, b.me()));
}

#ifdef MESHCAST_HAS_SCALAPACK
// ScaLAPACK's redistribution of one move, set up once: a BLACS context over the case's ranks
// and the grids of both layouts, released in the reverse order.
struct Gemr2d {
  const Layout& src;
  int system = -1, all = -1;
  std::unique_ptr<ScalapackGrid> a, b;
  std::vector<std::byte> out;
  Gemr2d(const Layout& s, const Layout& d, MPI_Comm part, int me, std::size_t out_bytes)
      : src(s), system(Csys2blacs_handle(part)), all(system), out(out_bytes) {
    int n = 0;
    MPI_Comm_size(part, &n);
    Cblacs_gridinit(&all, "R", 1, n);
    a = std::make_unique<ScalapackGrid>(s, me, system);
    b = std::make_unique<ScalapackGrid>(d, me, system);
  }
  void run(const void* in) { scalapack_gemr2d(src.dtype(), src, *a, in, *b, out.data(), all); }
  ~Gemr2d() {
    b.reset();
    a.reset();
    Cblacs_gridexit(all);
    Cfree_blacs_system_handle(system);
  }
  Gemr2d(const Gemr2d&) = delete;
  Gemr2d& operator=(const Gemr2d&) = delete;
};

void group_2d(Suite& s, Bench& b) {
  const int hs = std::min(2, s.hosts() / 2), k = s.per_host();
  if (hs < 1) return;
  std::vector<int> a, c, d;
  const std::string from = mesh_on(0, hs, k, k, &a), to = mesh_on(hs, hs, k, k, &c);
  const std::string to_t = std::to_string(k) + "x" + std::to_string(hs) + to.substr(to.find('@'));
  const Shape shape = b.cfg().smoke ? Shape{64, 64} : Shape{4096, 2048};
  const std::pair<std::string, std::string> cases[] = {{from + ":S0S1", to + ":S0S1"},
                                                       {from + ":S0S1", to_t + ":S0S1"}};
  const int me = b.me();
  for (const auto& [fs, ts] : cases) {
    const Layout src = Layout::parse(shape, DType::f64, fs, "src");
    const Layout dst = Layout::parse(shape, DType::f64, ts, "dst");
    const std::string name =
        src.mesh().str() + ":S0S1>" + dst.mesh().str() + ":S0S1 " + shape_str(shape) + " f64";
    const std::vector<int> members = sorted_union(a, c);
    // BLACS maps grids by rank in the system handle's communicator: the members must be world
    // ranks 0 .. n-1, which these meshes are (hosts from 0, all devices of each).
    auto peers = [&, me](MPI_Comm part, Buffers& buf, std::vector<int>& devices) {
      std::vector<Method> ms = mpi_peers(src, dst, me)(part, buf, devices);
      auto g = std::make_shared<Gemr2d>(src, dst, part, me, buf.out.size());
      const void* in = buf.src();
      ms.push_back({"Cpdgemr2d", [g, in] { g->run(in); }, g->out.data(), g->out.size(), &dst});
      return ms;
    };
    s.run_case("2d", name, src, dst, members, peers);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  cfg.groups = "1m,nm,2d";
  std::string topology_path;
  std::vector<std::int64_t> sizes{16 * kMiB, 64 * kMiB};
  if (meshcast::bench::smoke_mode()) {
    cfg.smoke = true;
    cfg.iters = 2;
    sizes = {kMiB};
  }
  meshcast::bench::Args("cluster_suite", "cluster.sh run ... -- cluster_suite --topology FILE")
      .text("--topology", topology_path, "where the ranks run (required)", "FILE")
      .text("--groups", cfg.groups, "the groups to run, of 1m,nm,2d", "LIST")
      .number("--iters", cfg.iters, 1, "timed iterations per method")
      .number("--warmup", cfg.warmup, 0, "untimed iterations first")
      .text("--json", cfg.json, "write the rows to FILE", "FILE")
      .text("--filter", cfg.filter, "only the cases whose name contains TEXT")
      .list<std::int64_t>(
          "--sizes-mib", sizes, "A,B",
          [](const std::string& v) { return meshcast::bench::Args::integer(v, 1, 4096) * kMiB; },
          "1m's tensor sizes in MiB (1..4096)")
      .custom(
          "--chunk-kib", "N",
          [&](const std::string& v) {
            cfg.chunk = cfg.network_chunk =
                static_cast<std::size_t>(meshcast::bench::Args::integer(v, 1, 1 << 20)) * 1024;
          },
          "chain chunk in KiB, in and across hosts")
      .parse(argc, argv);
  if (topology_path.empty()) {
    std::fprintf(stderr,
                 "cluster_suite: --topology: required (the file naming each rank's host)\n");
    return 2;
  }
  MpiOptions options;
  options.timeout_seconds = 120;
  options.chunk_bytes = cfg.chunk;
  options.network_chunk_bytes = cfg.network_chunk;
  MpiSession mpi(&argc, &argv, options);
  int me = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int status = 0;
  try {
    const Topology topo = Topology::load(topology_path);
    // The topology must say where the ranks really are: compare hostnames.
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    const std::string expect = topo.covers(me) ? topo.host_name(topo.host_of(me)) : "(none)";
    int bad = topo.device_count() != world || expect != host ? 1 : 0;
    if (bad)
      std::fprintf(stderr,
                   "cluster_suite: topology: rank %d runs on host '%s' but %s places it on %s "
                   "(%lld devices for %d ranks)\n",
                   me, host, topology_path.c_str(), expect.c_str(),
                   static_cast<long long>(topo.device_count()), world);
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad) return 2;
    Bench bench(mpi, mpi.world(), cfg);
    Suite suite(bench, topo);
    const std::string desc =
        machine(world, topo.name() + " topology (" + std::to_string(suite.hosts()) + " hosts x " +
                           std::to_string(suite.per_host()) + " ranks)");
    if (me == 0) {
      std::printf("# cluster_suite: %s\n# iterations %d (+%d warm-up), %s; link %.3f GB/s\n",
                  desc.c_str(), cfg.iters, cfg.warmup, cfg.smoke ? "SMOKE sizes" : "full sizes",
                  topo.network().bandwidth / 1e9);
      Suite::header();
    }
    const std::string groups = "," + cfg.groups + ",";
    auto has = [&](const std::string& g) {
      return groups.find("," + g + ",") != std::string::npos;
    };
    if (has("1m")) group_1m(suite, bench, sizes);
    if (has("nm")) group_nm(suite, bench);
#ifdef MESHCAST_HAS_SCALAPACK
    if (has("2d")) {
      int pnum = 0, procs = 0;
      Cblacs_pinfo(&pnum, &procs);
      group_2d(suite, bench);
    }
#else
    if (has("2d") && me == 0) std::printf("# group 2d skipped: built without ScaLAPACK\n");
#endif
    if (me == 0) {
      long long wrong = 0;
      for (const Result& r : suite.results()) wrong += r.wrong;
      std::printf("# rows %zu, #wrong total %lld\n", suite.results().size(), wrong);
      if (!cfg.json.empty()) {
        nlohmann::json j;
        j["machine"] = desc;
        j["topology"] = nlohmann::json::parse(topo.to_json());
        j["link_bytes_per_s"] = topo.network().bandwidth;
        j["chain_chunk_bytes"] = cfg.chain_chunk();
        j["ranks"] = world;
        j["iters"] = cfg.iters;
        j["warmup"] = cfg.warmup;
        j["smoke"] = cfg.smoke;
        j["date"] = utc_now();
        j["rows"] = nlohmann::json::array();
        for (const Result& r : suite.results())
          j["rows"].push_back({{"group", r.group},
                               {"case", r.name},
                               {"method", r.method},
                               {"same_as", r.same_as},
                               {"bytes", r.bytes},
                               {"seconds", r.time},
                               {"optimum_seconds", r.optimum},
                               {"receivers_outside", r.receivers_outside},
                               {"receiver_hosts", r.receiver_hosts},
                               {"wrong", r.wrong},
                               {"predicted_seconds", r.predicted},
                               {"simulated_seconds", r.simulated},
                               {"auto_pick", r.auto_pick},
                               {"shape", r.shape},
                               {"dtype", r.dtype},
                               {"src", r.src},
                               {"dst", r.dst},
                               {"strategy", r.strategy},
                               {"balance", r.balance}});
        std::ofstream(cfg.json) << j.dump(1) << "\n";
      }
    }
    status = suite.failed() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", me, e.what());
    mpi.abort(1);
  }
#ifdef MESHCAST_HAS_SCALAPACK
  if (cfg.groups.find("2d") != std::string::npos) Cblacs_exit(1);
#endif
  return status;
}
