// Laws of the fp32 training kernels: each backward equals central finite differences of its
// forward, each forward equals a naive double-precision reference, a split layernorm equals the
// unsplit one, and every kernel gives the same bits twice.
#include "training/ops.h"

#include <gtest/gtest.h>

#include <array>
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <thread>
#include <vector>

#include "meshcast/error.h"

namespace {

using meshcast::ValidationError;
using namespace meshcast::training;
using Vec = std::vector<float>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Uniform in [lo, hi), from the generator's raw bits (portable across standard libraries).
Vec random_vec(std::mt19937& g, std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  Vec v(n);
  for (float& x : v) x = lo + (hi - lo) * static_cast<float>(g() >> 8) * 0x1.0p-24f;
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

Vec minus(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// Compares analytic[i] with the central difference of loss() in x[i], for every i. The step is
// large for fp32 (the rounding of the loss divided by the step dominates otherwise); truncation
// error is O(step^2), well inside the tolerance, while a wrong term is O(gradient).
void expect_gradient(const char* what, Vec& x, const Vec& analytic,
                     const std::function<double()>& loss) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  constexpr float kStep = 1e-2f;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + kStep;
    const double up = loss();
    const double hi = x[i];
    x[i] = saved - kStep;
    const double down = loss();
    const double lo = x[i];
    x[i] = saved;
    const double numeric = (up - down) / (hi - lo);
    EXPECT_NEAR(analytic[i], numeric, 1e-3 + 2e-2 * std::abs(numeric)) << what << "[" << i << "]";
  }
}

void expect_near_all(const Vec& actual, const Vec& expected, double tol, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i)
    EXPECT_NEAR(actual[i], expected[i], tol) << what << "[" << i << "]";
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

// Columns [lo, hi) of a row-major [m, n] matrix, and the inverse placement.
Vec columns(const Vec& a, std::int64_t m, std::int64_t n, std::int64_t lo, std::int64_t hi) {
  Vec out;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = lo; j < hi; ++j) out.push_back(a[i * n + j]);
  return out;
}

TEST(Ops, TensorShape) {
  const Tensor t({2, 3}, 1.5f);
  EXPECT_EQ(t.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(t.numel(), 6);
  for (float x : t.data) EXPECT_EQ(x, 1.5f);
  EXPECT_EQ(Tensor(std::vector<std::int64_t>{}).numel(), 1);  // a scalar: the empty product
  EXPECT_EQ(Tensor({4, 0}).numel(), 0);
  EXPECT_EQ(Tensor().numel(), 0);
  try {
    Tensor({2, -1});
    FAIL() << "negative dimension accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "shape");
  }
}

TEST(Ops, GemmMatchesNaiveAllTransposes) {
  std::mt19937 g(1);
  const std::int64_t m = 3, n = 5, k = 4;
  const float alpha = 0.7f, beta = 0.3f;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Vec a = random_vec(g, m * k), b = random_vec(g, k * n), c0 = random_vec(g, m * n);
      Vec c = c0;
      gemm(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, c.data());
      Vec expected(m * n);
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double s = 0.0;
          for (std::int64_t p = 0; p < k; ++p)
            s += static_cast<double>(ta ? a[p * m + i] : a[i * k + p]) *
                 (tb ? b[j * k + p] : b[p * n + j]);
          expected[i * n + j] = static_cast<float>(alpha * s + beta * c0[i * n + j]);
        }
      expect_near_all(c, expected, 1e-5, ta ? (tb ? "AtBt" : "AtB") : (tb ? "ABt" : "AB"));
    }
}

TEST(Ops, GemmEmptyInnerDimensionScalesC) {
  Vec c = {1.0f, 2.0f, 3.0f, 4.0f};
  gemm(false, false, 2, 2, 0, 1.0f, nullptr, nullptr, 0.5f, c.data());
  EXPECT_EQ(c, (Vec{0.5f, 1.0f, 1.5f, 2.0f}));
  Vec nan_c(4, kNaN);
  gemm(true, true, 2, 2, 0, 1.0f, nullptr, nullptr, 0.0f, nan_c.data());
  EXPECT_EQ(nan_c, Vec(4, 0.0f));  // beta = 0 overwrites, as for dx
}

