// meshcast's collectives (meshcast/collectives.h) against Open MPI's own, in the same run, under
// mpirun: one row per (collective, size, method) like nccl-tests: time, algbw = bytes / time,
// busbw = algbw x the collective's factor (all-reduce 2(n-1)/n, all-gather and reduce-scatter
// (n-1)/n), #wrong from a verification run on exact integer-valued inputs, and the ratio to
// MPI's busbw. Then the overlap of an all-reduce with a concurrent GEMM: the fraction of the
// all-reduce's time hidden when the GEMM runs in slices with test() between them. And sparse
// gradient synchronisation (meshcast/sparse.h): dense all-reduce vs all-gather of rows vs the
// balanced (Zen) scheme at densities 0.1%, 1%, 10%, uniform and Zipf-skewed indices.
//
//   mpirun -np N mpi_collectives [--min-bytes B] [--max-bytes B] [--iters N] [--json FILE]
//                                [--topology FILE] [--ops
//                                all_reduce,all_gather,reduce_scatter,sparse,overlap]
//                                [--slices N] [--where TEXT] [--node-kib K] [--sparse-rows R]
//                                [--sparse-densities D,D,...]
//
// --sparse-rows: rows of the sparse test's table (262144: 16 MiB of f32 rows of 16);
// --sparse-densities: its densities (0.001,0.01,0.1);
// --slices: the GEMM slices of the overlap test (64), test() after each; --where: where the
// ranks run, for the report (JSON "where"); --node-kib: node memory per rank (MpiOptions::
// node_segment_bytes, default 4096; 0: none, so that no collective takes the shared-memory
// algorithm).
//
// time: median over iterations of the slowest rank. MESHCAST_BENCH_SMOKE=1: tiny sizes, 2
// iterations. Exit status 1 if any element was wrong, 2 on bad arguments.
#include <meshcast/meshcast.h>
#include <meshcast/mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "args.h"
#include "mpi_harness.h"
#include "smoke.h"

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

using namespace meshcast;

