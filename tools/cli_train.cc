// `meshcast train gpt|utransformer`: trains the engine's models with data, tensor and pipeline
// parallelism on the in-process backend (one thread per device) or one process per device (mpi
// under mpirun); shows progress, evaluates on held-out data, checkpoints, and writes a loss
// curve, a step-time chart and a JSON summary at the end. Only device 0 reports.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "cli.h"
#include "lib/support/fnv.h"
#include "lib/support/json_text.h"
#include "lib/support/saturated.h"
#include "lib/support/text.h"
#include "meshcast/bootstrap.h"
#include "meshcast/collectives.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/training/config_search.h"
#include "meshcast/training/engine.h"
#include "meshcast/units.h"
#include "training/chart.h"
#include "training/checkpoint.h"
#include "training/data.h"
#include "training/ops.h"

namespace meshcast::cli {
namespace {

namespace tr = meshcast::training;

// Digits only (lo >= 0): no sign, blank or other text ("+4", " 4", "4k").
long long integer(const std::string& text, const std::string& field, long long lo, long long hi) {
  const std::int64_t v = detail::digits_value(text, hi);
  if (v < lo)
    throw ValidationError(field, "expected an integer in " + std::to_string(lo) + ".." +
                                     std::to_string(hi) + ", got " + detail::quote(text));
  return v;
}
int positive(const std::string& text, const std::string& field, long long hi = 1LL << 30) {
  return static_cast<int>(integer(text, field, 1, hi));
}

// A bound as people write it: 0, 10, 0.5 (std::to_string's six decimals read as noise).
std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

double real(const std::string& text, const std::string& field, double lo, double hi) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  // As people write one (strtod also takes blanks, hex, "inf" and "nan").
  if (!detail::plain_decimal(text) || used != text.size() || !(v >= lo && v <= hi))
    throw ValidationError(field, "expected a number in [" + number_text(lo) + ", " +
                                     number_text(hi) + "], got " + detail::quote(text));
  return v;
}

// The keys of a --config file, the options they stand for, and the field they fill
// (null for the two flags, overlap and resume).
struct ConfigKey {
  const char* key;
  const char* option;
  std::string TrainArgs::*field;
};
constexpr ConfigKey kConfigKeys[] = {
    {"stages", "--stages", &TrainArgs::stages},
    {"chunks", "--chunks", &TrainArgs::chunks},
    {"micro_batches", "--micro-batches", &TrainArgs::micro_batches},
    {"schedule", "--schedule", &TrainArgs::schedule},
    {"sub_batches", "--sub-batches", &TrainArgs::sub_batches},
    {"overlap", "--no-overlap", nullptr},
    {"reshard", "--reshard", &TrainArgs::reshard},
    {"topology", "--topology", &TrainArgs::topology},
    {"vocab", "--vocab", &TrainArgs::vocab},
    {"seq", "--seq", &TrainArgs::seq},
    {"d_model", "--d-model", &TrainArgs::d_model},
    {"heads", "--heads", &TrainArgs::heads},
    {"layers", "--layers", &TrainArgs::layers},
    {"batch", "--batch", &TrainArgs::batch},
    {"steps", "--steps", &TrainArgs::steps},
    {"lr", "--lr", &TrainArgs::lr},
    {"seed", "--seed", &TrainArgs::seed},
    {"data", "--data", &TrainArgs::data},
    {"noise", "--noise", &TrainArgs::noise},
    {"eval_every", "--eval-every", &TrainArgs::eval_every},
    {"checkpoint_dir", "--checkpoint-dir", &TrainArgs::checkpoint_dir},
    {"checkpoint_every", "--checkpoint-every", &TrainArgs::checkpoint_every},
    {"resume", "--resume", nullptr},
    {"out", "--out", &TrainArgs::out},
    {"backend", "--backend", &TrainArgs::backend},
};

// Fills the options not given on the command line from the --config JSON object. A value given
// empty on the command line is refused ("--checkpoint-dir ''" would silently save no
// checkpoint); in the file it is the default, as a run's run.json writes an option not given.
TrainArgs with_config(TrainArgs a, const CLI::App& cmd) {
  for (const ConfigKey& k : kConfigKeys)
    if (const CLI::Option* o = cmd.get_option_no_throw(k.option);
        k.field != nullptr && o != nullptr && o->count() > 0 && (a.*k.field).empty())
      throw ValidationError(std::string(k.option).substr(2), kGivenEmpty);
  if (const CLI::Option* o = cmd.get_option_no_throw("--config"); o && o->count() > 0)
    if (a.config.empty()) throw ValidationError("config", kGivenEmpty);
  if (a.config.empty()) return a;
  const nlohmann::json j =
      detail::parse_json(read_input_file(a.config, "config", limits().input_file_bytes), "config");
  if (!j.is_object()) throw ParseError("config", a.config + ": expected a JSON object");
  for (const auto& [key, value] : j.items()) {
    const auto* k = std::find_if(std::begin(kConfigKeys), std::end(kConfigKeys),
                                 [&](const ConfigKey& c) { return key == c.key; });
    if (k == std::end(kConfigKeys))
      throw ValidationError("config." + key,
                            "unknown key (see meshcast train " + cmd.get_name() + " --help)");
    const CLI::Option* option = cmd.get_option_no_throw(k->option);
    if (option == nullptr)
      throw ValidationError("config." + key, "this model has no " + std::string(k->option));
    if (option->count() > 0) continue;  // the command line wins
    if (k->field == nullptr) {
      if (!value.is_boolean()) throw ValidationError("config." + key, "expected true or false");
      if (key == "overlap")
        a.no_overlap = !value.get<bool>();
      else
        a.resume = value.get<bool>();
    } else if (value.is_string()) {
      if (const auto text = value.get<std::string>(); !text.empty()) a.*k->field = text;
    } else if (value.is_number()) {
      a.*k->field = value.dump();
    } else {
      throw ValidationError("config." + key, "expected a string or a number");
    }
  }
  return a;
}

struct Run {
  tr::ModelConfig model;
  tr::ParallelConfig parallel;
  tr::TrainConfig train;
  Topology topology;
  std::optional<tr::Corpus> corpus;   // gpt on text
  tr::BatchSource batches, held_out;  // empty until read_corpus() for gpt on text
  int eval_every = 0, checkpoint_every = 0;
  std::string data;               // what the samples are, in words
  std::uint64_t text_digest = 0;  // of a corpus's bytes: the ranks of a job must train on one
};

// The --stages text: stage shapes separated by '/', none of them empty.
std::vector<tr::StageShape> parse_stages(const std::string& text) {
  std::vector<tr::StageShape> stages;
  for (std::string_view item : detail::split(text, '/')) {
    const std::string field = "stages[" + std::to_string(stages.size()) + "]";
    if (item.empty())
      throw ParseError(
          field, "empty stage in " + detail::quote(text) + " (expected e.g. dp=2/grid=2x1x2)");
    stages.push_back(tr::parse_stage_shape(std::string(item), field));
  }
  return stages;
}

// Everything but the corpus, parsed and validated: no work done yet.
Run parse(const TrainArgs& a, const std::string& kind) {
  Run r;
  r.model.vocab = positive(a.vocab, "vocab", 1 << 20);
  r.model.seq = positive(a.seq, "seq", 1 << 16);
  r.model.d_model = positive(a.d_model, "d-model", 1 << 16);
  r.model.heads = positive(a.heads, "heads", 1 << 12);
  r.model.layers = positive(a.layers, "layers", 1 << 12);
  if (kind == "utransformer") tr::make_u_shaped(r.model);
  r.parallel.stages = parse_stages(a.stages);
  r.parallel.chunks = positive(a.chunks, "chunks", 64);
  r.parallel.micro_batches = positive(a.micro_batches, "micro-batches", 1 << 16);
  r.parallel.schedule = tr::parse_schedule(a.schedule, "schedule");
  r.parallel.overlap = !a.no_overlap;
  r.parallel.sub_batches = positive(a.sub_batches, "sub-batches", 1024);
  r.parallel.reshard = parse_strategy(a.reshard, "reshard");
  // parallel.topology points at it once the Run is in place (prepare()).
  if (!a.topology.empty()) r.topology = Topology::resolve(a.topology);  // a file or a preset
  r.train.batch = positive(a.batch, "batch", 1 << 20);
  r.train.steps = positive(a.steps, "steps", 1 << 24);
  r.train.seed = static_cast<std::uint64_t>(positive(a.seed, "seed"));
  r.train.lr = static_cast<float>(real(a.lr, "lr", 0, 10));
  tr::validate(r.model, r.parallel, r.train);
  const int every = static_cast<int>(integer(a.eval_every, "eval-every", 0, 1 << 24));
  r.eval_every = every > 0 ? every : std::max(1, r.train.steps / 10);
  r.checkpoint_every =
      static_cast<int>(integer(a.checkpoint_every, "checkpoint-every", 0, 1 << 24));
  if (a.resume && a.checkpoint_dir.empty())
    throw ValidationError("resume", "needs --checkpoint-dir");
  if (r.checkpoint_every > 0 && a.checkpoint_dir.empty())  // it would save nothing, silently
    throw ValidationError("checkpoint-every", "needs --checkpoint-dir");
  const std::uint64_t seed = r.train.seed;
  if (kind == "utransformer") {
    if (!a.data.empty())
      throw ValidationError("data", "the U-Transformer trains on generated sequences only");
    const double noise = real(a.noise, "noise", 0, 1);
    r.batches = tr::denoising_batches(r.model, r.train.batch, seed, noise);
    r.held_out = tr::denoising_batches(r.model, r.train.batch, seed + 0x5eed, noise);
    r.data = "generated random walks, " + a.noise + " of the tokens replaced by noise";
  } else if (a.data == "random") {
    r.batches = tr::random_batches(r.model, r.train.batch, seed);
    r.held_out = tr::random_batches(r.model, r.train.batch, seed + 0x5eed);
    r.data = "uniformly random tokens";
  }
  return r;
}

// GPT on text: reads the corpus into `r` (which the batch sources then point into).
void read_corpus(Run& r, const TrainArgs& a) {
  r.corpus = tr::Corpus::load(a.data.empty() ? tr::kDebianCorpus : a.data, 0.1,
                              static_cast<std::size_t>(r.model.seq) + 2);
  r.text_digest = detail::Fnv()
                      .add(r.corpus->train.data(), r.corpus->train.size())
                      .add(r.corpus->held_out.data(), r.corpus->held_out.size())
                      .h;
  r.batches = tr::text_batches(r.corpus->train, r.model, r.train.batch, r.train.seed);
  r.held_out = tr::text_batches(r.corpus->held_out, r.model, r.train.batch, r.train.seed + 0x5eed);
  r.data = r.corpus->source + " (" + std::to_string(r.corpus->train.size()) + " training, " +
           std::to_string(r.corpus->held_out.size()) + " held-out bytes)";
}

// The blocks of the stage that holds the most (stages own consecutive blocks).
double blocks_per_stage(const Run& r) {
  return std::ceil(static_cast<double>(r.model.layers) /
                   static_cast<double>(r.parallel.stages.size()));
}

// A conservative estimate of the bytes one process needs to train: on every device it runs (all
// of them on the local backend, one under mpi), f32 values, gradients and AdamW's m and v of its
// stage's share of the parameters, the all-gathered weights of its blocks, and the activations
// the backward pass keeps for every micro-batch of the step at once (as in GPipe) plus one
// block's temporaries. Layers per stage rounded up, the full sequence in every block (a
// U-Transformer's are shorter), and a quarter more for what is not modelled (the backward pass's
// other temporaries, communication buffers, the allocator's overhead: measured, the sum above
// came within 10% of the peak RSS). Then what grows with the pipeline and the devices rather
// than the model: every micro-batch's receives are posted when a step starts (8 KiB each, a
// transfer's state; 16,384 micro-batches over 8 stages of a 1-wide model took 1.3 GB), and each
// device thread's stack and allocator arena (2 MiB; 256 devices of a tiny model took 468 MB).
// A run that resumes from a checkpoint first loads it, before any activation: each device
// stages its tiles' values, m and v until every device has read everything (a failed load
// changes nothing), beside the saved tiles it reads, two batches in flight of at most
// LoadOptions::batch_bytes each or one tensor larger than that (the 1.5-1.8x of the training
// estimate a resume took was not counted). The estimate is the larger of the two.
// In double: the largest options overflow 64 bits.
double train_memory(const Run& r, bool one_device, bool loads) {
  constexpr double kUnmodelled = 1.25;
  const tr::ModelConfig& m = r.model;
  const double d = m.d_model, f = m.ffn_width(), vocab = m.vocab, seq = m.seq;
  const double micro = r.parallel.micro_batches;
  const std::size_t stages = r.parallel.stages.size();
  const double blocks = blocks_per_stage(r);
  // The load's saved tiles (value, m and v of each element) of the whole model, and of two
  // batches of one process's device.
  const double model =
      m.layers * (4 * d * d + 2 * d * f + 9 * d + f) + (2 * vocab + seq) * d + 2 * d;
  const double largest = std::max({vocab * d, seq * d, 3 * d * d, d * f});
  const double batch = static_cast<double>(tr::LoadOptions{}.batch_bytes);
  const double read =
      one_device ? std::min(12 * model, 2 * std::max(batch, 12 * largest)) : 12 * model;
  double total = 0, most = 0, load_total = 0, load_most = 0;
  for (std::size_t s = 0; s < stages; ++s) {
    const tr::StageShape& g = r.parallel.stages[s];
    const double rows = g.rows, cols = g.cols;
    // Linear weights split over R x C (the embedding and head tables over R), vectors whole.
    const double weights = blocks * (4 * d * d + 2 * d * f) / (rows * cols);
    double params = weights + blocks * (9 * d + f);
    if (s == 0) params += (vocab + seq) * d / rows;
    const bool last = s + 1 == stages;
    if (last) params += d * vocab / rows + 2 * d;
    const double samples = std::ceil(r.train.batch / micro / (g.dp * g.depth));
    const double tokens = samples * seq;
    const double block = tokens * (4 * d / rows + (4 * d + 2 * f) / cols + 4) +
                         samples * std::ceil(m.heads / cols) * seq * seq;
    const double activations =
        micro * (blocks * block + tokens * d + (last ? 2 * tokens * vocab : 0)) + block;
    // Receives from the stage before (forward) and after (backward), per model piece.
    const double flights = 2 * micro * r.parallel.chunks * (stages > 1 ? 1 : 0);
    const double device = 4 * (4 * params + weights + activations) + 8192 * flights + 0x1p21;
    total += device * g.devices();
    most = std::max(most, device);
    const double loading = 4 * (7 * params + weights) + 0x1p21;
    load_total += loading * g.devices();
    load_most = std::max(load_most, loading);
  }
  const double train = one_device ? most : total;
  const double load = (one_device ? load_most : load_total) + read;
  return kUnmodelled * (loads ? std::max(train, load) : train);
}

// Refuses a run whose estimated memory exceeds limits().train_memory_bytes, before anything is
// allocated; `loads`: it resumes from a checkpoint.
void check_train_memory(const Run& r, const std::string& backend, bool loads) {
  const double bytes = train_memory(r, backend != "local", loads);
  const auto bound = limits().train_memory_bytes;
  check_limit("train memory", detail::saturated_int64(bytes), bound, "TRAIN_MEMORY_BYTES");
}

// The arithmetic of the steps after `done`, counted as a dense transformer's (the full sequence
// in every block, as train_memory does): per token, 6 flops per weight of the linears and the
// head (forward and backward) and 12 x seq x d per block for attention; a held-out evaluation,
// a forward pass, every eval_every steps. With the local backend each device's step also
// counts 2^24 (0.8 ms here) for what is not arithmetic (its thread's messages and waits, on
// this machine's cores: a 256-device step of a 1-wide model took 3 s), and every pass of a
// micro-batch through a stage of a pipeline 2^23 (its transfers: 16,384 micro-batches over 8
// stages of a 1-wide model took 83 s a step, 0.3 ms a pass). Tensor parallelism runs a
// collective of a stage's tensor-parallel group (g devices) for every sub-batch of every
// micro-batch in every block: 2^18 each per member, times g again on the local backend, whose
// members' threads take turns on the cores (tp 8 with 1,024 sub-batches of 4 blocks: 3.4 s a
// step here, its arithmetic 1 ms; tp 2: 0.16 s). Work per weight whatever the tokens: every
// step's optimizer update, gradient norm and data-parallel all-reduce, 2^8 per weight a device
// holds (of every device with the local backend: a 67 M-weight model of one token a step took
// 1.0 s a step, 128 replicas of 3.3 M weights 7 s), and every checkpoint save, 2^12 per weight
// (written, synced and read back: 15 s for 67 M). In double: the largest options overflow 64
// bits.
double train_flops(const Run& r, int done, bool local) {
  const tr::ModelConfig& m = r.model;
  const double d = m.d_model, f = m.ffn_width(), seq = m.seq, layers = m.layers;
  const double weights = layers * (4 * d * d + 2 * d * f) + d * m.vocab;
  const double per_token = 6 * weights + 12 * layers * seq * d;
  const double steps = std::max(0, r.train.steps - done);
  const double evals = std::ceil(steps / r.eval_every);
  const double stages = static_cast<double>(r.parallel.stages.size());
  const double passes = stages > 1 ? 2 * stages * r.parallel.micro_batches * r.parallel.chunks : 0;
  double members = 0;  // of the stages' tensor-parallel collectives (squared where local)
  for (const tr::StageShape& s : r.parallel.stages) {
    const double g = static_cast<double>(s.rows) * s.cols * s.depth;
    if (g > 1) members += local ? g * g : g;
  }
  const double collectives =
      blocks_per_stage(r) * r.parallel.micro_batches * static_cast<double>(r.parallel.sub_batches);
  double held = 0;  // weights held: by every device (local), or the most any device holds
  for (const tr::StageShape& s : r.parallel.stages) {
    const double part = weights / stages / (static_cast<double>(s.rows) * s.cols * s.depth);
    held = local ? held + part * s.devices() : std::max(held, part);
  }
  const double saves = r.checkpoint_every > 0 ? std::floor(steps / r.checkpoint_every) : 0;
  return (steps + evals / 3) * per_token * r.train.batch * seq +
         steps * 0x1p24 * (local ? static_cast<double>(r.parallel.devices()) : 1.0) +
         steps * 0x1p23 * passes + steps * 0x1p18 * collectives * members + steps * 0x1p8 * held +
         saves * 0x1p12 * weights;
}

// Refuses, before any work, a run whose steps would compute for hours: --steps 16000000 of the
// default model counts 2.5e16 flops, two weeks here.
void check_train_flops(const Run& r, int done, bool local) {
  const double flops = train_flops(r, done, local);
  check_limit("train flops", detail::saturated_int64(flops), limits().train_flops, "TRAIN_FLOPS");
}

// Creates `dir` if need be and proves it writable (a file created and removed in it), and that
// none of the `files` the run writes there is something else than a file (a directory), before
// any work: a run must not be lost at its end to an output it cannot write.
void require_writable_dir(const std::string& dir, const std::string& field,
                          const std::vector<std::string>& files) {
  if (dir.empty()) throw ValidationError(field, "is empty (give a directory)");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError(field, "cannot create " + dir + ": " + ec.message());
  for (const std::string& name : files) {
    const std::string path = dir + "/" + name;
    const auto type = std::filesystem::status(path, ec).type();
    using std::filesystem::file_type;  // none: status() failed (the probe below speaks for it)
    if (type != file_type::not_found && type != file_type::regular && type != file_type::none)
      throw IoError(field, path + " exists and is not a regular file: the run could not write it");
  }
  std::string probe = dir + "/.meshcast-write-test-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) throw IoError(field, "cannot write in " + dir + ": " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

// Holds DIR/.lock (flock) for the run: a second run on the same --checkpoint-dir is refused
// before any work, where its saves removed the first's save in flight (a killed save's
// remains look the same) or interleaved two models' checkpoints. Taken by one process of a
// job (the local backend's, mpi's rank 0); released when the process ends.
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::string& dir) {
    const std::string path = dir + "/.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw IoError("checkpoint-dir", "cannot open " + path + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      ::close(fd_);
      if (e == EWOULDBLOCK)
        throw ValidationError("checkpoint-dir", dir + " is in use by another run (it holds " +
                                                    path + "); give another directory");
      throw IoError("checkpoint-dir", "cannot lock " + path + ": " + std::strerror(e));
    }
    // What makes this run's lock its own, for the ranks of a job to look for (same_directory).
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string token =
        std::string(host) + ' ' + std::to_string(::getpid()) + ' ' +
        std::to_string(std::chrono::system_clock::now().time_since_epoch().count()) + '\n';
    if (::ftruncate(fd_, 0) != 0 ||
        ::pwrite(fd_, token.data(), token.size(), 0) != static_cast<ssize_t>(token.size()) ||
        ::fsync(fd_) != 0) {
      const int e = errno;
      ::close(fd_);
      throw IoError("checkpoint-dir", "cannot write " + path + ": " + std::strerror(e));
    }
  }
  ~CheckpointLock() { ::close(fd_); }
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  int fd_ = -1;
};

