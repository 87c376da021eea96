// meshcast's MPI backend against MPI baselines of the same moves, measured in the same run,
// under mpirun (a custom main, not Google Benchmark). Rank 0 prints one nccl-tests-like row
// per (case, subject, baseline):
//   time    median over iterations of the slowest rank's time (each iteration: barrier, then
//           every participant times its part; the iteration's time is the max over ranks)
//   GB/s    tensor bytes / time (effective bandwidth; a broadcast's busbw factor is 1)
//   ratio   baseline time / subject time (> 1: the subject is faster)
//   #wrong  wrong elements of a verification run of subject and baseline (poisoned buffers,
//           meshcast::fill_source / count_mismatches, summed over ranks); must be 0
// Subjects and baselines alternate within every iteration, so slow drifts of the shared
// machine hit both. Groups (each case runs on the first ranks of the world; ranks a case does
// not use sleep in a polling barrier so that they leave the cores to it):
//   a  2 ranks, one contiguous tensor from rank 0 to rank 1; baseline MPI_Send/MPI_Recv
//   b  1 -> r receivers (r = 1 .. world-1): meshcast's chain broadcast at several chunk sizes
//      and MPI_Ibcast (MpiOptions::Broadcast::Native); baseline one MPI_Send/MPI_Recv of the
//      same bytes, and MPI_Bcast measured the same way for reference
//   c  n-to-m moves of a 3-D f32 tensor at 4 and 8 ranks: meshcast's default plan (auto
//      strategy) and, where auto chose another, its broadcast plan; baselines a hand-written
//      MPI_Alltoallv and all-gather-then-slice (bench/mpi_baselines.h)
//   d  2-D block layouts at 4 ranks; baseline ScaLAPACK Cpdgemr2d / Cpsgemr2d
//
//   mpirun -np N mpi_reshard [--groups a,b,c,d] [--fit] [--iters N] [--warmup N] [--json FILE]
//                            [--max-mib N] [--backend mpi|ucx] [--native] [--chunk-kib N]
//                            [--filter TEXT]
// By default a case runs when the world has exactly the ranks it needs (so no rank idles);
// --fit runs every case that fits; --filter runs the cases whose name contains TEXT.
// MESHCAST_BENCH_SMOKE=1 picks tiny sizes (CI). --native and --chunk-kib set the broadcast of
// groups a, c, d (default: MpiOptions' defaults). Exit status 1 if any element was wrong or a
// case failed.
#include <meshcast/mpi.h>
#include <meshcast/testing.h>

#include "args.h"
#include "mpi_baselines.h"
#include "mpi_harness.h"
#ifdef MESHCAST_HAS_UCX
#include <meshcast/ucx.h>
#endif

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

using namespace meshcast;
using namespace mcbench;

