#include "training/ops.h"

// Complex types as structs, not C99 _Complex (which clang -Wpedantic rejects in C++); only
// sgemm is used.
#define FORCE_OPENBLAS_COMPLEX_STRUCT
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>

#include "meshcast/error.h"

namespace meshcast::training {

namespace {

// OpenBLAS takes 32-bit dimensions; a silent narrowing would compute on the wrong shape.
blasint blas_dim(std::int64_t d) {
  if (d < 0 || d > INT_MAX)
    throw ValidationError("shape", "dimension " + std::to_string(d) + " outside BLAS range");
  return static_cast<blasint>(d);
}

void check_targets(const std::int32_t* targets, std::int64_t m, std::int64_t v) {
  for (std::int64_t i = 0; i < m; ++i)
    if (targets[i] < 0 || targets[i] >= v)
      throw ValidationError("targets", "target " + std::to_string(targets[i]) + " at row " +
                                           std::to_string(i) + " outside [0, " + std::to_string(v) +
                                           ")");
}

}  // namespace

Tensor::Tensor(std::vector<std::int64_t> dims, float fill) : shape(std::move(dims)) {
  std::int64_t count = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw ValidationError("shape", "negative dimension " + std::to_string(d));
    count *= d;
  }
  data.assign(static_cast<std::size_t>(count), fill);
}

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  // Leading dimensions are the stored row lengths; BLAS rejects 0 even for empty operands.
  const blasint lda = std::max<blasint>(1, blas_dim(trans_a ? m : k));
  const blasint ldb = std::max<blasint>(1, blas_dim(trans_b ? k : n));
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, blas_dim(m), blas_dim(n), blas_dim(k), alpha, a,
              lda, b, ldb, beta, c, blas_dim(n));
}

void use_single_threaded_blas() { openblas_set_num_threads(1); }

void linear_forward(const float* x, const float* w, const float* bias, float* y, std::int64_t m,
                    std::int64_t k, std::int64_t n) {
  if (bias != nullptr)
    for (std::int64_t i = 0; i < m; ++i) std::memcpy(y + i * n, bias, sizeof(float) * n);
  gemm(false, false, m, n, k, 1.0f, x, w, bias != nullptr ? 1.0f : 0.0f, y);
}

void linear_backward_input(const float* dy, const float* w, float* dx, std::int64_t m,
                           std::int64_t k, std::int64_t n) {
  gemm(false, true, m, k, n, 1.0f, dy, w, 0.0f, dx);
}

void linear_backward_weight(const float* x, const float* dy, float* dw, float* dbias,
                            std::int64_t m, std::int64_t k, std::int64_t n) {
  gemm(true, false, k, n, m, 1.0f, x, dy, 1.0f, dw);
  if (dbias == nullptr) return;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) dbias[j] += dy[i * n + j];
}

void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, std::int64_t m, std::int64_t n, std::int64_t n_total,
                       const AllReduceSum& reduce, float eps) {
  // Two passes (sum, then squared deviations from the global mean) rather than E[x^2]-E[x]^2,
  // which cancels badly in fp32. mean[] and rstd[] carry the partial sums through `reduce`.
  for (std::int64_t i = 0; i < m; ++i) {
    double sum = 0.0;
    for (std::int64_t j = 0; j < n; ++j) sum += x[i * n + j];
    mean[i] = static_cast<float>(sum);
  }
  if (reduce) reduce(mean, m);
  for (std::int64_t i = 0; i < m; ++i) {
    mean[i] = static_cast<float>(static_cast<double>(mean[i]) / n_total);
    double sum = 0.0;
    for (std::int64_t j = 0; j < n; ++j) {
      const double d = x[i * n + j] - mean[i];
      sum += d * d;
    }
    rstd[i] = static_cast<float>(sum);
  }
  if (reduce) reduce(rstd, m);
  for (std::int64_t i = 0; i < m; ++i) {
    const double var = static_cast<double>(rstd[i]) / n_total;
    rstd[i] = static_cast<float>(1.0 / std::sqrt(var + eps));
    for (std::int64_t j = 0; j < n; ++j)
      y[i * n + j] = (x[i * n + j] - mean[i]) * rstd[i] * gamma[j] + beta[j];
  }
}