// Refuses, on every rank, a --checkpoint-dir that is not one directory for all ranks of the
// job (node-local scratch on several hosts): each reads the lock rank 0 took and wrote, and all
// must read rank 0's words. Otherwise each rank would save its own part alone, and the save's
// checks fail only once the whole run has trained.
void same_directory(Bootstrap& boot, const std::string& dir) {
  std::string mine = "(none)";
  if (std::ifstream in(dir + "/.lock"); in) std::getline(in, mine);
  const auto all = boot.allgather(std::vector<unsigned char>(mine.begin(), mine.end()));
  std::string apart;
  int count = 0;
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0] && ++count <= 8) apart += (apart.empty() ? "" : ",") + std::to_string(r);
  if (count)
    throw ValidationError("checkpoint-dir",
                          dir + " is not the directory rank 0 locked on " +
                              (count > 1 ? "ranks " : "rank ") + apart +
                              (count > 8 ? " and " + std::to_string(count - 8) + " more" : "") +
                              ": give a directory that every rank shares");
}

// What identifies the model in its checkpoints' manifests: its kind and the options that decide
// its parameters' shapes (not the stages: a checkpoint reshards onto any).
nlohmann::json model_identity(const std::string& kind, const tr::ModelConfig& m) {
  return {{"model", kind},
          {"config",
           {{"vocab", m.vocab},
            {"seq", m.seq},
            {"d_model", m.d_model},
            {"heads", m.heads},
            {"layers", m.layers}}}};
}