TEST(Ops, LinearGradients) {
  std::mt19937 g(2);
  const std::int64_t m = 3, k = 4, n = 5;
  Vec x = random_vec(g, m * k), w = random_vec(g, k * n), bias = random_vec(g, n);
  const Vec r = random_vec(g, m * n);
  const auto loss = [&] {
    Vec y(m * n, kNaN);
    linear_forward(x.data(), w.data(), bias.data(), y.data(), m, k, n);
    return dot(y, r);
  };
  Vec dx(m * k, kNaN);
  linear_backward_input(r.data(), w.data(), dx.data(), m, k, n);
  const Vec dw0 = random_vec(g, k * n), db0 = random_vec(g, n);
  Vec dw = dw0, db = db0;
  linear_backward_weight(x.data(), r.data(), dw.data(), db.data(), m, k, n);
  expect_gradient("x", x, dx, loss);
  expect_gradient("w", w, minus(dw, dw0), loss);
  expect_gradient("bias", bias, minus(db, db0), loss);
}

TEST(Ops, LinearWithoutBias) {
  std::mt19937 g(3);
  const std::int64_t m = 2, k = 3, n = 4;
  const Vec x = random_vec(g, m * k), w = random_vec(g, k * n), dy = random_vec(g, m * n);
  Vec y(m * n, kNaN);
  linear_forward(x.data(), w.data(), nullptr, y.data(), m, k, n);
  Vec expected(m * n, 0.0f);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t p = 0; p < k; ++p) expected[i * n + j] += x[i * k + p] * w[p * n + j];
  expect_near_all(y, expected, 1e-5, "y");
  Vec dw(k * n, 0.0f), dw_with_bias(k * n, 0.0f), db(n, 0.0f);
  linear_backward_weight(x.data(), dy.data(), dw.data(), nullptr, m, k, n);
  linear_backward_weight(x.data(), dy.data(), dw_with_bias.data(), db.data(), m, k, n);
  EXPECT_TRUE(same_bits(dw, dw_with_bias));
}

struct LayerNormCase {
  std::int64_t m = 3, n = 6;
  Vec x, gamma, beta, r;
  explicit LayerNormCase(std::mt19937& g)
      : x(random_vec(g, m * n)),
        gamma(random_vec(g, n, 0.5f, 1.5f)),
        beta(random_vec(g, n)),
        r(random_vec(g, m * n)) {}
};

TEST(Ops, LayerNormGradients) {
  std::mt19937 g(4);
  LayerNormCase c(g);
  const auto m = c.m, n = c.n;
  Vec mean(m), rstd(m);
  const auto loss = [&] {
    Vec y(m * n);
    layernorm_forward(c.x.data(), c.gamma.data(), c.beta.data(), y.data(), mean.data(), rstd.data(),
                      m, n, n);
    return dot(y, c.r);
  };
  loss();
  Vec dx(m * n, kNaN);
  const Vec dg0 = random_vec(g, n), db0 = random_vec(g, n);
  Vec dg = dg0, db = db0;
  layernorm_backward(c.r.data(), c.x.data(), c.gamma.data(), mean.data(), rstd.data(), dx.data(),
                     dg.data(), db.data(), m, n, n);
  expect_gradient("x", c.x, dx, loss);
  expect_gradient("gamma", c.gamma, minus(dg, dg0), loss);
  expect_gradient("beta", c.beta, minus(db, db0), loss);
}

TEST(Ops, LayerNormNormalises) {
  std::mt19937 g(5);
  const std::int64_t m = 4, n = 16;
  const Vec x = random_vec(g, m * n, -3.0f, 5.0f);
  Vec y(m * n), mean(m), rstd(m);
  const Vec ones(n, 1.0f), zeros(n, 0.0f);
  layernorm_forward(x.data(), ones.data(), zeros.data(), y.data(), mean.data(), rstd.data(), m, n,
                    n);
  for (std::int64_t i = 0; i < m; ++i) {
    double s = 0.0, sq = 0.0, ref_mean = 0.0;
    for (std::int64_t j = 0; j < n; ++j) ref_mean += x[i * n + j] / static_cast<double>(n);
    for (std::int64_t j = 0; j < n; ++j) {
      s += y[i * n + j];
      sq += static_cast<double>(y[i * n + j]) * y[i * n + j];
    }
    EXPECT_NEAR(mean[i], ref_mean, 1e-5);
    EXPECT_NEAR(s / n, 0.0, 1e-5);
    EXPECT_NEAR(sq / n, 1.0, 1e-3);  // 1 - eps * rstd^2
  }
}

