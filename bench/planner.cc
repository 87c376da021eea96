// Planner time against device count: meshes of N = 64 ... 65,536 devices moved to a disjoint
// mesh of N devices (N -> N), on a topology of 8 devices per host (NVLink-like intra-host links,
// one network link per host), f32 tensor of (65536, 65536).
//
//   S0S1>S1S0   square AxA mesh, a transpose of the tile grid: N tasks, one holder and one
//               receiver each (O(N) ops and participants);
//   S0R>S1R     (N/2)x2 -> 2x(N/2): N/2 tasks, two holders and two receivers each (O(N), every
//               task has a choice of sender, so the search has moves to try);
//   S0R>RS0     square AxA mesh: N tasks with sqrt(N) holders and sqrt(N) receivers each
//               (N^1.5 participants; up to 16,384 devices).
// Variants: broadcast with the default balance (search), broadcast with greedy, and the default
// options (strategy auto: each strategy planned with search and the cheapest kept; when no box
// has more than one receiver the strategies coincide and only one is planned).
//
// Every iteration plans from scratch (tasks, ops, sender choice, accounting). Counters: devices
// (per mesh), tasks, ops, participants (sum over ops of 1 + peers), truncated (the search hit its wall-clock cap: then the plan is not deterministic) and same
// (the plan equals the one planned before timing). A table of medians over repetitions closes
// the output, with the time per op and per participant (from the median real time). Exit status 1
// if a plan differed from its reference. MESHCAST_BENCH_SMOKE=1 keeps N <= 256 and one short repetition (CI).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "meshcast/meshcast.h"