// Refuses a checkpoint (at `path`, saved with `description`) of another model or configuration
// than `identity`, naming the field that differs.
void check_identity(const std::string& path, const std::string& description,
                    const nlohmann::json& identity) {
  // The manifest's checksum held, so the description is the JSON a run wrote.
  const auto saved = nlohmann::json::parse(description);
  const auto member = [](const nlohmann::json& j, const std::string& key) {
    return j.is_object() && j.contains(key) ? j[key] : nlohmann::json();
  };
  const auto text = [](const nlohmann::json& j) {
    return detail::quote(j.is_string() ? j.get<std::string>() : j.dump());
  };
  const auto expect = [&](const std::string& field, const std::string& key,
                          const nlohmann::json& got, const nlohmann::json& want) {
    if (got != want)
      throw ValidationError(field, path + " was saved with " + key + " " + text(got) +
                                       ", this run has " + text(want));
  };
  expect("checkpoint.model", "model", member(saved, "model"), identity["model"]);
  const nlohmann::json config = member(saved, "config");
  for (const auto& [key, value] : identity["config"].items())
    expect("checkpoint.config." + key, key, member(config, key), value);
}

// Refuses, before any work, a --checkpoint-dir whose checkpoints the run would harm: without
// --resume it would save over them; with it, it must be the same model and configuration (the
// load checks the checkpoint it takes again: an older one, where the newest's files are corrupt).
// Returns the checkpoint a --resume continues from (step -1: none).
tr::SavedCheckpoint check_checkpoints(const TrainArgs& a, const nlohmann::json& identity) {
  if (a.checkpoint_dir.empty()) return {};
  const tr::SavedCheckpoint saved = tr::find_checkpoint(a.checkpoint_dir);
  if (saved.step < 0) return saved;
  if (!a.resume)
    throw ValidationError("checkpoint-dir",
                          a.checkpoint_dir + " holds a checkpoint of step " +
                              std::to_string(saved.step) +
                              ": continue it with --resume, or give another directory");
  check_identity(saved.path, saved.description, identity);
  return saved;
}

