// The cost model and the simulator at scales this machine cannot run: predicted effective
// bandwidth of every method on the paper's cases over its cluster (meshes/aws-p3.8xlarge.json:
// 8 hosts x 4 V100, 10 Gbit/s per host) and on a 1,024-host x 8-GPU cluster
// (meshes/cluster-1024x8.json), then Google Benchmark timings of planning + simulating
// 8,192-device reshards on one core.
//
//   model [--json FILE] [Google Benchmark flags]      (run from the repository root)
//
// Study rows: case, size, method, model time, simulated time, link bound, effective GB/s by
// the simulation (tensor bytes / simulated time). Methods as in bench/cluster_suite.cc:
// sendrecv, allgather, broadcast (no balancing), broadcast+greedy, broadcast+search, and auto
// (the strategy the planner picks). Benchmarks `scale/<case>`: one iteration plans from
// scratch (strategy broadcast, balance search) and simulates; counters devices, ops, simulated (s),
// events. MESHCAST_BENCH_SMOKE=1: the study on small sizes only and a 64-host cluster for the
// benchmarks (CI).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "args.h"
#include "harness.h"
#include "meshcast/meshcast.h"
#include "methods.h"

namespace {

using namespace meshcast;

constexpr std::size_t kMaxAllGatherReceivers = 512;

// "h x k @ [ids]": k devices on each of hosts first .. first+h-1, K devices per host.
std::string mesh_on(int first, int h, int k, int per_host) {
  std::string s = std::to_string(h) + "x" + std::to_string(k) + "@[";
  for (int j = 0; j < h; ++j)
    for (int i = 0; i < k; ++i) {
      if (j || i) s += ',';
      s += std::to_string((first + j) * per_host + i);
    }
  return s + "]";
}

class Study {
 public:
  explicit Study(nlohmann::json& rows) : rows_(rows) {
    std::printf("%-12s %-5s %-36s %9s %-17s %11s %11s %11s %9s\n", "# topology", "group", "case",
                "size", "method", "model(ms)", "sim(ms)", "bound(ms)", "GB/s");
  }

  void run(const Topology& topo, const std::string& group, const std::string& name,
           const Layout& src, const Layout& dst, int receiver_hosts = 0) {
    // allgather (and auto, which plans it too) turns a box for r receivers into r slices
    // multicast to r - 1 each: r^2 participants, beyond reach for thousands of receivers.
    std::size_t most = 0;
    for (const Task& t : tasks(src, dst)) most = std::max(most, t.destinations.size());
    // meshcast's variants, then strategy auto (the planner's default options).
    std::vector<mcbench::PlanMethod> methods(std::begin(mcbench::kPlanMethods),
                                             std::end(mcbench::kPlanMethods));
    methods.push_back({"auto", Strategy::Auto, Balance::Search});
    // The rule each device applies alone (plan_rank), against search's whole-plan balance.
    methods.push_back({"broadcast+local", Strategy::Broadcast, Balance::Local});
    for (const mcbench::PlanMethod& m : methods) {
      if (most > kMaxAllGatherReceivers && m.strategy != Strategy::Broadcast &&
          m.strategy != Strategy::SendRecv)
        continue;
      PlanOptions o;
      o.strategy = m.strategy;
      o.balance = m.balance;
      const Plan p = plan(src, dst, topo, o);
      const Prediction pr = predict(p, topo);
      const Simulation s = simulate(p, topo);
      const double gbs = static_cast<double>(src.bytes()) / s.seconds / 1e9;
      std::printf("%-12s %-5s %-36s %9s %-17s %11.3f %11.3f %11.3f %9.3f\n", topo.name().c_str(),
                  group.c_str(), name.c_str(), human_bytes(src.bytes()).c_str(), m.label,
                  pr.seconds * 1e3, s.seconds * 1e3, pr.bound_seconds * 1e3, gbs);
      std::fflush(stdout);
      rows_.push_back({{"topology", topo.name()},
                       {"group", group},
                       {"case", name},
                       {"bytes", src.bytes()},
                       {"method", m.label},
                       {"strategy", to_string(p.strategy())},
                       {"receiver_hosts", receiver_hosts},
                       {"devices", p.devices().size()},
                       {"ops", p.ops().size()},
                       {"predicted_seconds", pr.seconds},
                       {"simulated_seconds", s.seconds},
                       {"bound_seconds", pr.bound_seconds}});
    }
  }

