// Local (in-process threads) reshard throughput beside a single-thread memcpy of the same bytes,
// both measured in the same iterations of the same run, on the paper's microbenchmark cases:
//   1-to-m  a replicated 1-D tensor (32 MiB) from mesh 1x1 to 1x1, 1x2, 1x3, 1x4, 2x2, 3x2, 4x2
//           on disjoint devices;
//   n-to-m  2x4 -> 2x4 (disjoint) on the (1024,1024,512) f32 tensor scaled by 1/4 per dimension
//           to (256,256,128), and 2x4 -> 3x4 S0RR -> S0RR on (3072,1024,170) scaled the same way
//           to (768,256,43);
// each for the strategies broadcast, sendrecv and allgather (single-host topology).
//
// Every case is planned once. Each repetition spawns the device threads once, fills the sources,
// warms up with one reshard, then per benchmark iteration: the leader thread alone memcpys the
// bytes the plan lands in destination buffers (bytes_moved + bytes_local) between two buffers of
// that size (the others wait in a barrier), then every device reshards, timed between barriers
// (manual time). A last reshard into poisoned targets is checked element by element (#wrong).
//
// Output: Google Benchmark's console/JSON and, at the end, one nccl-tests-like table of medians
// over repetitions. Exit status 1 if any element was wrong or a case failed.
// MESHCAST_BENCH_SMOKE=1 selects tiny tensors and one short repetition (CI; ratios meaningless).
//
// Counters per repetition: time_ms and memcpy_ms (median iterations), best_ms and memcpy_best_ms
// (fastest iterations), tensor_bytes, landed_bytes, eff_GBps (tensor bytes / time), land_GBps
// (landed bytes / time), memcpy_GBps (landed bytes / memcpy time), ratio (memcpy time / reshard
// time) and ratio_best (the same of the fastest iterations), target (0.8 when whole rows move,
// 0.5 when a layout splits the innermost dimension), load1 (load average), wrong, ops, devices.
// The closing table takes medians over repetitions of these and flags a row below target when
// either ratio is: on a busy machine the median ratio flatters the reshard (its many threads win
// a larger share of the CPU than the one memcpy thread) and the fastest-iteration ratio is the
// fairer one.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "meshcast/meshcast.h"
#include "meshcast/testing.h"