// What a --resume says before it trains (device 0): why it starts afresh, or why it does not
// continue from what DIR/latest names or from a newer checkpoint.
void say_resume(const TrainArgs& a, const tr::SavedCheckpoint& saved) {
  if (!a.resume) return;
  if (saved.step < 0) {
    warn("--resume: " + a.checkpoint_dir + " holds no checkpoint; starting at step 0");
    return;
  }
  for (const std::string& why : saved.skipped) warn(why + "; passing over that checkpoint");
  if (!saved.fallback.empty())
    warn(saved.fallback + "; resuming from the newest checkpoint, " + saved.path);
}

std::string stages_text(const tr::ParallelConfig& p) {
  std::string out;
  for (const auto& s : p.stages) {
    if (!out.empty()) out += '/';
    out += tr::to_string(s);
  }
  return out;
}

std::string clock(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  std::ostringstream o;
  o << s / 60 << ':' << std::setw(2) << std::setfill('0') << s % 60;
  return o.str();
}

// One line per evaluation, or every step on a terminal a person watches (live_terminal), redrawn
// in place as a bar that fits the terminal's width.
class Progress {
 public:
  Progress(int steps, double tokens) : steps_(steps), tokens_(tokens), live_(live_terminal()) {}
  void update(const tr::StepStats& s, int first) {
    done_ += s.seconds;
    const int ran = s.step - first;
    const double eta = done_ / std::max(1, ran) * (steps_ - s.step);
    const auto fixed = [](double v, int digits) {
      std::ostringstream o;
      o << std::fixed << std::setprecision(digits) << v;
      return o.str();
    };
    // The fields in the order shown, each with its rank: a narrow terminal drops the
    // highest-ranked ones first.
    const std::vector<std::pair<std::string, int>> fields = {
        {"step " + std::to_string(s.step) + '/' + std::to_string(steps_), 0},
        {"loss " + fixed(s.loss, 4), 1},
        {s.eval_loss >= 0 ? "held-out " + fixed(s.eval_loss, 4) : "", 3},
        {fixed(tokens_ / s.seconds, 0) + " tokens/s", 4},
        {"ETA " + clock(eta), 2}};
    const auto line = [&](int most) {
      std::string text;
      for (const auto& [field, rank] : fields)
        if (!field.empty() && rank <= most) text += (text.empty() ? "" : "  ") + field;
      return text;
    };
    if (!live_) {
      if (s.eval_loss >= 0 || s.step == steps_) std::cout << line(4) << '\n' << std::flush;
      return;
    }
    // Never the last column (some terminals wrap there); the bar takes what the text leaves, at
    // most 24 columns.
    const auto columns = static_cast<std::size_t>(std::max(2, terminal_columns()) - 1);
    std::string text = line(4);
    for (int most = 3; most >= 0 && text.size() > columns; --most) text = line(most);
    text.resize(std::min(text.size(), columns));
    std::string bar;
    const std::size_t room = columns > text.size() + 3 ? columns - text.size() - 3 : 0;
    if (const std::size_t width = std::min<std::size_t>(24, room); width >= 5) {
      const auto filled =
          width * static_cast<std::size_t>(s.step) / static_cast<std::size_t>(steps_);
      bar = '[' + std::string(filled, '#') + std::string(width - filled, '.') + "] ";
    }
    std::cout << '\r' << bar << text << "\033[K" << std::flush;
    if (s.step == steps_) std::cout << '\n';
  }

