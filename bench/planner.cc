// Planner time against device count: meshes of N = 64 ... 65,536 devices moved to a disjoint
// mesh of N devices (N -> N), on a topology of 8 devices per host (NVLink-like intra-host links,
// one network link per host), f32 tensor of (65536, 65536).
//
//   S0S1>S1S0   square AxA mesh, a transpose of the tile grid: N tasks, one holder and one
//               receiver each (O(N) ops and participants);
//   S0R>S1R     (N/2)x2 -> 2x(N/2): N/2 tasks, two holders and two receivers each (O(N), every
//               task has a choice of sender, so the search has moves to try);
//   S0R>RS0     square AxA mesh: N tasks with sqrt(N) holders and sqrt(N) receivers each
//               (N^1.5 participants; up to 16,384 devices, 4,096 with strategy auto, whose
//               allgather candidate has N^2 participants).
// Variants: broadcast with the default balance (search), broadcast with greedy, the default
// options (strategy auto), and broadcast and auto with the local rule (senders chosen task by
// task: what each device of a job computes alone, plan_rank()).
// For the local variants two more columns: rank(ms), the slowest of plan_rank() for three
// devices (the first of each mesh and one in the middle of the source; no whole plan built), and
// vs search, the simulated time (meshcast::simulate, the independent second opinion) of the
// local plan over that of the search plan with the same strategy (N <= 4,096).
//
// Every iteration plans from scratch (tasks, ops, sender choice, accounting). Counters: devices
// (per mesh), tasks, ops, participants (sum over ops of 1 + peers), truncated (the search hit
// its wall-clock cap: the plan is then not deterministic), same (the plan equals the one made
// before timing) and load1 (load average). A table of medians over repetitions, with the CPU
// time per op and per participant, closes the output. Exit status 1 if a plan differed from its
// reference. MESHCAST_BENCH_SMOKE=1 keeps N = 64 and one short repetition (CI).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "harness.h"
#include "meshcast/meshcast.h"