namespace {

// Communicators for meshcast with a given broadcast mode: the MPI backend (a second
// MpiSession over the same MPI_COMM_WORLD) or UCX.
struct Backend {
  std::unique_ptr<MpiSession> mpi;
#ifdef MESHCAST_HAS_UCX
  std::unique_ptr<UcxSession> ucx;
#endif
  Communicator* comm = nullptr;
};
std::unique_ptr<Backend> make_backend(MpiSession& base, const std::string& kind, bool native,
                                      std::size_t chunk, int* argc, char*** argv) {
  auto b = std::make_unique<Backend>();
  if (kind == "ucx") {
#ifdef MESHCAST_HAS_UCX
    b->ucx = std::make_unique<UcxSession>(base, UcxOptions{60, chunk});
    b->comm = &b->ucx->world();
    return b;
#else
    (void)base;
    throw std::runtime_error("the UCX backend is not built here");
#endif
  }
  MpiOptions o;
  o.broadcast = native ? MpiOptions::Broadcast::Native : MpiOptions::Broadcast::Chain;
  o.chunk_bytes = chunk;
  b->mpi = std::make_unique<MpiSession>(argc, argv, o);  // MPI is up: only a new endpoint
  b->comm = &b->mpi->world();
  return b;
}

// Plain MPI_Send/MPI_Recv of `bytes` from rank 0 to rank 1 of `part`.
std::function<void()> p2p(MPI_Comm part, int me, const void* in, void* out, std::int64_t bytes) {
  return [=] {
    if (me == 0)
      mpi_check(MPI_Send(in, static_cast<int>(bytes), MPI_BYTE, 1, 7, part), "MPI_Send");
    else if (me == 1)
      mpi_check(MPI_Recv(out, static_cast<int>(bytes), MPI_BYTE, 0, 7, part, MPI_STATUS_IGNORE),
                "MPI_Recv");
  };
}

// a: contiguous point-to-point.
void group_a(Bench& b) {
  if (!b.runs(2)) return;
  std::vector<std::int64_t> sizes =
      b.cfg().smoke ? std::vector<std::int64_t>{64 * 1024, kMiB}
                    : std::vector<std::int64_t>{kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB};
  for (std::int64_t bytes : sizes) {
    if (bytes > b.cfg().max_bytes) continue;
    const std::int64_t n = bytes / 4;
    const std::pair<Shape, std::string> forms[] = {{{n}, "R"}, {{n / 1024, 1024}, "RR"}};
    for (const auto& [shape, spec] : forms) {
      const Layout src = Layout::parse(shape, DType::f32, "1@0:" + spec),
                   dst = Layout::parse(shape, DType::f32, "1@1:" + spec);
      const std::string name = "1@0:" + spec + ">1@1:" + spec + " " + size_name(bytes);
      if (!b.cfg().wants(name)) continue;
      b.on_ranks(2, name, [&](MPI_Comm part) {
        const Plan p = plan(src, dst);
        Buffers buf(src, dst, b.me());
        std::vector<Method> ms{
            meshcast_method("meshcast", b.group(b.comm()), p, buf.src(), buf.dst(), buf.out.size()),
            {"send/recv", p2p(part, b.me(), buf.src(), buf.dst(), bytes), buf.dst(), buf.out.size(),
             &dst}};
        const auto [t, wrong] = b.measure(part, ms);
        b.report("a", name, 2, bytes, ms, t, wrong);
      });
    }
  }
}

// b: one sender, r receivers.
void group_b(Bench& b, int* argc, char*** argv) {
  const std::int64_t bytes = std::min(b.cfg().max_bytes, b.cfg().smoke ? kMiB : 64 * kMiB);
  const std::size_t chunks[] = {64 * 1024, 256 * 1024, 1 << 20, 4 << 20};
  struct Mode {
    std::string name;
    bool native;
    std::size_t chunk;
  };
  std::vector<Mode> modes;
  for (std::size_t c : chunks)
    modes.push_back({"chain " + size_name(static_cast<std::int64_t>(c)), false, c});
  if (b.cfg().backend == "mpi") modes.push_back({"native Ibcast", true, 0});
  std::vector<std::unique_ptr<Backend>> backends;  // collective to create: all ranks, once
  for (const Mode& m : modes)
    backends.push_back(
        make_backend(b.mpi(), b.cfg().backend, m.native, m.native ? kMiB : m.chunk, argc, argv));
  for (auto& backend : backends) b.add_comm(*backend->comm);
  for (int r = 1; r < b.world(); ++r) {
    const Shape shape{bytes / 4};
    const Layout src = Layout::parse(shape, DType::f32, "1@0:R");
    const Layout dst = Layout::parse(
        shape, DType::f32,
        r == 1 ? std::string("1@1:R") : std::to_string(r) + "@1-" + std::to_string(r) + ":R");
    const std::string name = "1@0:R>" + dst.mesh().str() + ":R " + size_name(bytes);
    if (!b.cfg().wants(name)) continue;
    b.on_ranks(r + 1, name, [&](MPI_Comm part) {
      PlanOptions po;
      po.strategy = Strategy::Broadcast;
      const Plan p = plan(src, dst, Topology::single_host(), po);
      Buffers buf(src, dst, b.me());
      const int me = b.me();
      void* bcast_buf = me == 0 ? const_cast<void*>(buf.src()) : buf.dst();
      Method send{"send/recv 0->1", p2p(part, me, buf.src(), buf.dst(), bytes),
                  me == 1 ? buf.dst() : nullptr, me == 1 ? buf.out.size() : 0, &dst};
      Method bcast{"MPI_Bcast",
                   [=] {
                     mpi_check(MPI_Bcast(bcast_buf, static_cast<int>(bytes), MPI_BYTE, 0, part),
                               "MPI_Bcast");
                   },
                   buf.dst(), buf.out.size(), &dst};
      for (std::size_t k = 0; k < modes.size(); ++k) {
        std::vector<Method> ms{
            meshcast_method(b.cfg().backend + " " + modes[k].name, b.group(*backends[k]->comm), p,
                            buf.src(), buf.dst(), buf.out.size()),
            send};
        if (k == 0) ms.push_back(bcast);  // MPI's own broadcast, once per r, for reference
        const auto [t, wrong] = b.measure(part, ms);
        b.report("b", name, r + 1, bytes, ms, t, wrong, 0, 1);
        if (k == 0) b.report("b", name, r + 1, bytes, ms, t, wrong, 2, 1);
      }
    });
  }
  b.drop_added_comms();  // the backends end here
}

// c: n-to-m moves of a 3-D tensor (the paper's microbenchmark shapes, scaled down).
void group_c(Bench& b) {
  struct Case {
    int ranks;
    const char* src;
    const char* dst;
  };
  const Case cases[] = {
      {4, "2x2@0-3:S0RR", "2x2@[1,2,3,0]:S0RR"},  // shifted devices
      {4, "2x2@0-3:RS0R", "2x2@0-3:S0RR"},
      {4, "2x2@0-3:S1RR", "2x2@0-3:S0RR"},
      {4, "2x2@0-3:RS0R", "2x2@0-3:RRS0"},
      {4, "2x2@0-3:S0S1R", "4@0-3:RRS0"},
      {4, "2@0-1:RRR", "2@2-3:RRR"},
      {8, "2x2@0-3:S0RR", "2x2@4-7:S0RR"},
      {8, "2x2@0-3:RS0R", "2x2@4-7:S0RR"},
      {8, "2x2@0-3:S1RR", "2x2@4-7:S0RR"},
      {8, "2x2@0-3:RS0R", "2x2@4-7:RRS0"},
      {8, "2x2@0-3:RRR", "2x2@4-7:RRR"},
      {8, "2x4@0-7:S0RR", "2x4@0-7:RS1R"},
  };
  const std::vector<Shape> shapes = b.cfg().smoke
                                        ? std::vector<Shape>{{16, 16, 8}}
                                        : std::vector<Shape>{{256, 256, 64}, {512, 512, 64}};
  for (const Case& c : cases) {
    if (!b.runs(c.ranks)) continue;
    for (const Shape& shape : shapes) {
      const Layout src = Layout::parse(shape, DType::f32, c.src, "src"),
                   dst = Layout::parse(shape, DType::f32, c.dst, "dst");
      if (src.bytes() > b.cfg().max_bytes) continue;
      const std::string name = std::string(c.src) + ">" + c.dst + " " + shape_str(shape);
      if (!b.cfg().wants(name)) continue;
      b.on_ranks(c.ranks, name, [&](MPI_Comm part) {
        // The subject is the plan a user gets by default (auto strategy); the broadcast plan
        // is timed beside it where auto chose another.
        const Plan p = plan(src, dst);
        PlanOptions po;
        po.strategy = Strategy::Broadcast;
        const Plan pb = plan(src, dst, Topology::single_host(), po);
        Buffers buf(src, dst, b.me());
        std::vector<int> devices(static_cast<std::size_t>(c.ranks));
        for (int i = 0; i < c.ranks; ++i) devices[static_cast<std::size_t>(i)] = i;
        mcbench::AlltoallvMove a2a(src, dst, part, devices, b.me(), buf.src(), buf.dst());
        mcbench::AllgatherSliceMove ag(src, dst, part, devices, b.me(), buf.src(), buf.dst());
        const Layout* check = &dst;
        std::vector<Method> ms{
            meshcast_method("meshcast auto:" + to_string(p.strategy()), b.group(b.comm()), p,
                            buf.src(), buf.dst(), buf.out.size()),
            {"alltoallv", [&a2a] { a2a.run(); }, buf.dst(), buf.out.size(), check},
            {"allgather+slice", [&ag] { ag.run(); }, buf.dst(), buf.out.size(), check}};
        if (!(pb == p))
          ms.push_back(meshcast_method("meshcast broadcast", b.group(b.comm()), pb, buf.src(),
                                       buf.dst(), buf.out.size()));
        const auto [t, wrong] = b.measure(part, ms);
        b.report("c", name, c.ranks, src.bytes(), ms, t, wrong);
        if (ms.size() > 3) b.report("c", name, c.ranks, src.bytes(), ms, t, wrong, 3, 1);
      });
    }
  }
}

#ifdef MESHCAST_HAS_SCALAPACK
// d: 2-D block layouts against ScaLAPACK's redistribution.
void group_d(Bench& b) {
  struct Case {
    const char* src;
    const char* dst;
  };
  const Case cases[] = {{"2x2@0-3:S0S1", "1x4@0-3:S0S1"},
                        {"1x4@0-3:S0S1", "2x2@0-3:S0S1"},
                        {"2x2@0-3:S0S1", "4x1@0-3:S0S1"}};
  if (!b.runs(4)) return;
  const std::vector<std::pair<Shape, DType>> sizes =
      b.cfg().smoke ? std::vector<std::pair<Shape, DType>>{{{64, 64}, DType::f64}}
                    : std::vector<std::pair<Shape, DType>>{{{4096, 4096}, DType::f64},
                                                           {{4096, 4096}, DType::f32}};
  for (const auto& [shape, t] : sizes)
    for (const Case& c : cases) {
      const Layout src = Layout::parse(shape, t, c.src, "src"),
                   dst = Layout::parse(shape, t, c.dst, "dst");
      if (src.bytes() > b.cfg().max_bytes) continue;
      const std::string name =
          std::string(c.src) + ">" + c.dst + " " + shape_str(shape) + " " + to_string(t);
      if (!b.cfg().wants(name)) continue;
      b.on_ranks(4, name, [&](MPI_Comm part) {
        const Plan p = plan(src, dst);
        Buffers buf(src, dst, b.me());
        std::vector<std::byte> theirs(buf.out.size());
        const int system = Csys2blacs_handle(part);
        int all = system;
        Cblacs_gridinit(&all, "R", 1, 4);
        {
          mcbench::ScalapackGrid gs(src, b.me(), system), gd(dst, b.me(), system);
          const Layout* check = &dst;
          std::vector<Method> ms{meshcast_method("meshcast", b.group(b.comm()), p, buf.src(),
                                                 buf.dst(), buf.out.size()),
                                 {"scalapack gemr2d",
                                  [&, t = t] {
                                    mcbench::scalapack_gemr2d(t, src, gs, buf.src(), gd,
                                                              theirs.data(), all);
                                  },
                                  theirs.data(), theirs.size(), check}};
          const auto [times, wrong] = b.measure(part, ms);
          // Both results, bit for bit.
          long long differ =
              buf.out.size() && std::memcmp(buf.out.data(), theirs.data(), theirs.size()) ? 1 : 0;
          MPI_Allreduce(MPI_IN_PLACE, &differ, 1, MPI_LONG_LONG, MPI_SUM, part);
          auto w = wrong;
          w[1] += differ;
          b.report("d", name, 4, src.bytes(), ms, times, w);
        }
        Cblacs_gridexit(all);
        Cfree_blacs_system_handle(system);
      });
    }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (meshcast::bench::smoke_mode()) {
    cfg.smoke = true;
    cfg.iters = 3;
  }
  meshcast::bench::Args("mpi_reshard", "mpirun -np N mpi_reshard")
      .text("--groups", cfg.groups, "the groups to run, of a,b,c,d", "LIST")
      .flag("--fit", cfg.fit, "also run the cases of fewer ranks than the world")
      .number("--iters", cfg.iters, 1, "timed iterations per method")
      .number("--warmup", cfg.warmup, 0, "untimed iterations first")
      .text("--json", cfg.json, "write the rows to FILE", "FILE")
      .number("--max-mib", cfg.max_bytes, 1, "largest tensor in MiB", kMiB)
      .choice("--backend", cfg.backend, {"mpi", "ucx"}, "meshcast's transport")
      .flag("--native", cfg.native, "the transport's native chunking")
      .number("--chunk-kib", cfg.chunk, 1, "chain chunk in KiB", 1024)
      .text("--filter", cfg.filter, "only the cases whose name contains TEXT")
      .parse(argc, argv);
  MpiSession mpi(&argc, &argv, MpiOptions{60});
  int me = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int status = 0;
  try {
    auto main_backend = make_backend(mpi, cfg.backend, cfg.native, cfg.chunk, &argc, &argv);
    Bench bench(mpi, *main_backend->comm, cfg);
    const std::string desc = machine(world, "meshcast backend " + cfg.backend);
    if (me == 0) {
      std::printf("# mpi_reshard: %s\n# iterations %d (+%d warm-up), %s, broadcast of a/c/d: %s\n",
                  desc.c_str(), cfg.iters, cfg.warmup, cfg.smoke ? "SMOKE sizes" : "full sizes",
                  cfg.native
                      ? "native"
                      : ("chain " + size_name(static_cast<std::int64_t>(cfg.chunk))).c_str());
      Bench::header();
    }
    if (cfg.has('a')) group_a(bench);
    if (cfg.has('b') && world >= 2) group_b(bench, &argc, &argv);
    if (cfg.has('c')) group_c(bench);
#ifdef MESHCAST_HAS_SCALAPACK
    if (cfg.has('d')) {
      int pnum = 0, procs = 0;
      Cblacs_pinfo(&pnum, &procs);
      group_d(bench);
    }
#else
    if (cfg.has('d') && me == 0) std::printf("# group d skipped: built without ScaLAPACK\n");
#endif
    if (me == 0) {
      long long wrong = 0;
      for (const Row& r : bench.rows()) wrong += r.wrong;
      std::printf("# rows %zu, #wrong total %lld\n", bench.rows().size(), wrong);
      if (!cfg.json.empty()) {
        nlohmann::json j;
        j["machine"] = desc;
        j["ranks"] = world;
        j["iters"] = cfg.iters;
        j["warmup"] = cfg.warmup;
        j["smoke"] = cfg.smoke;
        j["backend"] = cfg.backend;
        j["broadcast"] = cfg.native ? "native" : "chain";
        j["chunk_bytes"] = cfg.chunk;
        j["date"] = utc_now();
        j["rows"] = nlohmann::json::array();
        for (const Row& r : bench.rows())
          j["rows"].push_back({{"group", r.group},
                               {"case", r.name},
                               {"subject", r.subject},
                               {"baseline", r.baseline},
                               {"ranks", r.ranks},
                               {"bytes", r.bytes},
                               {"seconds", r.time},
                               {"baseline_seconds", r.base_time},
                               {"ratio", r.base_time / r.time},
                               {"wrong", r.wrong},
                               {"iters", r.iters}});
        std::ofstream(cfg.json) << j.dump(1) << "\n";
      }
    }
    status = bench.failed() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", me, e.what());
    mpi.abort(1);
  }
#ifdef MESHCAST_HAS_SCALAPACK
  if (cfg.has('d')) Cblacs_exit(1);  // keep MPI: MpiSession finalizes it
#endif
  return status;
}