 private:
  nlohmann::json& rows_;
};

// 1-to-m: device 0 (host 0) to h x k devices on hosts 1..h; n-to-m: the paper's specs between
// two hs x K meshes on disjoint hosts.
void paper_cases(Study& st, const Topology& topo, const std::vector<std::pair<int, int>>& hk,
                 const Shape& nm_shape, std::int64_t one_to_m_elems, int hs) {
  const int k_per = static_cast<int>(topo.device_count()) / topo.hosts();
  for (const auto& [h, k] : hk) {
    const Layout src = Layout::parse({one_to_m_elems}, DType::f32, "1@0:R");
    const Layout dst = Layout::parse({one_to_m_elems}, DType::f32, mesh_on(1, h, k, k_per) + ":R");
    st.run(topo, "1m", "1x1>" + std::to_string(h) + "x" + std::to_string(k), src, dst, h);
  }
  const std::pair<const char*, const char*> specs[] = {{"S0RR", "S0RR"}, {"RRR", "RRR"},
                                                       {"RS0R", "S0RR"}, {"RS01R", "S01RR"},
                                                       {"S1RR", "S0RR"}, {"RS0R", "RRS0"}};
  const std::string a = mesh_on(0, hs, k_per, k_per), b = mesh_on(hs, hs, k_per, k_per);
  for (const auto& [s, d] : specs) {
    // At thousands of devices, only S0RR and S1RR -> S0RR, whose tasks stay few (one per row
    // block); the others cross two splits of 512 (262,144 tasks) or replicate everywhere.
    const std::string from = s;
    if (hs * k_per > 64 && from != "S0RR" && from != "S1RR") continue;
    const std::string mesh = std::to_string(hs) + "x" + std::to_string(k_per);
    st.run(topo, "nm", mesh + ">" + mesh + " " + s + ">" + d,
           Layout::parse(nm_shape, DType::f32, a + ":" + s),
           Layout::parse(nm_shape, DType::f32, b + ":" + d));
  }
}

// 8,192 devices: 1,024 hosts x 8 (or 64 x 8 in smoke mode).
struct ScaleCase {
  std::string name;
  std::string src, dst;
  Shape shape;
};

std::vector<ScaleCase> scale_cases(int hosts) {
  const int n = hosts * 8, half = hosts / 2;
  const std::string all = std::to_string(hosts) + "x8@0-" + std::to_string(n - 1);
  const std::string first = std::to_string(half) + "x8@0-" + std::to_string(n / 2 - 1);
  const std::string second =
      std::to_string(half) + "x8@" + std::to_string(n / 2) + "-" + std::to_string(n - 1);
  return {
      // A pipeline stage boundary: half the cluster hands its activations to the other half.
      {"stage-boundary S0R>S0R", first + ":S0R", second + ":S0R", {65536, 8192}},
      // Tensor-parallel resharding inside the whole cluster: rows split by host, then by GPU.
      {"S01R>S10R", all + ":S01R", all + ":S10R", {65536, 8192}},
      // One device's weights to every device (trainer -> inference fleet).
      {"1x1>all R", "1@0:R", all + ":R", {1 << 28}},
      // A transpose of the tile grid between the two halves.
      {"S0S1>S1S0", first + ":S0S1", second + ":S1S0", {65536, 65536}},
      // Dense: rows by host, columns by 4 GPUs, to columns by device - every source tile meets
      // every target tile of its columns, n^2 / 4 boxes (4 M at 8,192 devices).
      {"dense S0S1R>RS0R",
       std::to_string(hosts) + "x4@0-" + std::to_string(n / 2 - 1) + ":S0S1R",
       std::to_string(n / 2) + "@" + std::to_string(n / 2) + "-" + std::to_string(n - 1) + ":RS0R",
       {n, 8192, 16}},
  };
}

// The process's peak resident memory (VmHWM), MiB; 0 where /proc does not say.
double peak_rss_mb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  return 0;
}

void bm_scale(benchmark::State& state, const Topology& topo, const ScaleCase& c) {
  try {
    const Layout src = Layout::parse(c.shape, DType::f32, c.src);
    const Layout dst = Layout::parse(c.shape, DType::f32, c.dst);
    Simulation s;
    std::size_t ops = 0, devices = 0;
    PlanOptions o;
    o.strategy = Strategy::Broadcast;  // auto would also plan allgather: see Study::run
    // The case's own peak memory: Linux resets the process's peak (VmHWM) on this write.
    std::ofstream("/proc/self/clear_refs") << "5";
    for (auto _ : state) {
      const Plan p = plan(src, dst, topo, o);
      s = simulate(p, topo);
      ops = p.ops().size();
      devices = p.devices().size();
    }
    state.counters["devices"] = static_cast<double>(devices);
    state.counters["ops"] = static_cast<double>(ops);
    state.counters["simulated_s"] = s.seconds;
    state.counters["events"] = static_cast<double>(s.events);
    state.counters["peak_mb"] = peak_rss_mb();
    state.SetLabel(c.src + " -> " + c.dst);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  meshcast::bench::Args("model", "model")
      .text("--json", json_path, "write the paper cases' rows to FILE", "FILE")
      .parse(argc, argv, true);
  const bool smoke = meshcast::bench::smoke_mode();
  try {
    const Topology p3 = Topology::load("meshes/aws-p3.8xlarge.json");
    const Topology big = Topology::load("meshes/cluster-1024x8.json");
    nlohmann::json rows = nlohmann::json::array();
    Study st(rows);
    const std::int64_t gib = std::int64_t{1} << 28;  // f32 elements in 1 GiB
    paper_cases(st, p3,
                {{1, 1}, {1, 2}, {1, 3}, {1, 4}, {2, 2}, {3, 2}, {4, 2}, {2, 4}, {4, 4}, {7, 4}},
                smoke ? Shape{64, 32, 32} : Shape{1024, 512, 512}, smoke ? 4096 : gib, 2);
    if (!smoke)
      paper_cases(st, big, {{1, 8}, {4, 8}, {16, 8}, {64, 8}, {256, 8}, {1023, 8}},
                  Shape{4096, 512, 512}, gib, 512);
    if (!json_path.empty()) {
      nlohmann::json j;
      j["smoke"] = smoke;
      j["rows"] = rows;
      std::ofstream(json_path) << j.dump(1) << "\n";
    }
    static const Topology scale_topo =
        smoke ? Topology::uniform("cluster-64x8", 64, 8, big.intra(), big.network()) : big;
    static const std::vector<ScaleCase> cases = scale_cases(smoke ? 64 : 1024);
    for (const ScaleCase& c : cases)
      benchmark::RegisterBenchmark(("scale/" + c.name).c_str(), bm_scale, scale_topo, c)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(smoke ? 1 : 3)
          ->MeasureProcessCPUTime();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model: %s\n", e.what());
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
