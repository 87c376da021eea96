// `meshcast train gpt`: trains the engine's GPT-style decoder with data, tensor and pipeline
// parallelism on the in-process backend (one thread per device) or one process per device
// (mpi under mpirun), and reports every step's loss and where its time went.
#include <CLI/CLI.hpp>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.h"
#include "meshcast/error.h"
#include "meshcast/training/engine.h"
#include "meshcast/training/ops.h"
#include "meshcast/training/planner.h"

namespace meshcast::cli {
namespace {

namespace tr = meshcast::training;

int positive(const std::string& text, const std::string& field, long long max = 1LL << 30) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || v < 1 || v > max)
    throw ValidationError(
        field, "expected an integer in 1.." + std::to_string(max) + ", got '" + text + "'");
  return static_cast<int>(v);
}

float real(const std::string& text, const std::string& field) {
  std::size_t used = 0;
  float v = 0;
  try {
    v = std::stof(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(v >= 0))
    throw ValidationError(field, "expected a number >= 0, got '" + text + "'");
  return v;
}

// Learnable synthetic text: each sample counts from a random start by a random stride (mod
// vocab), so the next token follows from the two before it.
tr::BatchSource pattern_batches(const tr::ModelConfig& model, int batch, std::uint64_t seed) {
  return [model, batch, seed](int step, tr::Batch& out) {
    tr::Rng rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(step) + 1);
    const auto vocab = static_cast<std::uint64_t>(model.vocab);
    out.inputs.clear();
    out.targets.clear();
    for (int b = 0; b < batch; ++b) {
      const auto start = rng.next() % vocab;
      const auto stride = 1 + rng.next() % 4;
      for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(model.seq); ++i) {
        out.inputs.push_back(static_cast<std::int32_t>((start + stride * i) % vocab));
        out.targets.push_back(static_cast<std::int32_t>((start + stride * (i + 1)) % vocab));
      }
    }
  };
}

struct Parsed {
  tr::ModelConfig model;
  tr::ParallelConfig parallel;
  tr::TrainConfig train;
  Topology topology;
};

Parsed parse(const TrainArgs& a) {
  Parsed p;
  p.model.vocab = positive(a.vocab, "vocab", 1 << 20);
  p.model.seq = positive(a.seq, "seq", 1 << 16);
  p.model.d_model = positive(a.d_model, "d-model", 1 << 16);
  p.model.heads = positive(a.heads, "heads", 1 << 12);
  p.model.layers = positive(a.layers, "layers", 1 << 12);
  p.parallel.stages.clear();
  std::stringstream in(a.stages);
  std::string item;
  int i = 0;
  while (std::getline(in, item, '/'))
    p.parallel.stages.push_back(tr::parse_stage_shape(item, "stages[" + std::to_string(i++) + "]"));
  if (p.parallel.stages.empty()) throw ValidationError("stages", "give at least one stage");
  p.parallel.chunks = positive(a.chunks, "chunks", 64);
  p.parallel.micro_batches = positive(a.micro_batches, "micro-batches", 1 << 16);
  p.parallel.schedule = tr::parse_schedule(a.schedule, "schedule");
  p.parallel.overlap = !a.no_overlap;
  p.parallel.sub_batches = positive(a.sub_batches, "sub-batches", 1024);
  p.parallel.reshard = parse_strategy(a.reshard, "reshard");
  if (!a.topology.empty()) {
    p.topology = Topology::load(a.topology);
    p.parallel.topology = &p.topology;
  }
  p.train.batch = positive(a.batch, "batch", 1 << 20);
  p.train.steps = positive(a.steps, "steps", 1 << 24);
  p.train.seed = static_cast<std::uint64_t>(positive(a.seed, "seed", 1LL << 30));
  p.train.lr = real(a.lr, "lr");
  tr::validate(p.model, p.parallel, p.train);
  if (a.data != "pattern" && a.data != "random")
    throw ValidationError("data", "expected pattern or random, got '" + a.data + "'");
  return p;
}

std::string ms(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << s * 1e3;
  return o.str();
}