namespace {

using meshcast::Balance;
using meshcast::Layout;
using meshcast::Plan;
using meshcast::Strategy;

bool smoke_mode() {
  const char* s = std::getenv("MESHCAST_BENCH_SMOKE");
  return s && *s && std::strcmp(s, "0") != 0;
}

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
    state.SetLabel(reference.src().str() + " -> " + reference.dst().str() + " " +
                   meshcast::to_string(reference.strategy()) + "/" + meshcast::to_string(c.options.balance));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

std::vector<Case> make_cases(bool smoke) {
  const meshcast::Shape shape{65536, 65536};
  std::vector<Case> out;
  auto topo = [](std::int64_t n) {
    return meshcast::Topology::uniform("8-per-host", static_cast<int>(std::max<std::int64_t>(1, 2 * n / 8)), 8,
                                       {"nvlink", 150e9, 2e-6}, {"network", 25e9, 5e-6});
  };
  auto add = [&](const std::string& kind, std::int64_t n, const std::string& src_mesh,
                 const std::string& src_spec, const std::string& dst_mesh, const std::string& dst_spec,
                 Strategy st, Balance b) {
    meshcast::PlanOptions opt;
    opt.strategy = st;
    opt.balance = b;
    Layout s = Layout::parse(shape, meshcast::DType::f32, src_mesh + "@" + range(0, n) + ":" + src_spec);
    Layout d = Layout::parse(shape, meshcast::DType::f32, dst_mesh + "@" + range(n, n) + ":" + dst_spec);
    out.push_back({"planner/" + kind + "/" + meshcast::to_string(st) + "-" + meshcast::to_string(b) + "/" +
                       std::to_string(n),
                   std::move(s), std::move(d), topo(n), opt, n});
  };
  const std::int64_t max_n = smoke ? 256 : 65536;
  const std::pair<Strategy, Balance> variants[] = {{Strategy::Broadcast, Balance::Search},
                                                   {Strategy::Broadcast, Balance::Greedy},
                                                   {Strategy::Auto, Balance::Search}};
  auto square = [](std::int64_t n) {
    const auto a = static_cast<std::int64_t>(std::lround(std::sqrt(static_cast<double>(n))));
    return std::to_string(a) + "x" + std::to_string(a);
  };
  for (const auto& [st, b] : variants)
    for (std::int64_t n = 64; n <= max_n; n *= 4)
      add("S0S1>S1S0", n, square(n), "S0S1", square(n), "S1S0", st, b);
  for (const auto& [st, b] : variants)
    for (std::int64_t n = 64; n <= max_n; n *= 4)
      add("S0R>S1R", n, std::to_string(n / 2) + "x2", "S0R", "2x" + std::to_string(n / 2), "S1R", st, b);
  for (const auto& [st, b] : variants)
    for (std::int64_t n = 64; n <= std::min<std::int64_t>(max_n, 16384); n *= 4)
      add("S0R>RS0", n, square(n), "S0R", square(n), "RS0", st, b);
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

class TableReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const std::string name = r.run_name.function_name;
      if (!seen_.count(name)) {
        seen_[name] = rows_.size();
        rows_.push_back({name, r.family_index, {}, {}});
      }
      Row& row = rows_[seen_[name]];
      if (r.error_occurred) {
        row.error = r.error_message;
        failed_ = true;
      } else if (r.run_type == Run::RT_Iteration) {
        row.runs.push_back(r);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::stable_sort(rows_.begin(), rows_.end(), [](const Row& a, const Row& b) { return a.family < b.family; });
    std::FILE* f = stdout;
    std::fflush(f);
    std::fprintf(f, "\n# meshcast planner time, N -> N devices, 8 devices per host (medians over repetitions)\n");
    std::fprintf(f, "# %-10s %-19s %7s %7s %7s %9s %10s %10s %9s %11s %5s %5s\n", "case", "variant", "N",
                 "tasks", "ops", "particip", "time(ms)", "cpu(ms)", "us/op", "ns/particip", "trunc", "same");
    for (const Row& row : rows_) {
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
        std::fprintf(f, "  %-10s %-19s %7s  ERROR %s\n", part[1].c_str(), part[2].c_str(), part[3].c_str(),
                     row.error.c_str());
        continue;
      }
      auto med = [&](const char* counter) {
        std::vector<double> v;
        for (const Run& r : row.runs) v.push_back(r.counters.at(counter).value);
        return median(v);
      };
      std::vector<double> real, cpu;
      double trunc = 0, same = 1;
      for (const Run& r : row.runs) {
        real.push_back(r.GetAdjustedRealTime());
        cpu.push_back(r.GetAdjustedCPUTime());
        trunc = std::max(trunc, r.counters.at("truncated").value);
        same = std::min(same, r.counters.at("same").value);
      }
      std::fprintf(f, "  %-10s %-19s %7s %7.0f %7.0f %9.0f %10.3f %10.3f %9.3f %11.1f %5.0f %5.0f\n",
                   part[1].c_str(), part[2].c_str(), part[3].c_str(), med("tasks"), med("ops"),
                   med("participants"), median(real), median(cpu), median(real) * 1e3 / med("ops"),
                   median(real) * 1e6 / med("participants"), trunc, same);
      if (same < 1) failed_ = true;
    }
    std::fflush(f);
  }

  bool failed() const { return failed_; }

 private:
  struct Row {
    std::string name;
    std::int64_t family;  // registration order (repetitions may come interleaved)
    std::vector<Run> runs;
    std::string error;
  };
  std::map<std::string, std::size_t> seen_;
  std::vector<Row> rows_;
  bool failed_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  const bool smoke = smoke_mode();
  std::vector<Case> cases;
  try {
    cases = make_cases(smoke);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bad case: %s\n", e.what());
    return 1;
  }
  for (const Case& c : cases) {
    auto* b = benchmark::RegisterBenchmark(c.name.c_str(), [&c](benchmark::State& s) { bm_plan(s, c); });
    b->Unit(benchmark::kMillisecond);
    if (smoke) b->MinTime(0.001)->Repetitions(1);
  }
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return reporter.failed() ? 1 : 0;
}
