// The model's layers on a tensor-parallel grid: a linear whose input features are split over
// one grid axis and output features over the other (so consecutive linears alternate and one's
// output layout is the next one's input layout), the transformer block built from such pairs,
// the embedding and the language-model head.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "meshcast/collectives.h"
#include "training/parameters.h"

namespace meshcast::training {

// What the layers need from the engine: this device's groups, and counters of the seconds spent
// blocked on collectives.
struct Exec {
  const PlaceGroups& groups;
  CollectiveOptions options;
  bool overlap = true;
  int sub_batches = 1;
  double blocked = 0;  // seconds waiting on collectives
  // The linears' matrix products: floating-point operations and seconds (the GEMM rate).
  double gemm_flops = 0, gemm_seconds = 0;
  // Runs a product of `flops` operations, timed.
  // Moves the engine's transfers and gradient synchronisation on; run after every product, as
  // progress happens only when some call tests it.
  std::function<void()> poll = nullptr;
  template <class F>
  void gemm(double flops, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    gemm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gemm_flops += flops;
    if (poll) poll();
  }
  // The devices that split a grid axis with this one (Rows: the row group); null for None or
  // when this device is alone along it.
  const Group* along(Split axis) const;
  // Sums `n` floats over `group` (blocking); nothing when the group is this device alone.
  void all_reduce(const Group* group, float* data, std::int64_t n);
  void wait(Collective& c);
  // Layernorm's reduction over the devices that split the features (null when none do).
  AllReduceSum feature_sum();
};

// y[T, out] = x[T, in] W + b with W's rows split over one axis, its columns over the other:
// the partial products are summed along `forward_sum` (the axis splitting `in`), and in the
// backward the input gradient along `backward_sum` (the axis splitting `out`).
struct Linear {
  Param* w = nullptr;
  Param* b = nullptr;  // may be null
  Split forward_sum = Split::None;
  Split backward_sum = Split::None;
  std::int64_t in = 0, out = 0;  // local extents

  void forward(Exec& e, const float* x, float* y, std::int64_t rows) const;
  // dx (may be null: not needed) = dy W^T summed over backward_sum, overlapped with the weight
  // gradient; dW += x^T dy, db += column sums of dy.
  void backward(Exec& e, const float* x, const float* dy, float* dx, std::int64_t rows) const;
};

// A pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(.)). Features of x are split
// over the grid's rows, attention heads and MLP hidden features over its columns.
struct Block {
  Param *ln1_g, *ln1_b, *ln2_g, *ln2_b;
  Linear qkv, proj, fc1, fc2;
  std::int64_t width = 0;       // d_model (all features)
  std::int64_t heads = 0;       // local heads
  std::int64_t head_width = 0;  // d_model / heads
  bool causal = true;
  struct Saved {
    std::vector<float> x, y1, mean1, rstd1, qkv, probs, att, x2, y2, mean2, rstd2, h, g;
  };
  static Block make(Parameters& params, const Place& place, const ModelConfig& model, int index);
  void forward(Exec& e, const float* x, float* out, std::int64_t samples, std::int64_t seq,
               Saved& s) const;
  void backward(Exec& e, const Saved& s, const float* dout, float* dx, std::int64_t samples,
                std::int64_t seq) const;
};

struct Embedding {
  Param *table, *pos;
  std::int64_t width = 0;  // local features
  static Embedding make(Parameters& params, const Place& place, const ModelConfig& model);
};

// Final layernorm, the vocabulary projection and the cross-entropy loss.
struct Head {
  Param *ln_g, *ln_b;
  Linear out;
  std::int64_t width = 0, vocab = 0;
  struct Saved {
    std::vector<float> x, y, mean, rstd, probs;
  };
  static Head make(Parameters& params, const Place& place, const ModelConfig& model);
  // Returns the summed loss of these rows; keeps what the backward needs.
  double forward(Exec& e, const float* x, const std::int32_t* targets, std::int64_t rows,
                 Saved& s) const;
  // dx of the mean loss over `total_tokens` tokens.
  void backward(Exec& e, const Saved& s, const std::int32_t* targets, float* dx, std::int64_t rows,
                std::int64_t total_tokens) const;
};

}  // namespace meshcast::training