// This machine's fp32 GEMM rate on the model's MLP shape (one thread), measured now.
double measure_flops(const tr::ModelConfig& m, int batch) {
  tr::use_single_threaded_blas();
  const std::int64_t t = static_cast<std::int64_t>(batch) * m.seq, d = m.d_model, f = m.ffn_width();
  std::vector<float> x(static_cast<std::size_t>(t * d), 0.5f),
      w(static_cast<std::size_t>(d * f), 0.25f), y(static_cast<std::size_t>(t * f));
  double flops = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double seconds = 0;
  while (seconds < 0.2) {
    tr::gemm(false, false, t, f, d, 1, x.data(), w.data(), 0, y.data());
    flops += 2.0 * static_cast<double>(t * d * f);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return flops / seconds;
}

int run_plan(const TrainArgs& a, const Parsed& p) {
  const int devices = positive(a.devices, "devices", 1 << 20);
  const int top = positive(a.top, "top", 1000);
  const Topology topology = a.topology.empty() ? Topology::single_host() : p.topology;
  tr::Machine machine{measure_flops(p.model, p.train.batch)};
  const auto ranked = tr::rank_configurations(p.model, p.train, devices, topology, machine, top);
  if (a.json) {
    nlohmann::json j;
    j["devices"] = devices;
    j["gemm_flops_per_second"] = machine.flops;
    j["topology"] = topology.name();
    for (const auto& r : ranked) {
      std::string stages;
      for (const auto& s : r.parallel.stages)
        stages += (stages.empty() ? "" : "/") + tr::to_string(s);
      j["configurations"].push_back({{"stages", stages},
                                     {"micro_batches", r.parallel.micro_batches},
                                     {"schedule", tr::to_string(r.parallel.schedule)},
                                     {"seconds", r.total},
                                     {"compute", r.compute},
                                     {"tensor_comm", r.tensor_comm},
                                     {"data_comm", r.data_comm},
                                     {"pipeline_comm", r.pipeline_comm},
                                     {"bubble", r.bubble}});
    }
    std::cout << j.dump() << '\n';
    return 0;
  }
  std::cout << "top " << ranked.size() << " configurations of " << devices << " devices on "
            << topology.name() << " (GEMM rate measured: " << std::setprecision(3)
            << machine.flops / 1e9 << " GFLOP/s; predicted step time, no overlap assumed):\n";
  for (const auto& r : ranked) std::cout << "  " << r.str() << '\n';
  return 0;
}

}  // namespace

void add_train_options(CLI::App& cmd, TrainArgs& a) {
  cmd.add_option("--stages", a.stages,
                 "pipeline stages separated by '/', each dp=N and tp=N (Megatron) or "
                 "grid=RxCxD (3D tensor parallelism), e.g. dp=2,tp=2/grid=2x1x2; stage s runs on "
                 "the next dp*R*C*D device ids")
      ->type_name("STAGES")
      ->capture_default_str();
  cmd.add_option("--chunks", a.chunks, "model pieces per stage (interleaved schedule)")
      ->capture_default_str();
  cmd.add_option("--micro-batches", a.micro_batches, "micro-batches per step")
      ->capture_default_str();
  cmd.add_option("--schedule", a.schedule, "gpipe, 1f1b, interleaved or eager-1f1b")
      ->capture_default_str();
  cmd.add_option("--sub-batches", a.sub_batches,
                 "split each linear's rows so that its collective overlaps the next slice")
      ->capture_default_str();
  cmd.add_flag("--no-overlap", a.no_overlap,
               "wait on every collective as soon as it starts (to measure what overlap hides)");
  cmd.add_option("--reshard", a.reshard,
                 "strategy of the stage-boundary reshards: auto, broadcast, sendrecv, allgather")
      ->capture_default_str();
  cmd.add_option("--topology", a.topology, "topology JSON file (meshes/*.json)")->type_name("FILE");
  cmd.add_option("--vocab", a.vocab, "vocabulary size")->capture_default_str();
  cmd.add_option("--seq", a.seq, "tokens per sample")->capture_default_str();
  cmd.add_option("--d-model", a.d_model, "model width")->capture_default_str();
  cmd.add_option("--heads", a.heads, "attention heads")->capture_default_str();
  cmd.add_option("--layers", a.layers, "transformer blocks")->capture_default_str();
  cmd.add_option("--batch", a.batch, "samples per step")->capture_default_str();
  cmd.add_option("--steps", a.steps, "training steps")->capture_default_str();
  cmd.add_option("--lr", a.lr, "AdamW learning rate")->capture_default_str();
  cmd.add_option("--seed", a.seed, "seed of the initial parameters and the data")
      ->capture_default_str();
  cmd.add_option("--data", a.data,
                 "pattern (strided counting sequences: learnable) or random (uniform tokens)")
      ->capture_default_str();
  cmd.add_option("--backend", a.backend,
                 "local (threads) or mpi (one process per device, under mpirun)")
      ->capture_default_str();
  cmd.add_flag("--json", a.json, "print one JSON object with every step's figures");
  cmd.add_flag("--plan", a.plan,
               "train nothing: rank every parallel configuration of --devices devices on "
               "--topology by the analytic model (AxoNN style) and print the --top best with "
               "their predicted step-time breakdown");
  cmd.add_option("--devices", a.devices, "devices to plan for (--plan)")->capture_default_str();
  cmd.add_option("--top", a.top, "configurations to print (--plan)")->capture_default_str();
}