// Two simulated devices summing in lockstep: each deposits its partial, waits for the other,
// and both add the slots in rank order, so that both get the same bits.
class PairAllReduce {
 public:
  AllReduceSum rank(int r) {
    return [this, r](float* data, std::int64_t count) {
      slot_[r].assign(data, data + count);
      barrier_.arrive_and_wait();
      for (std::int64_t i = 0; i < count; ++i) data[i] = slot_[0][i] + slot_[1][i];
      barrier_.arrive_and_wait();  // neither overwrites its slot before both have read
    };
  }

 private:
  std::barrier<> barrier_{2};
  std::array<Vec, 2> slot_;
};

TEST(Ops, LayerNormSplitEqualsUnsplit) {
  std::mt19937 g(6);
  const std::int64_t m = 3, n = 7;
  const std::array<std::int64_t, 3> cut = {0, 3, 7};  // uneven halves
  const Vec x = random_vec(g, m * n), gamma = random_vec(g, n, 0.5f, 1.5f);
  const Vec beta = random_vec(g, n), dy = random_vec(g, m * n);

  Vec y(m * n), mean(m), rstd(m), dx(m * n), dg(n, 0.0f), db(n, 0.0f);
  layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), m, n,
                    n);
  layernorm_backward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                     dg.data(), db.data(), m, n, n);

  struct Half {
    Vec y, mean, rstd, dx, dg, db;
  };
  std::array<Half, 2> half;
  PairAllReduce comm;
  const auto run = [&](int r) {
    const std::int64_t lo = cut[r], hi = cut[r + 1], w = hi - lo;
    const Vec xs = columns(x, m, n, lo, hi), dys = columns(dy, m, n, lo, hi);
    const Vec gs(gamma.begin() + lo, gamma.begin() + hi), bs(beta.begin() + lo, beta.begin() + hi);
    Half& h = half[r];
    h = {Vec(m * w), Vec(m), Vec(m), Vec(m * w), Vec(w, 0.0f), Vec(w, 0.0f)};
    const AllReduceSum reduce = comm.rank(r);
    layernorm_forward(xs.data(), gs.data(), bs.data(), h.y.data(), h.mean.data(), h.rstd.data(), m,
                      w, n, reduce);
    layernorm_backward(dys.data(), xs.data(), gs.data(), h.mean.data(), h.rstd.data(), h.dx.data(),
                       h.dg.data(), h.db.data(), m, w, n, reduce);
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();

  for (int r = 0; r < 2; ++r) {
    const std::int64_t lo = cut[r], hi = cut[r + 1];
    expect_near_all(half[r].y, columns(y, m, n, lo, hi), 1e-5, "y");
    expect_near_all(half[r].mean, mean, 1e-5, "mean");
    expect_near_all(half[r].rstd, rstd, 1e-5, "rstd");
    expect_near_all(half[r].dx, columns(dx, m, n, lo, hi), 1e-5, "dx");
    expect_near_all(half[r].dg, Vec(dg.begin() + lo, dg.begin() + hi), 1e-5, "dgamma");
    expect_near_all(half[r].db, Vec(db.begin() + lo, db.begin() + hi), 1e-5, "dbeta");
  }
  EXPECT_TRUE(same_bits(half[0].mean, half[1].mean));
  EXPECT_TRUE(same_bits(half[0].rstd, half[1].rstd));
}

