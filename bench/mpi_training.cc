// The training engine under MPI: per configuration, steps with overlap on and off (alternating
// runs), and in the same run the OpenBLAS sgemm rate of the linears' shapes with every rank
// multiplying at once (the same contention for cores). Rows: step time, compute, exposed
// communication, bubble, the GEMM rate inside training and its ratio to that sgemm rate, and
// the exposed communication with overlap on over off.
//
//   mpirun -np 4 mpi_training --stages dp=1,tp=2/dp=1,tp=2 --micro-batches 4 [--json FILE]
#include <meshcast/collectives.h>
#include <meshcast/error.h>
#include <meshcast/limits.h>
#include <meshcast/mpi.h>
#include <meshcast/training/engine.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "args.h"
#include "lib/support/spread.h"
#include "mpi_harness.h"
#include "training/ops.h"

using namespace meshcast;
namespace tr = meshcast::training;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sum (or max) of one value over every rank.
double reduce(Communicator& comm, double v, ReduceOp op) {
  all_reduce(comm.world(), &v, &v, 1, DType::f64, op);
  return v;
}

// The rate of this rank's sgemm on the shapes of its linears (forward and both backward
// products).
double sgemm_rate(const tr::ModelConfig& m, const tr::StageShape& s, std::int64_t tokens) {
  const std::int64_t d = m.d_model, f = m.ffn_width();
  const std::int64_t shapes[4][2] = {{d / s.rows, 3 * d / s.cols},
                                     {d / s.cols, d / s.rows},
                                     {d / s.rows, f / s.cols},
                                     {f / s.cols, d / s.rows}};
  std::vector<float> x(static_cast<std::size_t>(tokens * std::max(d, f)), 0.5f),
      w(static_cast<std::size_t>(3 * d * f), 0.25f),
      y(static_cast<std::size_t>(tokens * 3 * std::max(d, f)));
  double flops = 0, seconds = 0;
  for (int rep = 0; rep < 6 || seconds < 0.5; ++rep) {
    const double t0 = now();
    for (const auto& sh : shapes) {
      const std::int64_t in = sh[0], out = sh[1];
      tr::gemm(false, false, tokens, out, in, 1, x.data(), w.data(), 0, y.data());  // forward
      tr::gemm(false, true, tokens, in, out, 1, y.data(), w.data(), 0, x.data());   // dx
      tr::gemm(true, false, in, out, tokens, 1, x.data(), y.data(), 1, w.data());   // dw
      if (rep > 0) flops += 6.0 * static_cast<double>(tokens * in * out);
    }
    if (rep > 0) seconds += now() - t0;
  }
  return flops / seconds;
}

// sgemm_rate with every rank multiplying at once (the contention for cores that training
// has at its busiest), and with each rank alone while the others sleep (the best a rank gets).
std::pair<double, double> sgemm_rates(Communicator& comm, const tr::ModelConfig& m,
                                      const tr::StageShape& s, std::int64_t tokens) {
  comm.barrier();
  const double together = sgemm_rate(m, s, tokens);
  double alone = 0;
  for (int r = 0; r < comm.size(); ++r) {
    mcbench::quiet_barrier(MPI_COMM_WORLD);
    if (r == comm.rank()) alone = sgemm_rate(m, s, tokens);
  }
  mcbench::quiet_barrier(MPI_COMM_WORLD);
  return {together, alone};
}

// Every rank runs the same command: ranks given other options would train other models side by
// side (a silent result, a hang, or a read past a peer's buffer). The arguments' digest is
// compared over the ranks before any work.
void require_same_arguments(Communicator& comm, const std::string& args) {
  const std::int64_t h[] = {static_cast<std::int64_t>(std::hash<std::string>{}(args) >> 1)};
  if (!detail::spread(comm.world(), h)[0].same())
    throw ValidationError("arguments",
                          "the ranks were given other options (every rank runs "
                          "the same mpi_training command)");
}

// Whether `path` can be written, known before the work rather than after it; a file that was
// not there is not left behind.
void require_writable(const std::string& path) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  if (!std::ofstream(path, std::ios::app)) throw IoError("json", "cannot write " + path);
  if (!existed) std::filesystem::remove(path, ec);
}

// The memory this rank's sgemm rate takes (sgemm_rate's three arrays), before it is taken.
void check_sgemm_memory(const tr::ModelConfig& m, std::int64_t tokens) {
  const double d = m.d_model, f = m.ffn_width(), wide = std::max(d, f);
  const double bytes = sizeof(float) * (4 * static_cast<double>(tokens) * wide + 3 * d * f);
  check_limit("train memory", static_cast<std::int64_t>(std::min(bytes, 0x1p62)),
              limits().train_memory_bytes, "TRAIN_MEMORY_BYTES");
}

}  // namespace