 private:
  int steps_;
  double tokens_;
  bool live_;
  double done_ = 0;
};

// `path` made absolute; as given when it is empty or the working directory cannot be found
// (the report runs after training: it must not fail there).
std::string absolute_or_given(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.string();
}

// A resumed run's steps before the checkpoint, from the run JSON the earlier run left in --out,
// so that the charts and the JSON cover the whole run; none (with a warning) when that file is
// missing, of another model or configuration, of a run that saved into another checkpoint
// directory (another run's losses were spliced in), or ends before the checkpoint. Where the
// earlier steps ran with other `settings` (a learning rate changed on resuming, say), a warning
// says which: the run JSON records this run's.
std::vector<tr::StepStats> history(const std::string& path, const nlohmann::json& identity,
                                   const nlohmann::json& settings,
                                   const std::string& checkpoint_dir, std::int64_t resumed_from) {
  std::vector<tr::StepStats> steps;
  try {
    const nlohmann::json j =
        nlohmann::json::parse(read_input_file(path, "out", limits().input_file_bytes));
    if (!j.is_object() || j.value("model", "") != identity["model"] || !j.contains("config") ||
        !j["config"].is_object())
      throw std::runtime_error("it is of another model");
    for (const auto& [key, value] : identity["config"].items())
      if (j["config"].value(key, nlohmann::json()) != value)
        throw std::runtime_error("it was run with another " + key);
    const nlohmann::json saved_in = j["config"].value("checkpoint_dir", nlohmann::json());
    std::error_code ec;
    if (!saved_in.is_string() || saved_in.get<std::string>().empty() ||
        std::filesystem::weakly_canonical(saved_in.get<std::string>(), ec) !=
            std::filesystem::weakly_canonical(checkpoint_dir, ec))
      throw std::runtime_error("it saved no checkpoint into " + checkpoint_dir);
    for (const auto& e : j.at("steps")) {
      tr::StepStats st;
      st.step = e.at("step").get<int>();
      if (st.step > resumed_from) break;
      st.loss = e.at("loss").get<double>();
      st.eval_loss = e.at("eval_loss").is_null() ? -1 : e.at("eval_loss").get<double>();
      st.seconds = e.at("seconds").get<double>();
      st.compute = e.at("compute").get<double>();
      st.exposed_comm = e.at("exposed_comm").get<double>();
      st.bubble = e.at("bubble").get<double>();
      st.grad_norm = e.at("grad_norm").get<double>();
      steps.push_back(st);
    }
    if (steps.empty() || steps.back().step != resumed_from)
      throw std::runtime_error("its steps do not reach step " + std::to_string(resumed_from));
    std::string then, now;
    // (The default corpus is "" in a config: named as such.)
    const auto shown = [](const std::string& key, const nlohmann::json& v) {
      return key == "data" && v == "" ? std::string("the default corpus") : v.dump();
    };
    for (const auto& [key, value] : settings.items())
      if (const nlohmann::json was = j["config"].value(key, nlohmann::json()); was != value) {
        then += (then.empty() ? "" : ", ") + key + " " + shown(key, was);
        now += (now.empty() ? "" : ", ") + key + " " + shown(key, value);
      }
    // Its steps from the first it holds (a run that resumed with no history began later).
    const std::string range =
        std::to_string(steps.front().step) + "-" + std::to_string(resumed_from);
    if (steps.front().step > 1)
      warn(path + " holds steps " + range + " only: the charts start at step " +
           std::to_string(steps.front().step));
    if (!then.empty())
      warn(path + ": its steps " + range + " ran with " + then + " (this run: " + now +
           "); the run JSON's config is this run's");
  } catch (const std::exception& e) {
    warn(path + " holds no history of this run (" + one_line(e.what()) +
         "): the charts start at step " + std::to_string(resumed_from + 1));
    return {};
  }
  return steps;
}

// What the run JSON records of the outcome besides the steps.
struct Outcome {
  std::int64_t parameters = 0;
  double wall_seconds = 0;
};