namespace {

struct Row {
  std::string op, method;
  std::int64_t bytes = 0;
  double time = 0, algbw = 0, busbw = 0, vs_mpi = 0;
  long long wrong = 0;
};

// Rank r's element i: a small integer, so every method's sum is exact.
float value(int r, std::int64_t i) { return static_cast<float>((r * 7 + i * 3) % 30); }

// The buffers of one dense case on this rank: `count` f32 elements in and out, this rank's piece
// [mine.lo, mine.hi) of them, and every rank's piece as MPI's v-collectives take them.
struct Dense {
  int me, n;
  std::int64_t count;
  Range mine;
  std::vector<float> in, out;
  std::vector<int> counts, displs;
  Dense(int me_, int n_, std::int64_t count_)
      : me(me_),
        n(n_),
        count(count_),
        mine(shard_range(count, n, me)),
        in(static_cast<std::size_t>(count)),
        out(static_cast<std::size_t>(count)) {
    for (int r = 0; r < n; ++r) {
      const Range s = shard_range(count, n, r);
      counts.push_back(static_cast<int>(s.size()));
      displs.push_back(static_cast<int>(s.lo));
    }
  }
  // Inputs set, the output poisoned: before a verification run.
  void reset() {
    for (std::int64_t i = 0; i < count; ++i) in[static_cast<std::size_t>(i)] = value(me, i);
    std::fill(out.begin(), out.end(), -1.0f);
  }
  float sum(std::int64_t g) const {
    float s = 0;
    for (int r = 0; r < n; ++r) s += value(r, g);
    return s;
  }
};

// One collective as the suite measures it (nccl-tests' table of tests): its busbw factor (busbw =
// algbw x factor), how many elements of `out` a rank checks and what each must be, Open MPI's
// call and meshcast's, and the algorithms meshcast is timed with besides auto (and hierarchical,
// given a topology).
struct Coll {
  const char* name;
  double (*factor)(int n);
  std::int64_t (*outputs)(const Dense&);
  float (*want)(const Dense&, std::int64_t i);
  void (*mpi)(Dense&);
  void (*ours)(const Group&, Dense&, const CollectiveOptions&);
  std::vector<std::pair<const char*, Algorithm>> algorithms;
};

const Coll kColls[] = {
    {"all_reduce",
     [](int n) { return 2.0 * (n - 1) / n; },
     [](const Dense& d) { return d.count; },
     [](const Dense& d, std::int64_t i) { return d.sum(i); },
     [](Dense& d) {
       MPI_Allreduce(d.in.data(), d.out.data(), static_cast<int>(d.count), MPI_FLOAT, MPI_SUM,
                     MPI_COMM_WORLD);
     },
     [](const Group& g, Dense& d, const CollectiveOptions& o) {
       all_reduce(g, d.in.data(), d.out.data(), d.count, DType::f32, ReduceOp::Sum, o);
     },
     {{"ring", Algorithm::Ring},
      {"recursive-doubling", Algorithm::RecursiveDoubling},
      {"halving-doubling", Algorithm::HalvingDoubling}}},
    {"all_gather",
     [](int n) { return static_cast<double>(n - 1) / n; },
     [](const Dense& d) { return d.count; },
     [](const Dense& d, std::int64_t i) {  // the value of the piece's owner
       int owner = 0;
       while (d.displs[static_cast<std::size_t>(owner)] +
                  d.counts[static_cast<std::size_t>(owner)] <=
              i)
         ++owner;
       return value(owner, i);
     },
     [](Dense& d) {
       MPI_Allgatherv(d.in.data() + d.mine.lo, static_cast<int>(d.mine.size()), MPI_FLOAT,
                      d.out.data(), d.counts.data(), d.displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
     },
     [](const Group& g, Dense& d, const CollectiveOptions& o) {
       all_gather(g, d.in.data() + d.mine.lo, d.out.data(), d.count, DType::f32, o);
     },
     {{"ring", Algorithm::Ring}}},
    {"reduce_scatter",
     [](int n) { return static_cast<double>(n - 1) / n; },
     [](const Dense& d) { return d.mine.size(); },
     [](const Dense& d, std::int64_t i) { return d.sum(d.mine.lo + i); },
     [](Dense& d) {
       MPI_Reduce_scatter(d.in.data(), d.out.data(), d.counts.data(), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
     },
     [](const Group& g, Dense& d, const CollectiveOptions& o) {
       reduce_scatter(g, d.in.data(), d.out.data(), d.count, DType::f32, ReduceOp::Sum, o);
     },
     {{"ring", Algorithm::Ring}}},
};

// C += A B for n x n matrices, row-major, rows [r0, r1) of C.
void gemm_rows(const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& c,
               int n, int r0, int r1) {
  for (int i = r0; i < r1; ++i)
    for (int k = 0; k < n; ++k) {
      const float x = a[static_cast<std::size_t>(i) * n + k];
      const float* brow = &b[static_cast<std::size_t>(k) * n];
      float* crow = &c[static_cast<std::size_t>(i) * n];
      for (int j = 0; j < n; ++j) crow[j] += x * brow[j];
    }
}

}  // namespace

int main(int argc, char** argv) {
  MpiOptions mo;
  mo.timeout_seconds = 120;
  const bool smoke = meshcast::bench::smoke_mode();
  std::int64_t min_bytes = 4, max_bytes = smoke ? 4096 : std::int64_t{64} << 20;
  int iters = smoke ? 2 : 9;
  int slices = 64;  // GEMM slices of the overlap test, test() after each
  std::int64_t sparse_rows_arg = smoke ? 4096 : 262144;
  std::string json, ops = "all_reduce,all_gather,reduce_scatter,sparse,overlap", topo_path, where;
  std::vector<double> densities{0.001, 0.01, 0.1};
  auto density = [](const std::string& v) {
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !(d > 0 && d <= 1))
      throw std::invalid_argument("want numbers in (0, 1], got '" + v + "'");
    return d;
  };
  // Read before MPI starts: --node-kib sizes the session's node memory.
  meshcast::bench::Args("mpi_collectives", "mpirun -np N mpi_collectives")
      .number("--min-bytes", min_bytes, 1, "smallest size")
      .number("--max-bytes", max_bytes, 1, "largest size")
      .number("--iters", iters, 1, "timed iterations per size")
      .text("--json", json, "write the rows to FILE", "FILE")
      .text("--topology", topo_path, "where the ranks run", "FILE")
      .text("--ops", ops, "of all_reduce,all_gather,reduce_scatter,sparse,overlap", "LIST")
      .number("--slices", slices, 1, "GEMM slices of the overlap test")
      .text("--where", where, "where the ranks run, for the report")
      .number("--node-kib", mo.node_segment_bytes, 0,
              "node memory per rank in KiB (0: none, so that Auto sends in shared memory too)",
              1024)
      .number("--sparse-rows", sparse_rows_arg, 1, "rows of the sparse test's table")
      .list<double>("--sparse-densities", densities, "D,D", density, "the sparse test's densities")
      .parse(argc, argv);
  MpiSession mpi(&argc, &argv, mo);
  Communicator& comm = mpi.world();
  const int me = comm.rank(), n = comm.size();
  std::unique_ptr<Topology> topo;
  try {  // every rank reads the same file: each refuses it alike
    if (!topo_path.empty()) topo = std::make_unique<Topology>(Topology::load(topo_path));
  } catch (const Error& e) {
    if (me == 0) std::fprintf(stderr, "mpi_collectives: %s\n", e.what());
    return 2;
  }
  const Group& group = comm.world();
  std::vector<Row> rows;
  if (me == 0)
    std::printf(
        "# mpi_collectives: %d ranks, f32, %d iterations (median of the slowest rank)\n"
        "%-15s %12s %-27s %10s %9s %9s %7s %8s\n",
        n, iters, "# op", "bytes", "method", "time(us)", "algbw", "busbw", "#wrong", "vs MPI");
  long long total_wrong = 0;
  for (const Coll& coll : kColls) {
    if (ops.find(coll.name) == std::string::npos) continue;
    for (std::int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      Dense d(me, n, std::max<std::int64_t>(1, bytes / 4));
      std::vector<mcbench::Method> methods;
      auto add = [&](std::string name, std::function<void()> run) {
        methods.push_back({.name = std::move(name),
                           .run = std::move(run),
                           .reset = [&d] { d.reset(); },
                           .wrong =
                               [&d, &coll] {
                                 long long bad = 0;
                                 for (std::int64_t i = 0; i < coll.outputs(d); ++i)
                                   bad += d.out[static_cast<std::size_t>(i)] != coll.want(d, i);
                                 return bad;
                               }});
      };
      auto ours = [&](const std::string& label, Algorithm a) {
        CollectiveOptions o;
        o.algorithm = a;
        o.topology = topo.get();
        add("meshcast " + label, [&group, &d, &coll, o] { coll.ours(group, d, o); });
      };
      add("MPI", [&d, &coll] { coll.mpi(d); });
      ours("auto", Algorithm::Auto);
      for (const auto& [label, a] : coll.algorithms) ours(label, a);
      if (topo) ours("hierarchical", Algorithm::Hierarchical);
      const auto [times, wrongs] = mcbench::measure(MPI_COMM_WORLD, 0, iters, methods);
      double mpi_busbw = 0;
      for (std::size_t k = 0; k < methods.size(); ++k) {
        const mcbench::Method& m = methods[k];
        const double t = times[k];
        const long long w = wrongs[k];
        total_wrong += w;
        Row r{coll.name, m.name, d.count * 4, t, 0, 0, 0, w};
        r.algbw = static_cast<double>(r.bytes) / t / 1e9;
        r.busbw = r.algbw * (n < 2 ? 1 : coll.factor(n));
        if (m.name == "MPI") mpi_busbw = r.busbw;
        r.vs_mpi = mpi_busbw > 0 ? r.busbw / mpi_busbw : 0;
        rows.push_back(r);
        if (me == 0)
          std::printf("%-15s %12lld %-27s %10.1f %9.3f %9.3f %7lld %8.2f\n", coll.name,
                      static_cast<long long>(r.bytes), r.method.c_str(), t * 1e6, r.algbw, r.busbw,
                      w, r.vs_mpi);
        std::fflush(stdout);
      }
    }
  }
  // Sparse: a (rows x 16) f32 table, each rank's non-zero rows drawn uniformly or Zipf-skewed.
  std::vector<nlohmann::json> sparse_rows;
  if (ops.find("sparse") != std::string::npos) {
    CollectiveOptions so;  // every method sees the hosts, as the dense rows' "meshcast auto"
    so.topology = topo.get();
    const std::int64_t rows = sparse_rows_arg, width = 16;
    if (me == 0)
      std::printf(
          "# sparse: %lld x %lld f32 table (%lld bytes dense)\n%-9s %-8s %-10s %10s %9s %7s %8s\n",
          static_cast<long long>(rows), static_cast<long long>(width),
          static_cast<long long>(rows * width * 4), "# density", "indices", "method", "time(us)",
          "vs dense", "#wrong", "picked");
    std::vector<double> cdf(static_cast<std::size_t>(rows));
    double acc = 0;
    for (std::int64_t i = 0; i < rows; ++i)
      cdf[static_cast<std::size_t>(i)] = acc += 1 / std::pow(i + 1.0, 1.1);
    for (double& c : cdf) c /= acc;
    for (double density : densities)
      for (bool zipf : {false, true}) {
        std::mt19937_64 g(static_cast<std::uint64_t>(me) * 104729 + (zipf ? 1 : 0));
        std::vector<char> on(static_cast<std::size_t>(rows), 0);
        const auto want = static_cast<std::int64_t>(density * static_cast<double>(rows));
        // Zipf(1.1) over the rows by inversion of its CDF; uniform otherwise.
        std::uniform_real_distribution<double> u(0, 1);
        // (Capped: Zipf's tail is reached slowly; the rows table reports what was drawn.)
        for (std::int64_t k = 0, draws = 0; k < want && draws < 200 * want; ++draws) {
          const double x = u(g);
          auto i = zipf ? static_cast<std::int64_t>(std::lower_bound(cdf.begin(), cdf.end(), x) -
                                                    cdf.begin())
                        : static_cast<std::int64_t>(x * static_cast<double>(rows));
          i = std::min(i, rows - 1);
          if (!on[static_cast<std::size_t>(i)]) on[static_cast<std::size_t>(i)] = 1, ++k;
        }
        SparseRows mine{rows, width, {}, {}};
        for (std::int64_t i = 0; i < rows; ++i)
          if (on[static_cast<std::size_t>(i)]) {
            mine.indices.push_back(i);
            for (std::int64_t c = 0; c < width; ++c)
              mine.values.push_back(static_cast<float>((me * 5 + i + c) % 9));
          }
        std::vector<float> out(static_cast<std::size_t>(rows * width)), ref(out.size());
        sparse_all_reduce(group, mine, ref, SparseMethod::Dense, so);
        const SparseMethod methods[] = {SparseMethod::Dense, SparseMethod::AllGather,
                                        SparseMethod::Balanced, SparseMethod::Auto};
        // The dense method first: the others' times are compared with its.
        std::vector<SparseMethod> picks(std::size(methods));
        std::vector<mcbench::Method> runs;
        for (std::size_t k = 0; k < std::size(methods); ++k)
          runs.push_back(
              {.name = to_string(methods[k]),
               .run = [&, k] { picks[k] = sparse_all_reduce(group, mine, out, methods[k], so); },
               .reset = [&] { std::fill(out.begin(), out.end(), -1.0f); },
               .wrong =
                   [&] {
                     long long bad = 0;
                     for (std::size_t i = 0; i < out.size(); ++i) bad += out[i] != ref[i];
                     return bad;
                   }});
        const auto [times, wrongs] = mcbench::measure(MPI_COMM_WORLD, 0, iters, runs);
        const double dense_t = times[0];
        for (std::size_t k = 0; k < std::size(methods); ++k) {
          const SparseMethod m = methods[k], picked = picks[k];
          const double t = times[k];
          const long long bad = wrongs[k];
          total_wrong += bad;
          if (me == 0)
            std::printf("%-9g %-8s %-10s %10.1f %9.2f %7lld %8s  (rank 0: %zu rows)\n", density,
                        zipf ? "zipf" : "uniform", to_string(m).c_str(), t * 1e6, dense_t / t, bad,
                        to_string(picked).c_str(), mine.indices.size());
          std::fflush(stdout);
          sparse_rows.push_back({{"density", density},
                                 {"indices", zipf ? "zipf" : "uniform"},
                                 {"method", to_string(m)},
                                 {"picked", to_string(picked)},
                                 {"seconds", t},
                                 {"vs_dense", dense_t / t},
                                 {"wrong", bad},
                                 {"dense_bytes", rows * width * 4},
                                 {"nonzero_rows", mine.indices.size()}});
        }
      }
  }

  // Overlap: an all-reduce of 16 MiB (smoke: 64 KiB) against a GEMM sized to take about as long.
  nlohmann::json overlap;
  if (ops.find("overlap") != std::string::npos) {
    const std::int64_t count = smoke ? 16384 : std::int64_t{4} << 20;
    std::vector<float> buf(static_cast<std::size_t>(count), 1.0f);
    CollectiveOptions auto_options;  // auto, as the rows' "meshcast auto"
    auto_options.topology = topo.get();
    // Alone through the same handle as below (the blocking form may take node memory instead).
    const double t_comm = mcbench::timed(MPI_COMM_WORLD, 0, iters, [&] {
      iall_reduce(group, buf.data(), buf.data(), count, DType::f32, ReduceOp::Sum, auto_options)
          .wait();
    });
    int dim = 64;
    std::vector<float> a, b, c;
    auto size_gemm = [&](int d) {
      a.assign(static_cast<std::size_t>(d) * d, 0.5f);
      b = a;
      c.assign(a.size(), 0.0f);
    };
    size_gemm(dim);
    double t_comp = mcbench::timed(MPI_COMM_WORLD, 0, 1, [&] { gemm_rows(a, b, c, dim, 0, dim); });
    // Steps of at most 2x in size (8x in time), each timed as a median of 3, until the GEMM takes
    // 0.8-1.25x the all-reduce's time: one noisy timing of many ranks on 2 cores could otherwise
    // size it 10x too long, and a GEMM that long hides any all-reduce. The same on every rank:
    // timed() reports the slowest rank's time.
    for (int step = 0; step < 12 && (t_comp < 0.8 * t_comm || t_comp > 1.25 * t_comm); ++step) {
      const double grow = std::cbrt(t_comm / std::max(t_comp, 1e-6));
      dim = std::clamp(static_cast<int>(dim * std::clamp(grow, 0.5, 2.0)), 16, 4096);
      size_gemm(dim);
      t_comp = mcbench::timed(MPI_COMM_WORLD, 0, 3, [&] { gemm_rows(a, b, c, dim, 0, dim); });
    }
    t_comp = mcbench::timed(MPI_COMM_WORLD, 0, iters, [&] { gemm_rows(a, b, c, dim, 0, dim); });
    const double t_both = mcbench::timed(MPI_COMM_WORLD, 0, iters, [&] {
      Collective h = iall_reduce(group, buf.data(), buf.data(), count, DType::f32, ReduceOp::Sum,
                                 auto_options);
      for (int s = 0; s < slices; ++s) {
        gemm_rows(a, b, c, dim, dim * s / slices, dim * (s + 1) / slices);
        h.test();
      }
      h.wait();
    });
    const double hidden = std::clamp((t_comm + t_comp - t_both) / t_comm, 0.0, 1.0);
    if (me == 0)
      std::printf(
          "# overlap: all_reduce %lld bytes %.1f ms alone, GEMM %dx%d %.1f ms alone, both %.1f ms: "
          "%.0f%% of the all-reduce hidden\n",
          static_cast<long long>(count * 4), t_comm * 1e3, dim, dim, t_comp * 1e3, t_both * 1e3,
          hidden * 100);
    overlap = {{"bytes", count * 4}, {"comm_seconds", t_comm}, {"gemm_seconds", t_comp},
               {"gemm_dim", dim},    {"both_seconds", t_both}, {"hidden_fraction", hidden},
               {"slices", slices}};
  }
  if (me == 0 && !json.empty()) {
    nlohmann::json j;
    j["ranks"] = n;
    j["iters"] = iters;
    j["topology"] = topo ? topo->name() : "";
    j["where"] = where;
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows)
      j["rows"].push_back({{"op", r.op},
                           {"method", r.method},
                           {"bytes", r.bytes},
                           {"seconds", r.time},
                           {"algbw", r.algbw},
                           {"busbw", r.busbw},
                           {"vs_mpi", r.vs_mpi},
                           {"wrong", r.wrong}});
    j["sparse"] = sparse_rows;
    if (!overlap.is_null()) j["overlap"] = overlap;
    std::ofstream(json) << j.dump(1) << "\n";
  }
  return total_wrong ? 1 : 0;
}