// The measurement, once the options are checked alike on every rank (below main).
static int run(Communicator& comm, const tr::ModelConfig& model, tr::ParallelConfig& par,
               const tr::TrainConfig& cfg, int rounds, const std::string& stages,
               const std::string& label, const std::string& topo_path, const std::string& json);

int main(int argc, char** argv) {
  std::string args;
  for (int i = 1; i < argc; ++i) args += std::string(argv[i]) + '\0';
  MpiOptions mo;
  mo.timeout_seconds = 300;
  const bool smoke = meshcast::bench::smoke_mode();
  tr::ModelConfig model;
  model.vocab = 256;
  model.seq = 64;
  model.d_model = 256;
  model.heads = 8;
  model.layers = 4;
  tr::ParallelConfig par;
  tr::TrainConfig cfg;
  cfg.batch = 16;
  cfg.steps = smoke ? 2 : 6;
  int rounds = smoke ? 1 : 2;
  std::string stages = "dp=1", json, topo_path, label;
  Topology topology;
  par.micro_batches = 4;
  par.schedule = tr::ScheduleKind::Eager1F1B;
  meshcast::bench::Args("mpi_training", "mpirun -np N mpi_training --stages S/S/...")
      .text("--stages", stages, "the pipeline's stages, '/' between them", "S/S")
      .number("--micro-batches", par.micro_batches, 1, "micro-batches per step")
      .custom(
          "--schedule", "NAME", [&](const std::string& v) { par.schedule = tr::parse_schedule(v); },
          "the pipeline schedule")
      .number("--sub-batches", par.sub_batches, 1, "sub-batches per micro-batch")
      .number("--d-model", model.d_model, 1, "model width")
      .number("--seq", model.seq, 1, "tokens per sample")
      .number("--layers", model.layers, 1, "transformer blocks")
      .number("--heads", model.heads, 1, "attention heads")
      .number("--batch", cfg.batch, 1, "samples per step")
      .number("--steps", cfg.steps, 2, "steps per run (the first, a warm-up, is not measured)")
      .number("--rounds", rounds, 1, "runs with overlap on and off, alternating")
      .custom(
          "--reshard", "STRATEGY", [&](const std::string& v) { par.reshard = parse_strategy(v); },
          "the strategy of the stages' reshards")
      .text("--topology", topo_path, "where the ranks run", "FILE")
      .text("--label", label, "the run's name in the report")
      .text("--json", json, "write the rows to FILE", "FILE")
      .parse(argc, argv);
  MpiSession mpi(&argc, &argv, mo);
  Communicator& comm = mpi.world();
  try {
    require_same_arguments(comm, args);  // first: other options fail other checks
    // This rank's checks, agreed on: every rank refuses alike (one that returned alone would
    // leave the others waiting in the next collective).
    std::unique_ptr<Error> failure;
    try {
      if (smoke) model.d_model = 64, model.seq = 16;
      par.stages.clear();
      std::stringstream in(stages);
      std::string item;
      while (std::getline(in, item, '/')) par.stages.push_back(tr::parse_stage_shape(item));
      if (!topo_path.empty()) {
        topology = Topology::load(topo_path);
        par.topology = &topology;
      }
      tr::validate(model, par, cfg);
      if (comm.size() < par.devices())
        throw ValidationError("stages", "needs " + std::to_string(par.devices()) + " ranks");
      if (comm.rank() == 0 && !json.empty()) require_writable(json);  // rank 0 writes it
    } catch (const Error& e) {
      failure = std::make_unique<Error>(e);
    }
    comm.agree(comm.world(), failure.get());
  } catch (const std::exception& e) {
    if (comm.rank() == 0) std::fprintf(stderr, "mpi_training: %s\n", e.what());
    const auto* err = dynamic_cast<const Error*>(&e);
    return err && err->kind() == ErrorKind::Io ? 4 : 2;
  }
  try {
    return run(comm, model, par, cfg, rounds, stages, label, topo_path, json);
  } catch (const std::exception& e) {  // a peer that failed, mid-run: no collective recovers
    const auto* err = dynamic_cast<const Error*>(&e);
    std::fprintf(stderr, "mpi_training: rank %d: %s\n", comm.rank(), e.what());
    std::fflush(stderr);
    mpi.abort(!err                                    ? 1
              : err->kind() == ErrorKind::PeerFailure ? 3
              : err->kind() == ErrorKind::Io          ? 4
              : err->kind() == ErrorKind::BadInput    ? 2
                                                      : 1);
  }
}