// The loss curve, the step breakdown and the summary, into `out` (made writable before the run):
// `earlier` steps (a resumed run's history) and then this run's.
nlohmann::json report(const std::string& kind, const Run& r, const TrainArgs& a,
                      const nlohmann::json& identity, const std::vector<tr::StepStats>& earlier,
                      const tr::TrainResult& res, const Outcome& outcome) {
  const std::string& out = a.out;
  std::vector<tr::StepStats> all = earlier;
  all.insert(all.end(), res.steps.begin(), res.steps.end());
  tr::Series train{"train", {}, {}, tr::chart_color(0)},
      held{"held-out", {}, {}, tr::chart_color(1)};
  std::vector<std::string> steps;
  tr::Stack compute{"compute", tr::chart_color(0), {}},
      comm{"exposed communication", tr::chart_color(1), {}},
      bubble{"pipeline bubble", tr::chart_color(7), {}};
  nlohmann::json j;
  for (const auto& s : all) {
    train.x.push_back(s.step);
    train.y.push_back(s.loss);
    if (s.eval_loss >= 0) {
      held.x.push_back(s.step);
      held.y.push_back(s.eval_loss);
    }
    steps.push_back(std::to_string(s.step));
    compute.values.push_back(s.compute * 1e3);
    comm.values.push_back(s.exposed_comm * 1e3);
    bubble.values.push_back(s.bubble * 1e3);
    j["steps"].push_back(
        {{"step", s.step},
         {"loss", s.loss},
         {"eval_loss", s.eval_loss >= 0 ? nlohmann::json(s.eval_loss) : nlohmann::json(nullptr)},
         {"seconds", s.seconds},
         {"compute", s.compute},
         {"exposed_comm", s.exposed_comm},
         {"bubble", s.bubble},
         {"grad_norm", s.grad_norm}});
  }
  std::vector<tr::Series> curves{train, held};
  if (r.corpus) {
    const double h = r.corpus->unigram_entropy;
    curves.push_back(
        {"unigram entropy", {train.x.front(), train.x.back()}, {h, h}, tr::chart_color(2)});
  }
  const std::string base = out + "/" + kind;
  tr::write_png(base + "-loss.png",
                tr::line_chart(kind + ": loss per step (" + stages_text(r.parallel) + ", " +
                                   tr::to_string(r.parallel.schedule) + ")",
                               "step", "loss (nats/token)", curves),
                "out");
  tr::write_png(base + "-steps.png",
                tr::stacked_bars(kind + ": step time (ms)", "time per step (ms)", steps,
                                 {compute, comm, bubble}),
                "out");
  j["model"] = kind;
  j["stages"] = stages_text(r.parallel);
  j["devices"] = r.parallel.devices();
  j["schedule"] = tr::to_string(r.parallel.schedule);
  j["micro_batches"] = r.parallel.micro_batches;
  j["overlap"] = r.parallel.overlap;
  j["reshard"] = to_string(r.parallel.reshard);
  j["backend"] = a.backend;
  j["data"] = r.data;
  j["batch"] = r.train.batch;
  j["seq"] = r.model.seq;
  j["resumed_from"] = res.resumed_from;
  if (r.corpus) j["unigram_entropy"] = r.corpus->unigram_entropy;
  j["version"] = MESHCAST_VERSION;
  j["lr"] = real(a.lr, "lr", 0, 10);  // as given: the float the run used prints with noise
  j["seed"] = r.train.seed;
  j["parameters"] = outcome.parameters;
  j["steps_run"] = res.steps.size();
  j["final_loss"] = res.steps.back().loss;
  j["final_eval_loss"] = res.steps.back().eval_loss;
  j["wall_seconds"] = outcome.wall_seconds;
  // Every setting, as the options and --config name them, so that the run can be repeated.
  nlohmann::json config = identity["config"];
  config.update({{"stages", stages_text(r.parallel)},
                 {"chunks", r.parallel.chunks},
                 {"micro_batches", r.parallel.micro_batches},
                 {"schedule", tr::to_string(r.parallel.schedule)},
                 {"sub_batches", r.parallel.sub_batches},
                 {"overlap", r.parallel.overlap},
                 {"reshard", to_string(r.parallel.reshard)},
                 {"topology", a.topology},
                 {"batch", r.train.batch},
                 {"steps", r.train.steps},
                 {"lr", j["lr"]},
                 {"seed", r.train.seed},
                 {"eval_every", r.eval_every},
                 // Absolute: a resume from another working directory reads this history only
                 // where it saved into the same directory (history()).
                 {"checkpoint_dir", absolute_or_given(a.checkpoint_dir)},
                 {"checkpoint_every", r.checkpoint_every},
                 {"resume", a.resume},
                 {"out", a.out},
                 {"backend", a.backend}});
  if (kind == "gpt")
    config["data"] = a.data;
  else
    config["noise"] = real(a.noise, "noise", 0, 1);
  j["config"] = config;
  j["loss_png"] = base + "-loss.png";
  j["steps_png"] = base + "-steps.png";
  write_file(base + "-run.json", j.dump(1) + '\n', "out");
  return j;
}

// This machine's fp32 GEMM rate on the model's MLP shape (one thread), measured now, on at most
// 512 tokens x 1024 x 2048 (14 MB, a fifth of a second a product here): --plan trains nothing,
// and a large model's whole shape took gigabytes and minutes.
double measure_flops(const tr::ModelConfig& m, int batch) {
  tr::use_single_threaded_blas();
  const std::int64_t t = std::min<std::int64_t>(std::int64_t{batch} * m.seq, 512),
                     d = std::min(m.d_model, 1024), f = std::min(m.ffn_width(), 2048);
  std::vector<float> x(static_cast<std::size_t>(t * d), 0.5f),
      w(static_cast<std::size_t>(d * f), 0.25f), y(static_cast<std::size_t>(t * f));
  double flops = 0, seconds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (seconds < 0.2) {
    tr::gemm(false, false, t, f, d, 1, x.data(), w.data(), 0, y.data());
    flops += 2.0 * static_cast<double>(t * d * f);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return flops / seconds;
}

// `train --plan`: the configuration search, nothing trained.
int run_config_search(const TrainArgs& a, const Run& r) {
  const int devices = positive(a.devices, "devices", 1 << 20);
  const int top = positive(a.top, "top", 1000);
  const Topology topology = a.topology.empty() ? Topology::single_host() : r.topology;
  const tr::Machine machine{measure_flops(r.model, r.train.batch)};
  const auto best = tr::search_configurations(r.model, r.train, devices, topology, machine, top);
  if (a.json) {
    nlohmann::json j;
    j["devices"] = devices;
    j["gemm_flops_per_second"] = machine.flops;
    j["topology"] = topology.name();
    for (const auto& p : best)
      j["configurations"].push_back({{"stages", stages_text(p.parallel)},
                                     {"micro_batches", p.parallel.micro_batches},
                                     {"schedule", tr::to_string(p.parallel.schedule)},
                                     {"seconds", p.total},
                                     {"compute", p.compute},
                                     {"tensor_comm", p.tensor_comm},
                                     {"data_comm", p.data_comm},
                                     {"pipeline_comm", p.pipeline_comm},
                                     {"bubble", p.bubble}});
    std::cout << j.dump() << '\n';
    return 0;
  }
  std::cout << "top " << detail::counted(static_cast<std::int64_t>(best.size()), "configuration")
            << " of " << detail::counted(devices, "device") << " on " << topology.name()
            << " (GEMM rate measured: " << std::setprecision(3) << machine.flops / 1e9
            << " GFLOP/s; estimated step time, no overlap assumed):\n";
  for (const auto& p : best) std::cout << "  " << p.str() << '\n';
  return 0;
}

}  // namespace