namespace {

using meshcast::Balance;
using meshcast::Layout;
using meshcast::Plan;
using meshcast::Strategy;
using meshcast::bench::median;
using meshcast::bench::smoke_mode;

struct Case {
  std::string name;
  Layout src, dst;
  meshcast::Topology topology;
  meshcast::PlanOptions options;
  std::int64_t devices;  // per mesh
};

std::string range(std::int64_t first, std::int64_t n) {
  return std::to_string(first) + "-" + std::to_string(first + n - 1);
}

void bm_plan(benchmark::State& state, const Case& c) {
  try {
    const std::size_t tasks = meshcast::tasks(c.src, c.dst).size();
    const Plan reference = meshcast::plan(c.src, c.dst, c.topology, c.options);
    bool same = true, truncated = reference.stats().search_truncated;
    for (auto _ : state) {
      Plan p = meshcast::plan(c.src, c.dst, c.topology, c.options);
      state.PauseTiming();
      same = same && p == reference;
      truncated = truncated || p.stats().search_truncated;
      state.ResumeTiming();
    }
    double participants = 0;
    for (const auto& op : reference.ops()) participants += 1 + static_cast<double>(op.peers.size());
    const auto ops = static_cast<double>(reference.ops().size());
    state.counters["devices"] = static_cast<double>(c.devices);
    state.counters["tasks"] = static_cast<double>(tasks);
    state.counters["ops"] = ops;
    state.counters["participants"] = participants;
    state.counters["truncated"] = truncated;
    state.counters["same"] = same;
    state.counters["load1"] = meshcast::bench::load_average();
    if (c.options.balance == Balance::Local) {
      const std::int64_t n = c.devices;
      double worst = 0;
      for (int d : {c.src.mesh().device(0), c.src.mesh().device(n / 2), c.dst.mesh().device(0)}) {
        const auto t0 = std::chrono::steady_clock::now();
        benchmark::DoNotOptimize(meshcast::plan_rank(c.src, c.dst, d, c.topology, c.options));
        worst = std::max(
            worst, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      state.counters["rank_ms"] = worst * 1e3;
      if (n <= 4096) {
        meshcast::PlanOptions search = c.options;
        search.balance = Balance::Search;
        search.strategy = reference.strategy();
        const Plan global = meshcast::plan(c.src, c.dst, c.topology, search);
        state.counters["vs_search"] = meshcast::simulate(reference, c.topology).seconds /
                                      meshcast::simulate(global, c.topology).seconds;
      }
    }
    state.SetLabel(reference.src().str() + " -> " + reference.dst().str() + " " +
                   meshcast::to_string(reference.strategy()) + "/" +
                   meshcast::to_string(c.options.balance));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

std::vector<Case> make_cases(bool smoke) {
  const meshcast::Shape shape{65536, 65536};
  std::vector<Case> out;
  auto topo = [](std::int64_t n) {
    return meshcast::Topology::uniform("8-per-host",
                                       static_cast<int>(std::max<std::int64_t>(1, 2 * n / 8)), 8,
                                       {"nvlink", 150e9, 2e-6}, {"network", 25e9, 5e-6});
  };
  auto add = [&](const std::string& kind, std::int64_t n, const std::string& src_mesh,
                 const std::string& src_spec, const std::string& dst_mesh,
                 const std::string& dst_spec, Strategy st, Balance b) {
    meshcast::PlanOptions opt;
    opt.strategy = st;
    opt.balance = b;
    Layout s =
        Layout::parse(shape, meshcast::DType::f32, src_mesh + "@" + range(0, n) + ":" + src_spec);
    Layout d =
        Layout::parse(shape, meshcast::DType::f32, dst_mesh + "@" + range(n, n) + ":" + dst_spec);
    out.push_back({"planner/" + kind + "/" + meshcast::to_string(st) + "-" +
                       meshcast::to_string(b) + "/" + std::to_string(n),
                   std::move(s), std::move(d), topo(n), opt, n});
  };
  const std::int64_t max_n = smoke ? 64 : 65536;
  const std::pair<Strategy, Balance> variants[] = {{Strategy::Broadcast, Balance::Search},
                                                   {Strategy::Broadcast, Balance::Greedy},
                                                   {Strategy::Auto, Balance::Search},
                                                   {Strategy::Broadcast, Balance::Local},
                                                   {Strategy::Auto, Balance::Local}};
  auto square = [](std::int64_t n) {
    const auto a = static_cast<std::int64_t>(std::lround(std::sqrt(static_cast<double>(n))));
    return std::to_string(a) + "x" + std::to_string(a);
  };
  for (const auto& [st, b] : variants)
    for (std::int64_t n = 64; n <= max_n; n *= 4)
      add("S0S1>S1S0", n, square(n), "S0S1", square(n), "S1S0", st, b);
  for (const auto& [st, b] : variants)
    for (std::int64_t n = 64; n <= max_n; n *= 4)
      add("S0R>S1R", n, std::to_string(n / 2) + "x2", "S0R", "2x" + std::to_string(n / 2), "S1R",
          st, b);
  // Auto also plans allgather, whose ops grow as receivers^2 per task here (N^2 participants).
  for (const auto& [st, b] : variants)
    for (std::int64_t n = 64;
         n <= std::min<std::int64_t>(max_n, st == Strategy::Auto ? 4096 : 16384); n *= 4)
      add("S0R>RS0", n, square(n), "S0R", square(n), "RS0", st, b);
  return out;
}

class Table : public meshcast::bench::TableReporter {
 public:
  using TableReporter::TableReporter;

 protected:
  void print_table(std::FILE* f, const std::vector<Row>& rows) override {
    std::fprintf(f,
                 "\n# meshcast planner time, N -> N devices, 8 devices per host (medians over "
                 "repetitions)\n");
    std::fprintf(f, "# %-10s %-19s %7s %7s %7s %9s %10s %10s %9s %11s %5s %5s %5s %9s %9s\n",
                 "case", "variant", "N", "tasks", "ops", "particip", "time(ms)", "cpu(ms)", "us/op",
                 "ns/particip", "trunc", "same", "load", "rank(ms)", "vs search");
    for (const Row& row : rows) {
      // planner/<case>/<variant>/<N>
      std::vector<std::string> part;
      std::size_t at = 0;
      while (at <= row.name.size()) {
        const auto next = std::min(row.name.find('/', at), row.name.size());
        part.push_back(row.name.substr(at, next - at));
        at = next + 1;
      }
      if (part.size() < 4) continue;
      if (!row.error.empty() || row.runs.empty()) {
        std::fprintf(f, "  %-10s %-19s %7s  ERROR %s\n", part[1].c_str(), part[2].c_str(),
                     part[3].c_str(), row.error.c_str());
        continue;
      }
      std::vector<double> real, cpu;
      double same = 1;
      for (const Run& r : row.runs) {
        real.push_back(r.GetAdjustedRealTime());
        cpu.push_back(r.GetAdjustedCPUTime());
        same = std::min(same, r.counters.at("same").value);
      }
      const double t = median(real), c = median(cpu), ops = row.median("ops"),
                   parts = row.median("participants");
      auto optional = [&](const char* name, const char* format) {
        char cell[32] = "-";
        if (row.runs.front().counters.count(name))
          std::snprintf(cell, sizeof cell, format, row.median(name));
        return std::string(cell);
      };
      std::fprintf(
          f,
          "  %-10s %-19s %7s %7.0f %7.0f %9.0f %10.3f %10.3f %9.3f %11.1f %5.0f %5.0f %5.1f %9s "
          "%9s\n",
          part[1].c_str(), part[2].c_str(), part[3].c_str(), row.median("tasks"), ops, parts, t, c,
          c * 1e3 / ops, c * 1e6 / parts, row.max("truncated"), same, row.median("load1"),
          optional("rank_ms", "%.3f").c_str(), optional("vs_search", "%.3f").c_str());
      if (same < 1) fail();
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  const auto options = meshcast::bench::console_options(argc, argv);
  const bool smoke = smoke_mode();
  std::vector<Case> cases;
  try {
    cases = make_cases(smoke);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bad case: %s\n", e.what());
    return 1;
  }
  for (const Case& c : cases) {
    auto* b =
        benchmark::RegisterBenchmark(c.name.c_str(), [&c](benchmark::State& s) { bm_plan(s, c); });
    b->Unit(benchmark::kMillisecond);
    if (smoke) b->MinTime(0.001)->Repetitions(1);
  }
  Table table(options);
  return meshcast::bench::run("planner", argc, argv, table);
}