static int run(Communicator& comm, const tr::ModelConfig& model, tr::ParallelConfig& par,
               const tr::TrainConfig& cfg, int rounds, const std::string& stages,
               const std::string& label, const std::string& topo_path, const std::string& json) {
  tr::use_single_threaded_blas();
  const auto batches = tr::random_batches(model, cfg.batch, 3);
  const bool active = comm.rank() < par.devices();
  // This rank's stage and its tokens per micro-batch.
  tr::StageShape mine;
  int first = 0;
  for (const auto& s : par.stages) {
    if (comm.rank() >= first && comm.rank() < first + s.devices()) mine = s;
    first += s.devices();
  }
  const std::int64_t tokens =
      std::max<std::int64_t>(1, cfg.batch / par.micro_batches / (mine.dp * mine.depth)) * model.seq;
  check_sgemm_memory(model, tokens);

  struct Sample {
    std::vector<double> step, compute, exposed, bubble, rate, loss;
  } on, off;
  std::vector<double> together, alone;
  for (int r = 0; r < rounds; ++r) {
    const auto [t, a] = sgemm_rates(comm, model, mine, tokens);
    together.push_back(t);
    alone.push_back(a);
    for (bool overlap : {true, false}) {
      par.overlap = overlap;
      // Every rank calls it (the ranks beyond the run return at once, having made its groups).
      const tr::TrainResult res = tr::train(comm, model, par, cfg, batches);
      Sample& s = overlap ? on : off;
      double flops = 0, secs = 0;
      // Step 1 builds the caches and warms up: left out.
      for (std::size_t i = 1; i < res.steps.size(); ++i) {
        const auto& st = res.steps[i];
        s.step.push_back(st.seconds);
        s.compute.push_back(st.compute);
        s.exposed.push_back(st.exposed_comm);
        s.bubble.push_back(st.bubble);
        s.loss.push_back(st.loss);
        flops += st.gemm_flops;
        secs += st.gemm_seconds;
      }
      if (secs > 0) s.rate.push_back(flops / secs);
      comm.barrier();
    }
  }
  // Per rank medians, then the mean over the active ranks (the slowest for the step time).
  auto over_ranks = [&](const std::vector<double>& v, ReduceOp op) {
    const double x = active ? meshcast::bench::median(v) : 0;  // inactive ranks add nothing
    const double sum = reduce(comm, x, op);
    return op == ReduceOp::Max ? sum : sum / par.devices();
  };
  const double base_rate = over_ranks(alone, ReduceOp::Sum);
  const double busy_rate = over_ranks(together, ReduceOp::Sum);
  nlohmann::json rows = nlohmann::json::array();
  if (comm.rank() == 0)
    std::printf(
        "# sgemm GF/s per rank on the linears' shapes: %.3f alone, %.3f with every rank "
        "at once\n# %-34s %7s %9s %9s %9s %9s %10s %6s\n",
        base_rate / 1e9, busy_rate / 1e9, "stages (schedule, micro-batches)", "overlap", "step(ms)",
        "compute", "exposed", "bubble", "gemm GF/s", "ratio");
  double exposed[2] = {0, 0};
  for (bool overlap : {true, false}) {
    const Sample& s = overlap ? on : off;
    const double step = over_ranks(s.step, ReduceOp::Max);
    const double compute = over_ranks(s.compute, ReduceOp::Sum);
    const double exp = over_ranks(s.exposed, ReduceOp::Sum);
    const double bubble = over_ranks(s.bubble, ReduceOp::Sum);
    const double rate = over_ranks(s.rate, ReduceOp::Sum);
    exposed[overlap ? 0 : 1] = exp;
    if (comm.rank() == 0) {
      const std::string name = (label.empty() ? stages : label) + " (" +
                               tr::to_string(par.schedule) + ", " +
                               std::to_string(par.micro_batches) + ")";
      std::printf("  %-34s %7s %9.2f %9.2f %9.2f %9.2f %10.3f %6.2f\n", name.c_str(),
                  overlap ? "on" : "off", step * 1e3, compute * 1e3, exp * 1e3, bubble * 1e3,
                  rate / 1e9, rate / base_rate);
      rows.push_back({{"stages", stages},
                      {"label", label},
                      {"schedule", tr::to_string(par.schedule)},
                      {"micro_batches", par.micro_batches},
                      {"overlap", overlap},
                      {"step_seconds", step},
                      {"compute_seconds", compute},
                      {"exposed_seconds", exp},
                      {"bubble_seconds", bubble},
                      {"gemm_flops_per_second", rate},
                      {"sgemm_alone_flops_per_second", base_rate},
                      {"sgemm_together_flops_per_second", busy_rate},
                      {"loss", s.loss.empty() ? 0.0 : s.loss.back()}});
    }
  }
  if (comm.rank() == 0) {
    std::printf("# exposed communication, overlap on / off: %.2f\n",
                exposed[1] > 0 ? exposed[0] / exposed[1] : 0.0);
    if (!json.empty()) {
      nlohmann::json doc{{"ranks", comm.size()},
                         {"model",
                          {{"d_model", model.d_model},
                           {"seq", model.seq},
                           {"layers", model.layers},
                           {"heads", model.heads},
                           {"batch", cfg.batch}}},
                         {"topology", topo_path},
                         {"rows", rows}};
      std::ofstream out(json);
      out << doc.dump(1) << '\n';
      if (!out.flush()) throw IoError("json", "cannot write " + json);
    }
  }
  return 0;
}