TEST(Ops, GeluValuesAndGradient) {
  const Vec x = {0.0f, 1.0f, -1.0f, 2.0f, -3.0f};
  Vec y(x.size());
  gelu_forward(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  expect_near_all(y, {0.0f, 0.8411920f, -0.1588080f, 1.9545977f, -0.0036374f}, 1e-6, "gelu");

  std::mt19937 g(7);
  const std::int64_t n = 20;
  Vec xs = random_vec(g, n, -3.0f, 3.0f);
  const Vec r = random_vec(g, n);
  const auto loss = [&] {
    Vec ys(n);
    gelu_forward(xs.data(), ys.data(), n);
    return dot(ys, r);
  };
  Vec dx(n, kNaN);
  gelu_backward(r.data(), xs.data(), dx.data(), n);
  expect_gradient("x", xs, dx, loss);
}

struct AttentionShape {
  std::int64_t b = 2, s = 4, h = 2, dh = 3;
  std::int64_t qkv_size() const { return b * s * h * 3 * dh; }
  std::int64_t out_size() const { return b * s * h * dh; }
  std::int64_t probs_size() const { return b * h * s * s; }
};

TEST(Ops, AttentionMatchesReference) {
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    const AttentionShape a;
    std::mt19937 g(8);
    const Vec qkv = random_vec(g, a.qkv_size(), -2.0f, 2.0f);
    Vec out(a.out_size(), kNaN), probs(a.probs_size(), kNaN);
    attention_forward(qkv.data(), out.data(), probs.data(), a.b, a.s, a.h, a.dh, causal);
    const auto at = [&](std::int64_t b, std::int64_t t, std::int64_t hd, int part, std::int64_t c) {
      return static_cast<double>(qkv[(((b * a.s + t) * a.h + hd) * 3 + part) * a.dh + c]);
    };
    for (std::int64_t b = 0; b < a.b; ++b)
      for (std::int64_t hd = 0; hd < a.h; ++hd)
        for (std::int64_t t = 0; t < a.s; ++t) {
          std::vector<double> p(a.s, 0.0);
          double z = 0.0;
          const std::int64_t last = causal ? t : a.s - 1;  // the last key the query sees
          for (std::int64_t j = 0; j <= last; ++j) {
            double score = 0.0;
            for (std::int64_t c = 0; c < a.dh; ++c)
              score += at(b, t, hd, 0, c) * at(b, j, hd, 1, c);
            p[j] = std::exp(score / std::sqrt(static_cast<double>(a.dh)));
            z += p[j];
          }
          for (std::int64_t j = 0; j < a.s; ++j) {
            const float got = probs[((b * a.h + hd) * a.s + t) * a.s + j];
            if (j > last)
              EXPECT_EQ(got, 0.0f) << "masked b=" << b << " h=" << hd << " t=" << t << " j=" << j;
            else
              EXPECT_NEAR(got, p[j] / z, 1e-6);
          }
          for (std::int64_t c = 0; c < a.dh; ++c) {
            double o = 0.0;
            for (std::int64_t j = 0; j <= last; ++j) o += p[j] / z * at(b, j, hd, 2, c);
            EXPECT_NEAR(out[((b * a.s + t) * a.h + hd) * a.dh + c], o, 1e-5);
          }
        }
  }
}

TEST(Ops, AttentionGradients) {
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    const AttentionShape a;
    std::mt19937 g(9);
    Vec qkv = random_vec(g, a.qkv_size());
    const Vec r = random_vec(g, a.out_size());
    Vec probs(a.probs_size());
    const auto loss = [&] {
      Vec out(a.out_size());
      attention_forward(qkv.data(), out.data(), probs.data(), a.b, a.s, a.h, a.dh, causal);
      return dot(out, r);
    };
    loss();
    Vec dqkv(a.qkv_size(), kNaN);
    attention_backward(r.data(), qkv.data(), probs.data(), dqkv.data(), a.b, a.s, a.h, a.dh,
                       causal);
    expect_gradient("qkv", qkv, dqkv, loss);
  }
}