void add_train_options(CLI::App& cmd, TrainArgs& a, const std::string& model) {
  // The keys this model takes: gpt reads --data, the U-Transformer --noise.
  std::string keys;
  for (const ConfigKey& k : kConfigKeys)
    if (std::string_view(k.key) != (model == "gpt" ? "noise" : "data"))
      keys += (keys.empty() ? "" : ", ") + std::string(k.key);
  cmd.add_option("--config", a.config,
                 "a JSON object whose keys (" + keys + ") set the options not given here")
      ->type_name("FILE");
  cmd.add_option("--stages", a.stages,
                 "pipeline stages separated by '/', each dp=N and tp=N (Megatron) or "
                 "grid=RxCxD (3D tensor parallelism), e.g. dp=2,tp=2/grid=2x1x2; stage s runs on "
                 "the next dp*R*C*D device ids")
      ->type_name("STAGES")
      ->capture_default_str();
  cmd.add_option("--chunks", a.chunks, "model pieces per stage (interleaved schedule)")
      ->type_name("INT")
      ->capture_default_str();
  cmd.add_option("--micro-batches", a.micro_batches, "micro-batches per step")
      ->type_name("INT")
      ->capture_default_str();
  cmd.add_option("--schedule", a.schedule, "gpipe, 1f1b, interleaved or eager-1f1b")
      ->type_name("NAME")
      ->capture_default_str();
  cmd.add_option("--sub-batches", a.sub_batches,
                 "split each linear's rows so that its collective overlaps the next slice")
      ->type_name("INT")
      ->capture_default_str();
  cmd.add_flag("--no-overlap", a.no_overlap,
               "wait on every collective and send as soon as it starts (to measure what overlap "
               "hides)");
  cmd.add_option("--reshard", a.reshard,
                 "strategy of the stage-boundary reshards: auto, broadcast, sendrecv, allgather")
      ->type_name("NAME")
      ->capture_default_str();
  cmd.add_option("--topology", a.topology, "topology: a JSON file or a preset name (dgx-a100, ...)")
      ->type_name("FILE|NAME");
  cmd.add_option("--vocab", a.vocab, "vocabulary size (text: 256 bytes)")
      ->type_name("INT")
      ->capture_default_str();
  cmd.add_option("--seq", a.seq, "tokens per sample")->type_name("INT")->capture_default_str();
  cmd.add_option("--d-model", a.d_model, "model width")->type_name("INT")->capture_default_str();
  cmd.add_option("--heads", a.heads, "attention heads")->type_name("INT")->capture_default_str();
  cmd.add_option("--layers", a.layers,
                 model == "gpt" ? "transformer blocks"
                                : "transformer blocks, even: half encoder, half decoder")
      ->type_name("INT")
      ->capture_default_str();
  cmd.add_option("--batch", a.batch, "samples per step")->type_name("INT")->capture_default_str();
  cmd.add_option("--steps", a.steps, "training steps (in all, counting resumed ones)")
      ->type_name("INT")
      ->capture_default_str();
  cmd.add_option("--lr", a.lr, "AdamW learning rate")->type_name("FLOAT")->capture_default_str();
  cmd.add_option("--seed", a.seed, "seed of the initial parameters and the data")
      ->type_name("INT")
      ->capture_default_str();
  if (model == "gpt")
    cmd.add_option("--data", a.data,
                   "a text file or a directory of them (default: /usr/share/common-licenses), "
                   "or 'random' for uniform tokens")
        ->type_name("PATH");
  else
    cmd.add_option("--noise", a.noise, "fraction of input tokens replaced by random ones")
        ->type_name("FLOAT")
        ->capture_default_str();
  cmd.add_option("--eval-every", a.eval_every,
                 "steps between held-out evaluations (0: a tenth of the steps)")
      ->type_name("INT")
      ->capture_default_str();
  cmd.add_option("--checkpoint-dir", a.checkpoint_dir,
                 "write sharded checkpoints here (atomically; the two newest are kept)")
      ->type_name("DIR");
  cmd.add_option("--checkpoint-every", a.checkpoint_every,
                 "steps between checkpoints (0: only at the end)")
      ->type_name("INT")
      ->capture_default_str();
  cmd.add_flag("--resume", a.resume,
               "continue from the newest checkpoint in --checkpoint-dir, resharding it onto "
               "these --stages if they differ from the run that saved it");
  cmd.add_option("--out", a.out, "directory for MODEL-loss.png, MODEL-steps.png and MODEL-run.json")
      ->type_name("DIR")
      ->capture_default_str();
  cmd.add_option("--backend", a.backend,
                 "local (threads) or mpi (one process per device, under mpirun)")
      ->type_name("NAME")
      ->capture_default_str();
  cmd.add_flag("--json", a.json,
               "print the run's JSON summary instead of progress (a checkpoint already at "
               "--steps: {model, steps_run: 0, resumed_from, steps})");
  cmd.add_flag("--plan", a.plan,
               "train nothing: estimate the step time of every parallel configuration of "
               "--devices devices on --topology by the analytic model (AxoNN style) and print "
               "the --top best with their step-time breakdown");
  cmd.add_option("--devices", a.devices, "devices to plan for (--plan)")
      ->type_name("INT")
      ->capture_default_str();
  cmd.add_option("--top", a.top, "configurations to print (--plan)")
      ->type_name("INT")
      ->capture_default_str();
}

// Flags of a run that --plan (which trains nothing) would drop, and flags only --plan reads:
// given on the wrong side they are refused, not ignored in silence.
constexpr std::array kTrainingOnly{"--stages",     "--chunks",         "--micro-batches",
                                   "--schedule",   "--sub-batches",    "--no-overlap",
                                   "--reshard",    "--steps",          "--lr",
                                   "--seed",       "--data",           "--noise",
                                   "--eval-every", "--checkpoint-dir", "--checkpoint-every",
                                   "--resume",     "--backend"};
constexpr std::array kPlanOnly{"--devices", "--top"};