void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, std::int64_t m,
                        std::int64_t n, std::int64_t n_total, const AllReduceSum& reduce) {
  // sums[i] = sum_j g*dy, sums[m + i] = sum_j g*dy*xhat: one reduction for both.
  std::vector<float> sums(static_cast<std::size_t>(2 * m));
  for (std::int64_t i = 0; i < m; ++i) {
    double s1 = 0.0, s2 = 0.0;
    for (std::int64_t j = 0; j < n; ++j) {
      const double xhat = (x[i * n + j] - mean[i]) * rstd[i];
      const double gdy = static_cast<double>(gamma[j]) * dy[i * n + j];
      s1 += gdy;
      s2 += gdy * xhat;
    }
    sums[i] = static_cast<float>(s1);
    sums[m + i] = static_cast<float>(s2);
  }
  if (reduce) reduce(sums.data(), 2 * m);
  for (std::int64_t i = 0; i < m; ++i) {
    const float mean_gdy = static_cast<float>(static_cast<double>(sums[i]) / n_total);
    const float mean_gdy_xhat = static_cast<float>(static_cast<double>(sums[m + i]) / n_total);
    for (std::int64_t j = 0; j < n; ++j) {
      const float xhat = (x[i * n + j] - mean[i]) * rstd[i];
      const float g = dy[i * n + j];
      dx[i * n + j] = rstd[i] * (gamma[j] * g - mean_gdy - xhat * mean_gdy_xhat);
      dgamma[j] += g * xhat;
      dbeta[j] += g;
    }
  }
}

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

void gelu_forward(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(kGeluC * (v + kGeluA * v * v * v)));
  }
}

void gelu_backward(const float* dy, const float* x, float* dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::tanh(kGeluC * (v + kGeluA * v * v * v));
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

void attention_forward(const float* qkv, float* out, float* probs, std::int64_t b, std::int64_t s,
                       std::int64_t h, std::int64_t dh, bool causal) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const std::int64_t row = h * 3 * dh;  // qkv stride between tokens
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t hd = 0; hd < h; ++hd) {
      const float* base = qkv + bi * s * row + hd * 3 * dh;
      float* p_head = probs + (bi * h + hd) * s * s;
      for (std::int64_t t = 0; t < s; ++t) {
        const std::int64_t end = causal ? t + 1 : s;  // keys this query sees
        const float* q = base + t * row;
        float* p = p_head + t * s;
        float mx = -INFINITY;
        for (std::int64_t j = 0; j < end; ++j) {
          const float* kj = base + j * row + dh;
          float dot = 0.0f;
          for (std::int64_t c = 0; c < dh; ++c) dot += q[c] * kj[c];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        float sum = 0.0f;
        for (std::int64_t j = 0; j < end; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        for (std::int64_t j = 0; j < end; ++j) p[j] /= sum;
        std::fill(p + end, p + s, 0.0f);
        float* o = out + ((bi * s + t) * h + hd) * dh;
        std::fill(o, o + dh, 0.0f);
        for (std::int64_t j = 0; j < end; ++j) {
          const float* vj = base + j * row + 2 * dh;
          for (std::int64_t c = 0; c < dh; ++c) o[c] += p[j] * vj[c];
        }
      }
    }
}

void attention_backward(const float* dout, const float* qkv, const float* probs, float* dqkv,
                        std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t dh,
                        bool causal) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const std::int64_t row = h * 3 * dh;
  std::fill(dqkv, dqkv + b * s * row, 0.0f);
  std::vector<float> ds(static_cast<std::size_t>(s));  // gradient of one query's scores
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t hd = 0; hd < h; ++hd) {
      const float* base = qkv + bi * s * row + hd * 3 * dh;
      float* dbase = dqkv + bi * s * row + hd * 3 * dh;
      const float* p_head = probs + (bi * h + hd) * s * s;
      for (std::int64_t t = 0; t < s; ++t) {
        const std::int64_t end = causal ? t + 1 : s;
        const float* p = p_head + t * s;
        const float* dout_t = dout + ((bi * s + t) * h + hd) * dh;
        // dP[j] = dout . v_j; dv_j += P[j] dout; softmax: dS[j] = P[j] (dP[j] - sum P dP).
        float p_dp = 0.0f;
        for (std::int64_t j = 0; j < end; ++j) {
          const float* vj = base + j * row + 2 * dh;
          float* dvj = dbase + j * row + 2 * dh;
          float dp = 0.0f;
          for (std::int64_t c = 0; c < dh; ++c) {
            dp += dout_t[c] * vj[c];
            dvj[c] += p[j] * dout_t[c];
          }
          ds[j] = dp;
          p_dp += p[j] * dp;
        }
        const float* q = base + t * row;
        float* dq = dbase + t * row;
        for (std::int64_t j = 0; j < end; ++j) {
          const float g = p[j] * (ds[j] - p_dp) * scale;
          const float* kj = base + j * row + dh;
          float* dkj = dbase + j * row + dh;
          for (std::int64_t c = 0; c < dh; ++c) {
            dq[c] += g * kj[c];
            dkj[c] += g * q[c];
          }
        }
      }
    }
}