namespace {

using Clock = std::chrono::steady_clock;
using meshcast::Layout;
using meshcast::Plan;
using meshcast::Strategy;
using meshcast::bench::load_average;
using meshcast::bench::median;
using meshcast::bench::smoke_mode;

struct Case {
  std::string name;   // "1x1>2x2:R>R"
  std::string label;  // both layouts and the shape
  Plan plan;
  double target;  // the ratio aimed at: 0.8 with whole rows, 0.5 when the innermost dim is split
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- The memcpy baseline ------------------------------------------------------------------------

// Two buffers for a single-thread memcpy of `bytes`, kept across runs and touched once.
struct MemcpyBuffers {
  std::vector<std::byte> from, to;
  void reserve(std::int64_t bytes) {
    const auto n = static_cast<std::size_t>(bytes);
    if (from.size() >= n) return;
    from.assign(n, std::byte{1});
    to.assign(n, std::byte{0});
  }
  double copy(std::int64_t bytes) {
    const auto t0 = Clock::now();
    std::memcpy(to.data(), from.data(), static_cast<std::size_t>(bytes));
    benchmark::ClobberMemory();
    return seconds_since(t0);
  }
};

// ---- One benchmark run (one repetition) ---------------------------------------------------------

// Each iteration: barrier; the leader alone memcpys the landed bytes (the others wait in the
// barrier); barrier; every device reshards; barrier. The reshard's time runs from the first
// device leaving the barrier to the last one finishing (each thread stamps both): a single
// thread's clock would miss the work others did before it woke up, which on a busy machine
// can be most of it.
// Pairing the two measurements iteration by iteration exposes both to the same moments of a
// shared machine. Per repetition the counters use the median (and the fastest) iteration of each.
void bm_reshard(benchmark::State& state, const Case& c) {
  static MemcpyBuffers buffers;
  const Plan& plan = c.plan;
  const Layout& src = plan.src();
  const Layout& dst = plan.dst();
  const std::int64_t landed = plan.stats().bytes_moved + plan.stats().bytes_local;
  const std::size_t elem = meshcast::dtype_size(src.dtype());
  const auto devices = plan.devices();
  const int leader = devices.front();
  buffers.reserve(landed);

  meshcast::LocalWorld world(devices.back() + 1);
  std::atomic<bool> go{false};
  std::atomic<std::int64_t> wrong{0};
  std::vector<double> reshard_s, memcpy_s;
  std::vector<Clock::time_point> started(devices.size()), finished(devices.size());
  try {
    world.run(
        [&](meshcast::Communicator& comm) {
          const int me = comm.rank();
          const auto slot = static_cast<std::size_t>(
              std::lower_bound(devices.begin(), devices.end(), me) - devices.begin());
          std::vector<std::byte> s, d;  // first touched by the owning thread
          if (src.mesh().contains(me)) {
            s.resize(static_cast<std::size_t>(src.local_elements(me)) * elem);
            meshcast::fill_source(src, me, s.data());
          }
          if (dst.mesh().contains(me))
            d.resize(static_cast<std::size_t>(dst.local_elements(me)) * elem);
          void* sp = s.empty() ? nullptr : s.data();
          void* dp = d.empty() ? nullptr : d.data();
          if (me == leader) buffers.copy(landed);  // warm-up pass
          comm.barrier();
          meshcast::reshard(plan, comm, sp, dp);  // warm-up
          while (true) {
            if (me == leader) go = state.KeepRunning();
            comm.barrier();
            if (!go) break;
            if (me == leader) memcpy_s.push_back(buffers.copy(landed));
            comm.barrier();
            started[slot] = Clock::now();
            meshcast::reshard(plan, comm, sp, dp);
            finished[slot] = Clock::now();
            comm.barrier();
            if (me == leader) {
              const auto t0 = *std::min_element(started.begin(), started.end());
              const auto t1 = *std::max_element(finished.begin(), finished.end());
              reshard_s.push_back(std::chrono::duration<double>(t1 - t0).count());
              state.SetIterationTime(reshard_s.back());
            }
          }
          // Verification: poison the targets (0xff.. is a NaN in every float type), move once more.
          if (!d.empty()) std::memset(d.data(), 0xff, d.size());
          comm.barrier();
          meshcast::reshard(plan, comm, sp, dp);
          if (dp) wrong += meshcast::count_mismatches(dst, me, dp);
        },
        devices);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  if (reshard_s.empty() || memcpy_s.empty()) {
    state.SkipWithError("no iteration ran");
    return;
  }
  const double t = median(reshard_s), m = median(memcpy_s);
  const double tb = *std::min_element(reshard_s.begin(), reshard_s.end());
  const double mb = *std::min_element(memcpy_s.begin(), memcpy_s.end());
  const auto tensor = static_cast<double>(src.bytes());
  const auto bytes = static_cast<double>(landed);
  state.counters["time_ms"] = t * 1e3;
  state.counters["best_ms"] = tb * 1e3;
  state.counters["memcpy_ms"] = m * 1e3;
  state.counters["memcpy_best_ms"] = mb * 1e3;
  state.counters["tensor_bytes"] = tensor;
  state.counters["landed_bytes"] = bytes;
  state.counters["eff_GBps"] = t > 0 ? tensor / t / 1e9 : 0;
  state.counters["land_GBps"] = t > 0 ? bytes / t / 1e9 : 0;
  state.counters["memcpy_GBps"] = m > 0 ? bytes / m / 1e9 : 0;
  state.counters["ratio"] = t > 0 ? m / t : 0;
  state.counters["ratio_best"] = tb > 0 ? mb / tb : 0;
  state.counters["load1"] = load_average();
  state.counters["target"] = c.target;
  state.counters["wrong"] = static_cast<double>(wrong.load());
  state.counters["ops"] = static_cast<double>(plan.ops().size());
  state.counters["devices"] = static_cast<double>(devices.size());
  state.SetLabel(c.label);
}

// ---- The cases ----------------------------------------------------------------------------------

std::vector<Case> make_cases(bool smoke) {
  std::vector<Case> out;
  const auto add = [&](const meshcast::Shape& shape, const std::string& src, const std::string& dst,
                       Strategy st) {
    const Layout s = Layout::parse(shape, meshcast::DType::f32, src, "src");
    const Layout d = Layout::parse(shape, meshcast::DType::f32, dst, "dst");
    meshcast::PlanOptions opt;
    opt.strategy = st;
    Plan p = meshcast::plan(s, d, meshcast::Topology::single_host(), opt);
    const std::size_t last = shape.size() - 1;
    const double target = s.splits(last) > 1 || d.splits(last) > 1 ? 0.5 : 0.8;
    const std::string name = s.mesh().str().substr(0, s.mesh().str().find('@')) + ">" +
                             d.mesh().str().substr(0, d.mesh().str().find('@')) + ":" +
                             s.spec().str() + ">" + d.spec().str();
    out.push_back({"reshard/" + name + "/" + meshcast::to_string(st),
                   s.str() + " -> " + d.str() + " shape " + meshcast::shape_str(shape),
                   std::move(p), target});
  };
  const Strategy strategies[] = {Strategy::Broadcast, Strategy::SendRecv, Strategy::AllGather};

  // 1-to-m: a replicated 1-D tensor, 32 MiB (smoke: 16 KiB).
  const meshcast::Shape vec{smoke ? 4096 : std::int64_t{1} << 23};
  for (const char* m : {"1x1@1", "1x2@1-2", "1x3@1-3", "1x4@1-4", "2x2@1-4", "3x2@1-6", "4x2@1-8"})
    for (Strategy st : strategies) add(vec, "1x1@0:R", std::string(m) + ":R", st);

  // n-to-m on 2x4 -> 2x4: (1024,1024,512) f32 scaled to (256,256,128), 32 MiB (smoke: (16,16,8)).
  const meshcast::Shape cube = smoke ? meshcast::Shape{16, 16, 8} : meshcast::Shape{256, 256, 128};
  const std::pair<const char*, const char*> specs[] = {{"S0RR", "S0RR"}, {"RRR", "RRR"},
                                                       {"RS0R", "S0RR"}, {"RS01R", "S01RR"},
                                                       {"S1RR", "S0RR"}, {"RS0R", "RRS0"}};
  for (const auto& [a, b] : specs)
    for (Strategy st : strategies)
      add(cube, std::string("2x4@0-7:") + a, std::string("2x4@8-15:") + b, st);

  // 2x4 -> 3x4: (3072,1024,170) scaled by 1/4 per dim to (768,256,43), ~33 MiB (smoke: (24,16,5)).
  const meshcast::Shape slab = smoke ? meshcast::Shape{24, 16, 5} : meshcast::Shape{768, 256, 43};
  for (Strategy st : strategies) add(slab, "2x4@0-7:S0RR", "3x4@8-19:S0RR", st);
  return out;
}

// ---- The nccl-tests-like table ------------------------------------------------------------------

class Table : public meshcast::bench::TableReporter {
 public:
  using TableReporter::TableReporter;

 protected:
  void print_table(std::FILE* f, const std::vector<Row>& rows) override {
    std::fprintf(f,
                 "\n# meshcast local reshard vs single-thread memcpy of the landed bytes "
                 "(medians over repetitions)\n");
    std::fprintf(f, "# %-24s %-9s %10s %9s %8s %11s %8s %10s %6s %6s %6s %5s %6s\n", "case",
                 "strategy", "bytes", "time(ms)", "effGB/s", "landed(B)", "landGB/s", "memcpyGB/s",
                 "ratio", "best", "target", "load", "#wrong");
    std::int64_t total_wrong = 0;
    int below = 0;
    for (const Row& row : rows) {
      const auto slash = row.name.rfind('/');
      const std::string cs = row.name.substr(8, slash - 8), st = row.name.substr(slash + 1);
      if (!row.error.empty() || row.runs.empty()) {
        std::fprintf(f, "  %-24s %-9s  ERROR %s\n", cs.c_str(), st.c_str(), row.error.c_str());
        continue;
      }
      // ratio: median memcpy time / median reshard time; best: the same of the fastest iterations.
      const double t = row.median("time_ms"), m = row.median("memcpy_ms"),
                   landed = row.median("landed_bytes");
      const double tensor = row.median("tensor_bytes"), target = row.median("target");
      const double ratio = m / t, best = row.median("memcpy_best_ms") / row.median("best_ms");
      const double wrong = row.max("wrong");
      const bool miss = std::min(ratio, best) < target;
      total_wrong += static_cast<std::int64_t>(wrong);
      below += miss;
      std::fprintf(
          f,
          "  %-24s %-9s %10.0f %9.3f %8.2f %11.0f %8.2f %10.2f %6.2f %6.2f %6.2f %5.1f %6.0f%s\n",
          cs.c_str(), st.c_str(), tensor, t, tensor / t / 1e6, landed, landed / t / 1e6,
          landed / m / 1e6, ratio, best, target, row.median("load1"), wrong,
          miss ? "  (below target)" : "");
    }
    std::fprintf(f, "# rows: %zu, below target: %d, #wrong total: %lld%s\n", rows.size(), below,
                 static_cast<long long>(total_wrong),
                 smoke_mode() ? " (smoke mode: tiny tensors, ratios say nothing)" : "");
    if (total_wrong) fail();
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
    std::fprintf(stderr, "planning failed: %s\n", e.what());
    return 1;
  }
  for (const Case& c : cases) {
    auto* b = benchmark::RegisterBenchmark(c.name.c_str(),
                                           [&c](benchmark::State& s) { bm_reshard(s, c); });
    b->UseManualTime()->Unit(benchmark::kMillisecond);
    if (smoke) b->MinTime(0.001)->Repetitions(1);
  }
  Table table(options);
  return meshcast::bench::run("reshard_local", argc, argv, table);
}