TEST(Ops, EmbeddingForwardAndGradients) {
  std::mt19937 g(10);
  const std::int64_t b = 2, s = 3, d = 4, vocab = 5;
  const std::vector<std::int32_t> tokens = {1, 4, 1, 0, 1, 3};  // repeats must accumulate
  Vec table = random_vec(g, vocab * d), pos = random_vec(g, s * d);
  const Vec r = random_vec(g, b * s * d);
  Vec y(b * s * d, kNaN);
  embedding_forward(tokens.data(), table.data(), pos.data(), y.data(), b, s, d);
  for (std::int64_t i = 0; i < b * s; ++i)
    for (std::int64_t c = 0; c < d; ++c)
      EXPECT_EQ(y[i * d + c], table[tokens[i] * d + c] + pos[(i % s) * d + c]);

  const auto loss = [&] {
    Vec out(b * s * d);
    embedding_forward(tokens.data(), table.data(), pos.data(), out.data(), b, s, d);
    return dot(out, r);
  };
  const Vec dt0 = random_vec(g, vocab * d), dp0 = random_vec(g, s * d);
  Vec dt = dt0, dp = dp0;
  embedding_backward(tokens.data(), r.data(), dt.data(), dp.data(), b, s, d);
  expect_gradient("table", table, minus(dt, dt0), loss);
  expect_gradient("pos", pos, minus(dp, dp0), loss);

  Vec dt_only = dt0, dp_only = dp0;
  embedding_backward(tokens.data(), r.data(), dt_only.data(), nullptr, b, s, d);
  embedding_backward(tokens.data(), r.data(), nullptr, dp_only.data(), b, s, d);
  EXPECT_TRUE(same_bits(dt_only, dt));
  EXPECT_TRUE(same_bits(dp_only, dp));
}

TEST(Ops, CrossEntropyMatchesNaive) {
  std::mt19937 g(11);
  const std::int64_t m = 4, v = 6;
  const Vec logits = random_vec(g, m * v, -3.0f, 3.0f);
  const std::vector<std::int32_t> targets = {0, 5, 2, 2};
  Vec probs(m * v, kNaN);
  const double loss = cross_entropy_forward(logits.data(), targets.data(), probs.data(), m, v);
  double expected = 0.0;
  for (std::int64_t i = 0; i < m; ++i) {
    double z = 0.0;
    for (std::int64_t j = 0; j < v; ++j) z += std::exp(static_cast<double>(logits[i * v + j]));
    for (std::int64_t j = 0; j < v; ++j)
      EXPECT_NEAR(probs[i * v + j], std::exp(static_cast<double>(logits[i * v + j])) / z, 1e-6);
    expected -= logits[i * v + targets[i]] - std::log(z);
  }
  EXPECT_NEAR(loss, expected, 1e-5);

  // Shifted far beyond exp's range: the max subtraction keeps it finite and unchanged.
  Vec shifted = logits;
  for (float& x : shifted) x += 1000.0f;
  const double shifted_loss =
      cross_entropy_forward(shifted.data(), targets.data(), probs.data(), m, v);
  EXPECT_NEAR(shifted_loss, expected, 1e-3);  // 1000 + x rounds x to ~6e-5
}

TEST(Ops, CrossEntropyGradient) {
  std::mt19937 g(12);
  const std::int64_t m = 3, v = 5;
  const float scale_by = 0.25f;
  Vec logits = random_vec(g, m * v, -2.0f, 2.0f);
  const std::vector<std::int32_t> targets = {4, 0, 1};
  Vec probs(m * v);
  const auto loss = [&] {
    return scale_by * cross_entropy_forward(logits.data(), targets.data(), probs.data(), m, v);
  };
  loss();
  Vec dlogits(m * v, kNaN);
  cross_entropy_backward(probs.data(), targets.data(), dlogits.data(), m, v, scale_by);
  expect_gradient("logits", logits, dlogits, loss);
}

TEST(Ops, CrossEntropyRejectsOutOfRangeTarget) {
  const Vec logits(2 * 3, 0.0f);
  Vec probs(2 * 3), dlogits(2 * 3);
  for (std::int32_t bad : {-1, 3}) {
    const std::vector<std::int32_t> targets = {0, bad};
    try {
      cross_entropy_forward(logits.data(), targets.data(), probs.data(), 2, 3);
      FAIL() << "target " << bad << " accepted";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "targets");
    }
    EXPECT_THROW(cross_entropy_backward(probs.data(), targets.data(), dlogits.data(), 2, 3, 1.0f),
                 ValidationError);
  }
}

