// fp32 CPU kernels of the training engine, each a forward and a backward on row-major arrays.
// Pointers, not tensors, so that the engine can run them on slices (sub-batches, shards).
// Backward functions overwrite input gradients (dx) and accumulate parameter gradients
// (dw, db, dg, dtable: +=), so that micro-batches add up. Matrix products use OpenBLAS sgemm.
// Everything is deterministic: same inputs, same bits.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace meshcast::training {

// A dense fp32 row-major tensor: a shape and its values.
struct Tensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
  Tensor() = default;
  explicit Tensor(std::vector<std::int64_t> shape, float fill = 0.0f);
  std::int64_t numel() const { return static_cast<std::int64_t>(data.size()); }
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }
};

// Sums `count` floats across the devices that share a split dimension (in place). The split
// layernorm calls it (collectively: on every device of the split, the same number of times);
// a null function means "not split".
using AllReduceSum = std::function<void(float* data, std::int64_t count)>;

// C[m,n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; A is m x k after op, B k x n.
// Row-major, leading dimensions the natural ones.
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c);
// One OpenBLAS thread per process (the engine runs one thread per device); call once.
void use_single_threaded_blas();

// y[m,n] = x[m,k] w[k,n] + bias[n] (bias may be null). Weights are stored [in, out].
void linear_forward(const float* x, const float* w, const float* bias, float* y, std::int64_t m,
                    std::int64_t k, std::int64_t n);
// dx[m,k] = dy w^T (overwrites).
void linear_backward_input(const float* dy, const float* w, float* dx, std::int64_t m,
                           std::int64_t k, std::int64_t n);
// dw[k,n] += x^T dy; dbias[n] += column sums of dy (dbias may be null).
void linear_backward_weight(const float* x, const float* dy, float* dw, float* dbias,
                            std::int64_t m, std::int64_t k, std::int64_t n);

// Layer normalisation of each of m rows. The row's n_total features may be split across
// devices: this device holds n of them (x, gamma, beta, y: [m,n] / [n]) and `reduce` sums
// per-row partial statistics across the devices of the split (null when n == n_total).
// Saves mean[m] and rstd[m] for the backward. y = (x - mean) * rstd * gamma + beta.
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, std::int64_t m, std::int64_t n, std::int64_t n_total,
                       const AllReduceSum& reduce = {}, float eps = 1e-5f);
// dx overwritten; dgamma, dbeta accumulated (over this device's n features).
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, std::int64_t m,
                        std::int64_t n, std::int64_t n_total, const AllReduceSum& reduce = {});

// GELU, tanh approximation, elementwise on n values.
void gelu_forward(const float* x, float* y, std::int64_t n);
void gelu_backward(const float* dy, const float* x, float* dx, std::int64_t n);

// Multi-head self-attention (causal: a token sees itself and the tokens before it; else every
// token of its sequence) on b sequences of s tokens and h heads of width dh.
// qkv[b,s,h,3,dh] (for each head its q, k and v side by side, so that a column block of whole
// heads is self-contained); out[b,s,h,dh]; probs[b,h,s,s] saved for the backward (the masked
// positions are 0). Scores are scaled by 1/sqrt(dh).
void attention_forward(const float* qkv, float* out, float* probs, std::int64_t b, std::int64_t s,
                       std::int64_t h, std::int64_t dh, bool causal = true);
// dqkv overwritten.
void attention_backward(const float* dout, const float* qkv, const float* probs, float* dqkv,
                        std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t dh,
                        bool causal = true);

// Token plus learned position embedding: y[b*s, d] = table[tokens[i], :] + pos[i % s, :].
void embedding_forward(const std::int32_t* tokens, const float* table, const float* pos, float* y,
                       std::int64_t b, std::int64_t s, std::int64_t d);
// dtable[tokens[i], :] += dy[i, :]; dpos[i % s, :] += dy[i, :] (either may be null).
void embedding_backward(const std::int32_t* tokens, const float* dy, float* dtable, float* dpos,
                        std::int64_t b, std::int64_t s, std::int64_t d);

// Softmax cross-entropy of m rows of v logits against targets[m]. Writes probs[m,v] (kept for
// the backward) and returns the SUM over rows of -log p(target) (callers divide by the global
// token count, so that shards and micro-batches add up to the mean).
double cross_entropy_forward(const float* logits, const std::int32_t* targets, float* probs,
                             std::int64_t m, std::int64_t v);
// dlogits[m,v] = (probs - onehot(targets)) * scale (overwrites).
void cross_entropy_backward(const float* probs, const std::int32_t* targets, float* dlogits,
                            std::int64_t m, std::int64_t v, float scale);

// y[i] += x[i] (residual connections, gradient accumulation).
void add_into(const float* x, float* y, std::int64_t n);
// Sum of squares (double accumulation), for the global gradient norm.
double sum_of_squares(const float* x, std::int64_t n);
void scale(float* x, std::int64_t n, float factor);

// AdamW (decoupled weight decay), one step `t` (1-based) over n parameters.
struct AdamW {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  void step(float* param, const float* grad, float* m, float* v, std::int64_t n,
            std::int64_t t) const;
};
// The factor that clips a gradient of global norm sqrt(sum_sq) to max_norm (1 when within).
float clip_factor(double sum_sq, float max_norm);

// Deterministic random numbers: the same seed gives the same stream on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed);
  std::uint64_t next();  // splitmix64
  float uniform();       // [0, 1)
  float normal();        // Box-Muller
 private:
  std::uint64_t state_;
};
// n values drawn N(0, std^2) from a stream seeded by (seed, name): a parameter's values do
// not depend on how many other parameters exist or on the device that draws them.
void fill_normal(float* x, std::int64_t n, float std, std::uint64_t seed, std::string_view name);

}  // namespace meshcast::training