int run_train(const TrainArgs& a) {
  if (a.backend != "local" && a.backend != "mpi")
    throw ValidationError("backend", "expected local or mpi, got '" + a.backend + "'");
  check_backend(a.backend);
  const Parsed p = parse(a);
  if (a.plan) return run_plan(a, p);
  const auto batches = a.data == "random" ? tr::random_batches(p.model, p.train.batch, p.train.seed)
                                          : pattern_batches(p.model, p.train.batch, p.train.seed);
  const int devices = p.parallel.devices();
  tr::TrainResult result;
  bool root = true;
  auto body = [&](Communicator& comm) {
    auto r = tr::train(comm, p.model, p.parallel, p.train, batches);
    if (comm.rank() == 0) result = std::move(r);
  };
  if (a.backend == "local") {
    if (devices > 256)
      throw ValidationError("stages", "the local backend runs at most 256 device threads");
    LocalWorld world(devices);
    world.run(body);
  }
#ifdef MESHCAST_HAS_MPI
  else {
    with_process_backend(a.backend, [&](ProcessSession& s) {
      root = s.comm.rank() == 0;
      body(s.comm);
    });
  }
#endif
  if (!root) return 0;
  const double tokens = static_cast<double>(p.train.batch) * p.model.seq;
  if (a.json) {
    nlohmann::json j;
    j["devices"] = devices;
    j["backend"] = a.backend;
    std::string stages;
    for (const auto& s : p.parallel.stages)
      stages += (stages.empty() ? "" : "/") + tr::to_string(s);
    j["stages"] = stages;
    j["schedule"] = tr::to_string(p.parallel.schedule);
    j["micro_batches"] = p.parallel.micro_batches;
    j["overlap"] = p.parallel.overlap;
    for (const auto& s : result.steps)
      j["steps"].push_back({{"loss", s.loss},
                            {"seconds", s.seconds},
                            {"compute", s.compute},
                            {"exposed_comm", s.exposed_comm},
                            {"bubble", s.bubble},
                            {"grad_norm", s.grad_norm},
                            {"tokens_per_second", tokens / s.seconds}});
    std::cout << j.dump() << '\n';
    return 0;
  }
  int step = 0;
  for (const auto& s : result.steps)
    std::cout << "step " << ++step << '/' << p.train.steps << "  loss " << std::fixed
              << std::setprecision(4) << s.loss << "  " << ms(s.seconds) << " ms (compute "
              << ms(s.compute) << ", exposed comm " << ms(s.exposed_comm) << ", bubble "
              << ms(s.bubble) << ")  " << std::setprecision(0) << tokens / s.seconds
              << " tokens/s\n";
  return 0;
}

}  // namespace meshcast::cli