TEST(Ops, AddScaleSumOfSquares) {
  Vec y = {1.0f, 2.0f, 3.0f};
  add_into(Vec{0.5f, -1.0f, 2.0f}.data(), y.data(), 3);
  EXPECT_EQ(y, (Vec{1.5f, 1.0f, 5.0f}));
  scale(y.data(), 3, 2.0f);
  EXPECT_EQ(y, (Vec{3.0f, 2.0f, 10.0f}));
  EXPECT_EQ(sum_of_squares(y.data(), 3), 113.0);
  const Vec big(1000, 1e4f);  // 1e11 in total: beyond fp32's exact integers
  EXPECT_EQ(sum_of_squares(big.data(), 1000), 1e11);
}

TEST(Ops, AdamWStepsAgainstHandComputedValues) {
  const AdamW opt{.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
  Vec p = {1.0f, -2.0f, 0.5f}, m(3, 0.0f), v(3, 0.0f);
  // Step 1: the bias corrections make mhat = g and vhat = g^2, so the update is lr*(sign(g) +
  // wd*p): 1 - 0.1*(1 + 0.1), -2 - 0.1*(-1 - 0.2), 0.5 - 0.1*(0 + 0.05).
  opt.step(p.data(), Vec{0.1f, -0.3f, 0.0f}.data(), m.data(), v.data(), 3, 1);
  expect_near_all(p, {0.89f, -1.88f, 0.495f}, 1e-6, "param");
  expect_near_all(m, {0.01f, -0.03f, 0.0f}, 1e-7, "m");  // 1 - 0.9f rounds
  expect_near_all(v, {1e-5f, 9e-5f, 0.0f}, 1e-8, "v");

  const Vec grad2 = {0.2f, 0.1f, -0.5f};
  Vec expected(3);
  for (int i = 0; i < 3; ++i) {
    const double mi = 0.9 * m[i] + 0.1 * grad2[i];
    const double vi = 0.999 * v[i] + 0.001 * grad2[i] * grad2[i];
    const double mhat = mi / (1 - 0.9 * 0.9), vhat = vi / (1 - 0.999 * 0.999);
    expected[i] = static_cast<float>(p[i] - 0.1 * (mhat / (std::sqrt(vhat) + 1e-8) + 0.1 * p[i]));
  }
  opt.step(p.data(), grad2.data(), m.data(), v.data(), 3, 2);
  expect_near_all(p, expected, 1e-5, "param step 2");
}

TEST(Ops, ClipFactor) {
  EXPECT_EQ(clip_factor(0.0, 1.0f), 1.0f);
  EXPECT_EQ(clip_factor(0.25, 1.0f), 1.0f);
  EXPECT_EQ(clip_factor(1.0, 1.0f), 1.0f);  // exactly at the bound: not clipped
  EXPECT_NEAR(clip_factor(4.0, 1.0f), 0.5f, 1e-6);
  EXPECT_NEAR(clip_factor(100.0, 2.5f), 0.25f, 1e-6);
  EXPECT_EQ(clip_factor(1e6, 0.0f), 1.0f);  // max_norm <= 0: clipping off
  EXPECT_EQ(clip_factor(1e6, -1.0f), 1.0f);
}

TEST(Ops, RngIsSplitMix64) {
  Rng rng(0);  // the reference splitmix64 stream from seed 0
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(rng.next(), 0x06C45D188009454Full);

  Rng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t x = a.next();
    EXPECT_EQ(x, b.next());
    differs |= x != c.next();
  }
  EXPECT_TRUE(differs);
}

TEST(Ops, RngDistributions) {
  Rng rng(7);
  const int n = 10000;
  double su = 0.0, sn = 0.0, sn2 = 0.0;
  for (int i = 0; i < n; ++i) {
    const float u = rng.uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    su += u;
    const float z = rng.normal();
    ASSERT_TRUE(std::isfinite(z));
    sn += z;
    sn2 += static_cast<double>(z) * z;
  }
  EXPECT_NEAR(su / n, 0.5, 0.015);  // 5 sigma of 0.29/sqrt(n)
  EXPECT_NEAR(sn / n, 0.0, 0.05);
  EXPECT_NEAR(sn2 / n, 1.0, 0.08);
}

