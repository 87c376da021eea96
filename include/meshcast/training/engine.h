// The 3D-parallel training engine: a GPT-style decoder (token and position embedding, pre-norm
// transformer blocks, final layernorm, language-model head, cross-entropy) trained with data,
// tensor and pipeline parallelism at once, on any Communicator backend.
//
// Devices: pipeline stage s runs on its own mesh (consecutive device ids, stage 0 first) of
// shape dp x R x C x D: dp data-parallel replicas, each a tensor-parallel grid of R rows, C
// columns and D depth. Megatron tensor parallelism of degree t is the grid (1, t, 1); AxoNN's 3D
// tensor parallelism is any (R, C, D). Stages may differ in shape: the activations that cross
// from one to the next (and along skip connections) are moved by meshcast reshard plans,
// planned once and reused every step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "meshcast/box.h"
#include "meshcast/communicator.h"
#include "meshcast/plan.h"
#include "meshcast/topology.h"
#include "meshcast/training/schedule.h"

namespace meshcast::training {

// What happens to a block's output sequence (after any skip connection leaves it): a U-shaped
// model halves it on the way down (the mean of each pair of tokens) and doubles it on the way
// up (each token repeated).
enum class Resample { None, Halve, Double };

struct ModelConfig {
  int vocab = 256;
  int seq = 16;      // tokens per sample
  int d_model = 32;  // width
  int heads = 4;
  int layers = 4;
  int ffn = 0;  // MLP width; 0: 4 * d_model
  // Long skip connections (U-Net style): the output of block `first` is added to the input of
  // block `second` (second > first + 1); the gradient flows back the same way.
  std::vector<std::pair<int, int>> skips;
  std::vector<Resample> resample;  // per block; empty: none
  bool causal = true;              // attention sees only earlier tokens (a decoder)
  float init_std = 0.02f;
  int ffn_width() const { return ffn > 0 ? ffn : 4 * d_model; }
  // Tokens in the input of block `layer` (layers: after the last block).
  int seq_at(int layer) const;
};

// Makes `m` a U-Transformer: bidirectional attention; its first layers/2 blocks (the encoder)
// halve the sequence after each but the last, the decoder doubles it after each but the last,
// and encoder block i's output is added to decoder block layers-1-i's input. Needs an even
// number of layers and seq divisible by 2^(layers/2 - 1).
void make_u_shaped(ModelConfig& m);

// One pipeline stage's mesh: dp replicas of an R x C x D tensor-parallel grid.
struct StageShape {
  int dp = 1;
  int rows = 1;   // R: splits the input features of the first linear of a pair
  int cols = 1;   // C: splits attention heads and the MLP's hidden features
  int depth = 1;  // D: shards the weights (all-gathered before use) and splits the samples
  int devices() const { return dp * rows * cols * depth; }
  friend bool operator==(const StageShape&, const StageShape&) = default;
};
// "dp=2,tp=2" (Megatron), "dp=1,grid=2x2x2" (3D: R x C x D); fields may be omitted.
StageShape parse_stage_shape(const std::string& text, const std::string& field = "stage");
std::string to_string(const StageShape& s);

struct ParallelConfig {
  std::vector<StageShape> stages{StageShape{}};  // pipeline stages, in order
  int chunks = 1;                                // model pieces per stage (interleaved 1F1B)
  int micro_batches = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  // Start collectives and transfers and wait on them as late as possible (off: wait on each as
  // soon as it starts, to measure what the overlap hides).
  bool overlap = true;
  int sub_batches = 1;  // over-decomposition of each linear's rows so that collectives overlap
  std::int64_t bucket_bytes = std::int64_t{1} << 20;  // data-parallel gradient buckets
  Strategy reshard = Strategy::Auto;
  const Topology* topology = nullptr;  // for the reshard plans and hierarchical collectives
  int devices() const;
};

struct TrainConfig {
  int batch = 8;  // samples per step (split into micro-batches, then over data parallelism)
  int steps = 3;
  std::uint64_t seed = 1;
  float lr = 1e-3f;
  float weight_decay = 0.01f;
  float clip = 1.0f;  // global gradient-norm clip; <= 0: none
};

// A step's samples: inputs[batch * seq] and the token to predict at each position,
// targets[batch * seq] (a decoder's next tokens; a denoiser's clean ones).
struct Batch {
  std::vector<std::int32_t> inputs, targets;
};
// Fills a step's batch. Called on every device with the same arguments; must give the same
// tokens there.
using BatchSource = std::function<void(int step, Batch& batch)>;
// Random tokens drawn from `seed`, targets the next token (the engine's tests and benchmarks).
BatchSource random_batches(const ModelConfig& model, int batch, std::uint64_t seed);

struct StepStats {
  int step = 0;             // 1-based
  double loss = 0;          // mean cross-entropy over the step's tokens (every device has it)
  double eval_loss = -1;    // on a held-out batch after the step; -1 when not evaluated
  double seconds = 0;       // wall time of the step on this device
  double compute = 0;       // in kernels
  double exposed_comm = 0;  // blocked on collectives and on sends still in flight at the end
  double bubble = 0;        // blocked waiting for a pipeline neighbour's activation/gradient,
                            // or for the other stages to finish the step (the drain)
  double grad_norm = 0;     // before clipping
  // The linears' matrix products on this device: operations and seconds (their rate is the
  // device's GEMM throughput inside training).
  double gemm_flops = 0, gemm_seconds = 0;
};

// A part of a parameter held by this device: the block `box` of the full tensor `name` (shape
// `shape`), of which `values` are the row-major elements from `offset` on (a depth shard).
// Only one device reports each element (replicas skip it), so the parts tile every tensor.
struct ParameterPart {
  std::string name;
  std::vector<std::int64_t> shape;
  Box box;
  std::int64_t offset = 0;
  std::vector<float> values;
};

struct TrainResult {
  std::vector<StepStats> steps;           // the steps this call ran
  std::vector<ParameterPart> parameters;  // after the last step
  std::int64_t resumed_from = -1;         // the checkpoint's step, -1 when it started afresh
};

// What a run does besides training.
struct RunOptions {
  const BatchSource* held_out = nullptr;  // evaluated every eval_every steps and after the last
  int eval_every = 0;
  std::string checkpoint_dir;  // empty: no checkpoints (docs/training-design.md has the format)
  int checkpoint_every = 0;    // steps between checkpoints; 0: only after the last step
  bool resume = false;         // start from checkpoint_dir's newest checkpoint, if any; the
                               // parallel configuration may differ from the one that saved it
  std::string description;     // JSON text stored in each checkpoint's manifest
  std::function<void(const StepStats&)> on_step;  // after every step, on every device
  // With resume, after the load, on every device: the step resumed from (-1: none found) and
  // the newer checkpoints found corrupt and passed over (LoadStats::passed_over).
  std::function<void(std::int64_t step, const std::vector<std::string>& passed_over)> on_resume;
  // With resume, on every device: checks the checkpoint chosen (its path and description) before
  // it loads; what it throws refuses the resume on every device.
  std::function<void(const std::string& path, const std::string& description)> accept_checkpoint;
};

// Trains on this device (comm.rank() is its device id) as one of parallel.devices() devices;
// devices beyond them make the run's groups with the others (Communicator::group) and return.
// Every device of `comm` calls it with the same arguments. Throws
// ValidationError naming the field for a configuration that does not fit the model, CommError
// when a peer fails, InternalError("loss") on every device at a step whose loss or gradient norm
// is not finite (before its update and any save).
// Steps run from the resumed checkpoint's step (or 0) to train.steps.
TrainResult train(Communicator& comm, const ModelConfig& model, const ParallelConfig& parallel,
                  const TrainConfig& train, const BatchSource& batches, const RunOptions& run = {});

// Checks the configuration against the model without running anything (what train() refuses).
void validate(const ModelConfig& model, const ParallelConfig& parallel, const TrainConfig& train);

}  // namespace meshcast::training