int run_train(const TrainArgs& given, const std::string& kind, const CLI::App& cmd) {
  const auto refuse_given = [&](const auto& flags, const char* why) {
    for (const char* f : flags)
      if (cmd.get_option_no_throw(f) != nullptr && cmd.count(f) > 0)
        throw ValidationError(f + 2, why);
  };
  if (given.plan)
    refuse_given(kTrainingOnly, "--plan trains nothing, so it would ignore it; leave one out");
  else
    refuse_given(kPlanOnly, "only with --plan");
  // The backend comes from the command line or the config file. Under mpi, a rank that cannot
  // read its config reports it with the others (below) when the command line says mpi.
  TrainArgs a = given;
  std::exception_ptr unread;
  try {
    a = with_config(given, cmd);
  } catch (const std::exception&) {
    if (given.backend != "mpi") throw;
    unread = std::current_exception();
  }
  if (a.backend != "local" && a.backend != "mpi")
    throw ValidationError("backend", "expected local or mpi, got '" + a.backend + "'");
  check_backend(a.backend);
  std::optional<Run> run;
  nlohmann::json description;
  tr::SavedCheckpoint saved;
  // This process's checks of its input, before any work. Under mpi every rank runs them once
  // the job started and all fail alike when one does (checked_together): a rank that exited on
  // its own would leave the others waiting in MPI's start under srun.
  const auto prepare = [&] {
    if (unread) std::rethrow_exception(unread);
    run = parse(a, kind);
    // Set here, not in parse(): a pointer into the Run parse() returned dangled once moved.
    if (!a.topology.empty()) run->parallel.topology = &run->topology;
    if (a.plan) return;
    if (a.backend == "local" && run->parallel.devices() > 256)
      throw ValidationError("stages", "the local backend runs at most 256 device threads");
    check_train_memory(*run, a.backend, false);
    // The outputs, and what the checkpoint directory holds.
    require_writable_dir(a.out, "out",
                         {kind + "-run.json", kind + "-loss.png", kind + "-steps.png"});
    if (!a.checkpoint_dir.empty())
      require_writable_dir(a.checkpoint_dir, "checkpoint-dir", {"latest"});
    description = model_identity(kind, run->model);
    saved = check_checkpoints(a, description);
    if (saved.step >= 0) check_train_memory(*run, a.backend, true);  // and the load
    check_train_flops(*run,
                      static_cast<int>(std::clamp<std::int64_t>(saved.step, 0, run->train.steps)),
                      a.backend == "local");
    if (!run->batches) read_corpus(*run, a);
  };
  if (a.plan) {  // trains nothing: no backend
    prepare();
    return run_config_search(a, *run);
  }
  const std::string run_json = a.out + "/" + kind + "-run.json";
  tr::TrainResult result;
  std::vector<tr::StepStats> earlier;
  Outcome outcome;
  bool root = true;
  std::chrono::steady_clock::time_point t0;  // once the input is checked
  auto body = [&](Communicator& comm) {      // once prepare() ran
    const Run& r = *run;
    const bool me = comm.rank() == 0;
    const double tokens = static_cast<double>(r.train.batch) * r.model.seq;
    tr::RunOptions mine;
    mine.held_out = &r.held_out;
    mine.eval_every = r.eval_every;
    mine.checkpoint_dir = a.checkpoint_dir;
    mine.checkpoint_every = r.checkpoint_every;
    mine.resume = a.resume;
    nlohmann::json stated = description;
    stated["stages"] = stages_text(r.parallel);
    mine.description = stated.dump();
    mine.accept_checkpoint = [&](const std::string& path, const std::string& saved_with) {
      check_identity(path, saved_with, description);
    };
    std::optional<Progress> progress;
    if (me) say_resume(a, saved);
    if (me && !a.json && says(LogLevel::Info)) {
      progress.emplace(r.train.steps, tokens);
      std::cout << kind << ": " << detail::counted(r.parallel.devices(), "device") << " ("
                << stages_text(r.parallel) << "), " << tr::to_string(r.parallel.schedule) << " x"
                << r.parallel.micro_batches << ", on " << r.data << '\n';
      if (r.corpus)
        std::cout << "unigram entropy of the training text: " << std::fixed << std::setprecision(4)
                  << r.corpus->unigram_entropy << " nats/byte\n";
    }
    mine.on_resume = [&](std::int64_t step, const std::vector<std::string>& passed_over) {
      if (!me || step < 0) return;
      for (const std::string& why : passed_over) warn(why);
      if (says(LogLevel::Info) && !a.json)
        std::cout << "resuming at step " << step << " of " << r.train.steps
                  << " from the checkpoint in " << a.checkpoint_dir << '\n';
      // The steps before the checkpoint, for the charts and the JSON.
      if (step > 0) {
        // What shapes the loss curve beside the model: the steps before ran with their own.
        nlohmann::json settings{
            {"lr", real(a.lr, "lr", 0, 10)}, {"batch", r.train.batch}, {"seed", r.train.seed}};
        if (kind == "gpt")
          settings["data"] = a.data;
        else
          settings["noise"] = real(a.noise, "noise", 0, 1);
        earlier = history(run_json, description, settings, a.checkpoint_dir, step);
      }
    };
    int first = -1;
    mine.on_step = [&](const tr::StepStats& s) {
      if (first < 0) first = s.step - 1;
      if (progress) progress->update(s, first);
    };
    auto res = tr::train(comm, r.model, r.parallel, r.train, r.batches, mine);
    // Every element is reported by one device: their sum is the model's size.
    std::int64_t parameters = 0;
    for (const auto& part : res.parameters)
      parameters += static_cast<std::int64_t>(part.values.size());
    all_reduce(comm.world(), &parameters, &parameters, 1, DType::i64, ReduceOp::Sum);
    if (me) {
      result = std::move(res);
      outcome.parameters = parameters;
    }
  };
  std::optional<CheckpointLock> lock;
  const auto take_lock = [&] {
    if (!a.checkpoint_dir.empty()) lock.emplace(a.checkpoint_dir);
  };
  if (a.backend == "local") {
    prepare();
    take_lock();
    t0 = std::chrono::steady_clock::now();
    LocalWorld world(run->parallel.devices());
    world.run(body);
  }
#ifdef MESHCAST_HAS_MPI
  else {
    with_process_backend(a.backend, [&](ProcessSession& s) {
      checked_together(s.boot, [&] {
        prepare();
        require_ranks(s, run->parallel.devices(),
                      "the stages use " + std::to_string(run->parallel.devices()) + " devices",
                      true);
        if (s.boot.rank() == 0) take_lock();  // (its other ranks would hold it against it)
      });
      // A rank given other options, another config or other training text would hang or train
      // another model: refuse it first.
      const Run& r = *run;
      agree(s.boot, {{"model", kind},
                     {"stages", a.stages},
                     {"chunks", a.chunks},
                     {"micro-batches", a.micro_batches},
                     {"schedule", a.schedule},
                     {"sub-batches", a.sub_batches},
                     {"overlap", a.no_overlap ? "off" : "on"},
                     {"reshard", a.reshard},
                     {"topology", digest(r.topology.to_json())},
                     {"model dimensions", digest(description.dump())},
                     {"batch", a.batch},
                     {"steps", a.steps},
                     {"lr", a.lr},
                     {"seed", a.seed},
                     {"data", digest(r.data + a.noise + std::to_string(r.text_digest))},
                     {"eval-every", std::to_string(r.eval_every)},
                     {"checkpoint-dir", digest(a.checkpoint_dir)},
                     {"checkpoint-every", std::to_string(r.checkpoint_every)},
                     {"resume", a.resume ? "on" : "off"},
                     {"checkpoint", std::to_string(saved.step)}});
      if (!a.checkpoint_dir.empty()) same_directory(s.boot, a.checkpoint_dir);
      root = s.comm.rank() == 0;
      t0 = std::chrono::steady_clock::now();
      body(s.comm);
    });
  }
#endif
  if (!root) return 0;
  const Run& r = *run;
  outcome.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (result.steps.empty()) {
    if (a.json)  // still one JSON document
      std::cout << nlohmann::json{{"model", kind},
                                  {"steps_run", 0},
                                  {"resumed_from", result.resumed_from},
                                  {"steps", r.train.steps}}
                       .dump()
                << '\n';
    else
      std::cout << "nothing to do: the checkpoint is at step " << result.resumed_from << " of "
                << r.train.steps << '\n';
    return 0;
  }
  const nlohmann::json j = report(kind, r, a, description, earlier, result, outcome);
  if (a.json) {
    std::cout << j.dump() << '\n';
    return 0;
  }
  const auto& last = result.steps.back();
  if (result.resumed_from >= 0)
    std::cout << "resumed from the checkpoint of step " << result.resumed_from << '\n';
  std::cout << "final loss " << std::fixed << std::setprecision(4) << last.loss << ", held-out "
            << last.eval_loss;
  if (r.corpus) {
    // The unigram entropy is what a model that ignores context reaches.
    const double h = r.corpus->unigram_entropy, gap = 100 * (last.eval_loss / h - 1);
    std::cout << " (" << std::setprecision(0) << std::abs(gap) << "% "
              << (gap < 0 ? "below" : "above") << " the unigram entropy, " << std::setprecision(4)
              << h << ")";
  }
  std::cout << "\nwrote " << j["loss_png"].get<std::string>() << ", "
            << j["steps_png"].get<std::string>() << ", " << run_json << "; the run took "
            << human_seconds(outcome.wall_seconds) << '\n';
  return 0;
}

}  // namespace meshcast::cli