TEST(Ops, FillNormal) {
  const std::int64_t n = 10000;
  const float sd = 0.02f;
  Vec x(n);
  fill_normal(x.data(), n, sd, 1234, "blocks.0.attn.w");
  double s = 0.0, s2 = 0.0;
  for (float v : x) {
    s += v;
    s2 += static_cast<double>(v) * v;
  }
  const double mean = s / n, sd_got = std::sqrt(s2 / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 5 * sd / std::sqrt(n));
  EXPECT_NEAR(sd_got, sd, 0.05 * sd);

  Vec again(n), prefix(10), other_name(n), other_seed(n);
  fill_normal(again.data(), n, sd, 1234, "blocks.0.attn.w");
  fill_normal(prefix.data(), 10, sd, 1234, "blocks.0.attn.w");
  fill_normal(other_name.data(), n, sd, 1234, "blocks.1.attn.w");
  fill_normal(other_seed.data(), n, sd, 1235, "blocks.0.attn.w");
  EXPECT_TRUE(same_bits(again, x));
  EXPECT_TRUE(same_bits(prefix, Vec(x.begin(), x.begin() + 10)));  // independent of n
  EXPECT_FALSE(same_bits(other_name, x));
  EXPECT_FALSE(same_bits(other_seed, x));
}

// Every kernel twice on the same inputs: the same bits. Sizes large enough for BLAS blocking.
TEST(Ops, Deterministic) {
  use_single_threaded_blas();
  std::mt19937 g(13);
  const auto twice = [](const std::function<Vec()>& f) {
    const Vec first = f();
    EXPECT_TRUE(same_bits(first, f()));
  };
  const std::int64_t m = 67, k = 129, n = 71;
  const Vec a = random_vec(g, m * k), w = random_vec(g, k * n), dy = random_vec(g, m * n);
  const Vec gamma = random_vec(g, k), beta = random_vec(g, k);
  twice([&] {
    Vec y(m * n);
    linear_forward(a.data(), w.data(), beta.data(), y.data(), m, k, n);
    return y;
  });
  twice([&] {
    Vec dx(m * k), dw(k * n, 0.0f);
    linear_backward_input(dy.data(), w.data(), dx.data(), m, k, n);
    linear_backward_weight(a.data(), dy.data(), dw.data(), nullptr, m, k, n);
    dx.insert(dx.end(), dw.begin(), dw.end());
    return dx;
  });
  twice([&] {
    Vec y(m * k), mean(m), rstd(m), dx(m * k), dg(k, 0.0f), db(k, 0.0f);
    layernorm_forward(a.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), m, k,
                      k);
    layernorm_backward(a.data(), a.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                       dg.data(), db.data(), m, k, k);
    for (const Vec* part : {&dx, &dg, &db}) y.insert(y.end(), part->begin(), part->end());
    return y;
  });
  twice([&] {
    Vec y(m * k), dx(m * k);
    gelu_forward(a.data(), y.data(), m * k);
    gelu_backward(a.data(), a.data(), dx.data(), m * k);
    y.insert(y.end(), dx.begin(), dx.end());
    return y;
  });
  const std::int64_t b = 2, s = 9, h = 3, dh = 8;
  const Vec qkv = random_vec(g, b * s * h * 3 * dh), dout = random_vec(g, b * s * h * dh);
  twice([&] {
    Vec out(b * s * h * dh), probs(b * h * s * s), dqkv(b * s * h * 3 * dh);
    attention_forward(qkv.data(), out.data(), probs.data(), b, s, h, dh);
    attention_backward(dout.data(), qkv.data(), probs.data(), dqkv.data(), b, s, h, dh);
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  });
  std::vector<std::int32_t> targets(m);
  for (std::int64_t i = 0; i < m; ++i) targets[i] = static_cast<std::int32_t>((i * 7) % n);
  const auto cross_entropy = [&](Vec& probs_and_grad) {
    probs_and_grad.assign(2 * m * n, 0.0f);
    float* probs = probs_and_grad.data();
    const double loss = cross_entropy_forward(dy.data(), targets.data(), probs, m, n);
    cross_entropy_backward(probs, targets.data(), probs + m * n, m, n, 0.5f);
    return loss;
  };
  Vec first, second;
  EXPECT_EQ(cross_entropy(first), cross_entropy(second));
  EXPECT_TRUE(same_bits(first, second));
}

}  // namespace