void embedding_forward(const std::int32_t* tokens, const float* table, const float* pos, float* y,
                       std::int64_t b, std::int64_t s, std::int64_t d) {
  for (std::int64_t i = 0; i < b * s; ++i) {
    const float* e = table + static_cast<std::int64_t>(tokens[i]) * d;
    const float* p = pos + (i % s) * d;
    for (std::int64_t c = 0; c < d; ++c) y[i * d + c] = e[c] + p[c];
  }
}

void embedding_backward(const std::int32_t* tokens, const float* dy, float* dtable, float* dpos,
                        std::int64_t b, std::int64_t s, std::int64_t d) {
  for (std::int64_t i = 0; i < b * s; ++i) {
    if (dtable != nullptr)
      add_into(dy + i * d, dtable + static_cast<std::int64_t>(tokens[i]) * d, d);
    if (dpos != nullptr) add_into(dy + i * d, dpos + (i % s) * d, d);
  }
}

double cross_entropy_forward(const float* logits, const std::int32_t* targets, float* probs,
                             std::int64_t m, std::int64_t v) {
  check_targets(targets, m, v);
  double loss = 0.0;
  for (std::int64_t i = 0; i < m; ++i) {
    const float* z = logits + i * v;
    float* p = probs + i * v;
    const float mx = *std::max_element(z, z + v);
    double sum = 0.0;
    for (std::int64_t j = 0; j < v; ++j) {
      p[j] = std::exp(z[j] - mx);
      sum += p[j];
    }
    for (std::int64_t j = 0; j < v; ++j) p[j] = static_cast<float>(p[j] / sum);
    // -log p[t] from the log-sum-exp, not from the rounded probability.
    loss += std::log(sum) - (static_cast<double>(z[targets[i]]) - mx);
  }
  return loss;
}

void cross_entropy_backward(const float* probs, const std::int32_t* targets, float* dlogits,
                            std::int64_t m, std::int64_t v, float scale) {
  check_targets(targets, m, v);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < v; ++j)
      dlogits[i * v + j] = (probs[i * v + j] - (j == targets[i] ? 1.0f : 0.0f)) * scale;
}

void add_into(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += x[i];
}

double sum_of_squares(const float* x, std::int64_t n) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

void scale(float* x, std::int64_t n, float factor) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= factor;
}

void AdamW::step(float* param, const float* grad, float* m, float* v, std::int64_t n,
                 std::int64_t t) const {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
  for (std::int64_t i = 0; i < n; ++i) {
    m[i] = beta1 * m[i] + (1.0f - beta1) * grad[i];
    v[i] = beta2 * v[i] + (1.0f - beta2) * grad[i] * grad[i];
    const float mhat = m[i] / bc1;
    const float vhat = v[i] / bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
  }
}

float clip_factor(double sum_sq, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double norm = std::sqrt(sum_sq);
  return norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

Rng::Rng(std::uint64_t seed) : state_(seed) {}

std::uint64_t Rng::next() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float Rng::uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }

float Rng::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]: log(u1) is finite
  const double u2 = uniform();
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

void fill_normal(float* x, std::int64_t n, float std, std::uint64_t seed, std::string_view name) {
  // FNV-1a, not std::hash: the stream must not depend on the standard library.
  std::uint64_t hash = 0xCBF29CE484222325ull;
  for (char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  Rng rng(seed ^ hash);
  for (std::int64_t i = 0; i < n; ++i) x[i] = std * rng.normal();
}

}  // namespace meshcast::training
