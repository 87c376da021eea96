#include "training/layers.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace meshcast::training {
namespace {

std::vector<float> buffer(std::int64_t n) {
  return std::vector<float>(static_cast<std::size_t>(n));
}

void test_all(std::vector<Collective>& ops) {
  for (auto& op : ops) op.test();
}

}  // namespace

void Exec::wait(Collective& c) { timed_wait(c, blocked); }

const Group* Exec::along(Split axis) const {
  const Group* g = axis == Split::Rows   ? &groups.rows
                   : axis == Split::Cols ? &groups.cols
                                         : nullptr;
  return g != nullptr && g->size() > 1 ? g : nullptr;
}

void Exec::all_reduce(const Group* group, float* data, std::int64_t n) {
  if (group == nullptr) return;
  Collective c = iall_reduce(*group, data, data, n, DType::f32, ReduceOp::Sum, options);
  wait(c);
}

AllReduceSum Exec::feature_sum() {
  const Group* rows = along(Split::Rows);
  if (rows == nullptr) return {};
  return [this, rows](float* data, std::int64_t n) { all_reduce(rows, data, n); };
}

void Linear::forward(Exec& e, const float* x, float* y, std::int64_t rows) const {
  const float* weights = w->weights(e.blocked);
  const Group* sum = e.along(forward_sum);
  const bool reduce = sum != nullptr;
  // Over-decomposition: the partial product of one slice of rows is summed while the next
  // slice's product is computed.
  const std::int64_t slices = reduce ? std::max(1, e.sub_batches) : 1;
  std::vector<Collective> ops;
  for (std::int64_t j = 0; j < slices; ++j) {
    const Range r = shard_range(rows, slices, j);
    if (r.empty()) continue;
    e.gemm(2.0 * static_cast<double>(r.size() * in * out), [&] {
      linear_forward(x + r.lo * in, weights, nullptr, y + r.lo * out, r.size(), in, out);
    });
    test_all(ops);
    if (!reduce) continue;
    ops.push_back(iall_reduce(*sum, y + r.lo * out, y + r.lo * out, r.size() * out, DType::f32,
                              ReduceOp::Sum, e.options));
    if (!e.overlap) e.wait(ops.back());
  }
  for (auto& op : ops) e.wait(op);
  // The bias joins after the sum, so that it is added once.
  if (b != nullptr)
    for (std::int64_t i = 0; i < rows; ++i) add_into(b->value.data(), y + i * out, out);
}

void Linear::backward(Exec& e, const float* x, const float* dy, float* dx,
                      std::int64_t rows) const {
  const float* weights = w->weights(e.blocked);
  const Group* sum = e.along(backward_sum);
  const bool reduce = dx != nullptr && sum != nullptr;
  const std::int64_t slices = reduce ? std::max(1, e.sub_batches) : 1;
  std::vector<Collective> ops;
  if (dx != nullptr) {
    for (std::int64_t j = 0; j < slices; ++j) {
      const Range r = shard_range(rows, slices, j);
      if (r.empty()) continue;
      e.gemm(2.0 * static_cast<double>(r.size() * in * out), [&] {
        linear_backward_input(dy + r.lo * out, weights, dx + r.lo * in, r.size(), in, out);
      });
      test_all(ops);
      if (!reduce) continue;
      ops.push_back(iall_reduce(*sum, dx + r.lo * in, dx + r.lo * in, r.size() * in, DType::f32,
                                ReduceOp::Sum, e.options));
      if (!e.overlap) e.wait(ops.back());
    }
  }
  // The weight gradient needs no communication now: it runs while the input gradient's sum is
  // in flight (Megatron's overlap).
  e.gemm(2.0 * static_cast<double>(rows * in * out), [&] {
    linear_backward_weight(x, dy, w->grad.data(), b != nullptr ? b->grad.data() : nullptr, rows, in,
                           out);
  });
  for (auto& op : ops) e.wait(op);
}

Block Block::make(Parameters& params, const Place& place, const ModelConfig& model, int index) {
  const std::string p = "block" + std::to_string(index) + ".";
  const std::int64_t d = model.d_model, f = model.ffn_width();
  Block b;
  b.width = d;
  b.heads = model.heads / place.shape.cols;
  b.head_width = d / model.heads;
  b.causal = model.causal;
  auto norm = [&](const std::string& name, Init init) {
    return &params.add(p + name, {d}, {Split::Rows}, init, false);
  };
  // The first linear of a pair takes features split over rows and yields them split over
  // columns; the second goes back. Its input gradient is summed over the other axis.
  auto linear = [&](const std::string& name, std::int64_t in, std::int64_t out, bool first) {
    const Split a = first ? Split::Rows : Split::Cols, z = first ? Split::Cols : Split::Rows;
    Linear l;
    l.w = &params.add(p + name + ".w", {in, out}, {a, z}, Init::Normal, true);
    l.b = &params.add(p + name + ".b", {out}, {z}, Init::Zeros, false);
    l.forward_sum = a;
    l.backward_sum = z;
    l.in = l.w->block[0].size();
    l.out = l.w->block[1].size();
    return l;
  };
  b.ln1_g = norm("ln1.g", Init::Ones);
  b.ln1_b = norm("ln1.b", Init::Zeros);
  b.qkv = linear("qkv", d, 3 * d, true);
  b.proj = linear("proj", d, d, false);
  b.ln2_g = norm("ln2.g", Init::Ones);
  b.ln2_b = norm("ln2.b", Init::Zeros);
  b.fc1 = linear("fc1", d, f, true);
  b.fc2 = linear("fc2", f, d, false);
  return b;
}

void Block::forward(Exec& e, const float* x, float* out, std::int64_t samples, std::int64_t seq,
                    Saved& s) const {
  const std::int64_t t = samples * seq, dr = qkv.in;
  s.x.assign(x, x + t * dr);
  s.y1 = buffer(t * dr);
  s.mean1 = buffer(t);
  s.rstd1 = buffer(t);
  layernorm_forward(x, ln1_g->value.data(), ln1_b->value.data(), s.y1.data(), s.mean1.data(),
                    s.rstd1.data(), t, dr, width, e.feature_sum());
  s.qkv = buffer(t * qkv.out);
  qkv.forward(e, s.y1.data(), s.qkv.data(), t);
  s.att = buffer(t * proj.in);
  s.probs = buffer(samples * heads * seq * seq);
  attention_forward(s.qkv.data(), s.att.data(), s.probs.data(), samples, seq, heads, head_width,
                    causal);
  s.x2 = buffer(t * dr);
  proj.forward(e, s.att.data(), s.x2.data(), t);
  add_into(x, s.x2.data(), t * dr);
  s.y2 = buffer(t * dr);
  s.mean2 = buffer(t);
  s.rstd2 = buffer(t);
  layernorm_forward(s.x2.data(), ln2_g->value.data(), ln2_b->value.data(), s.y2.data(),
                    s.mean2.data(), s.rstd2.data(), t, dr, width, e.feature_sum());
  s.h = buffer(t * fc1.out);
  fc1.forward(e, s.y2.data(), s.h.data(), t);
  s.g = buffer(t * fc1.out);
  gelu_forward(s.h.data(), s.g.data(), t * fc1.out);
  fc2.forward(e, s.g.data(), out, t);
  add_into(s.x2.data(), out, t * dr);
}

void Block::backward(Exec& e, const Saved& s, const float* dout, float* dx, std::int64_t samples,
                     std::int64_t seq) const {
  const std::int64_t t = samples * seq, dr = qkv.in;
  std::vector<float> dx2(dout, dout + t * dr), tmp = buffer(t * dr);
  auto dg = buffer(t * fc1.out), dh = buffer(t * fc1.out);
  fc2.backward(e, s.g.data(), dout, dg.data(), t);
  gelu_backward(dg.data(), s.h.data(), dh.data(), t * fc1.out);
  auto dy2 = buffer(t * dr);
  fc1.backward(e, s.y2.data(), dh.data(), dy2.data(), t);
  layernorm_backward(dy2.data(), s.x2.data(), ln2_g->value.data(), s.mean2.data(), s.rstd2.data(),
                     tmp.data(), ln2_g->grad.data(), ln2_b->grad.data(), t, dr, width,
                     e.feature_sum());
  add_into(tmp.data(), dx2.data(), t * dr);
  auto datt = buffer(t * proj.in), dqkv = buffer(t * qkv.out);
  proj.backward(e, s.att.data(), dx2.data(), datt.data(), t);
  attention_backward(datt.data(), s.qkv.data(), s.probs.data(), dqkv.data(), samples, seq, heads,
                     head_width, causal);
  auto dy1 = buffer(t * dr);
  qkv.backward(e, s.y1.data(), dqkv.data(), dy1.data(), t);
  // Softmax ignores a shift shared by a query's scores, so the keys' bias has no gradient: what
  // the sums leave there is rounding noise, which Adam would amplify into updates that differ
  // between parallel layouts. Keeping it at exactly 0 makes the bias q and v only.
  for (std::int64_t h = 0; h < heads; ++h)
    std::fill_n(qkv.b->grad.begin() + (3 * h + 1) * head_width, head_width, 0.0f);
  layernorm_backward(dy1.data(), s.x.data(), ln1_g->value.data(), s.mean1.data(), s.rstd1.data(),
                     dx, ln1_g->grad.data(), ln1_b->grad.data(), t, dr, width, e.feature_sum());
  add_into(dx2.data(), dx, t * dr);
}

Embedding Embedding::make(Parameters& params, const Place& place, const ModelConfig& model) {
  (void)place;
  Embedding em;
  // The token table's gradient touches only the rows of the step's tokens: the sparse path.
  em.table = &params.add("embed.table", {model.vocab, model.d_model}, {Split::None, Split::Rows},
                         Init::Normal, false, true);
  em.pos = &params.add("embed.pos", {model.seq, model.d_model}, {Split::None, Split::Rows},
                       Init::Normal, false);
  em.width = em.table->block[1].size();
  return em;
}

Head Head::make(Parameters& params, const Place& place, const ModelConfig& model) {
  Head h;
  h.ln_g = &params.add("head.ln.g", {model.d_model}, {Split::Rows}, Init::Ones, false);
  h.ln_b = &params.add("head.ln.b", {model.d_model}, {Split::Rows}, Init::Zeros, false);
  h.out.w = &params.add("head.w", {model.d_model, model.vocab}, {Split::Rows, Split::None},
                        Init::Normal, false);
  (void)place;
  h.out.forward_sum = Split::Rows;
  h.out.in = h.out.w->block[0].size();
  h.out.out = model.vocab;
  h.width = model.d_model;
  h.vocab = model.vocab;
  return h;
}

double Head::forward(Exec& e, const float* x, const std::int32_t* targets, std::int64_t rows,
                     Saved& s) const {
  const std::int64_t dr = out.in;
  s.x.assign(x, x + rows * dr);
  s.y = buffer(rows * dr);
  s.mean = buffer(rows);
  s.rstd = buffer(rows);
  layernorm_forward(x, ln_g->value.data(), ln_b->value.data(), s.y.data(), s.mean.data(),
                    s.rstd.data(), rows, dr, width, e.feature_sum());
  auto logits = buffer(rows * vocab);
  out.forward(e, s.y.data(), logits.data(), rows);
  s.probs = buffer(rows * vocab);
  return cross_entropy_forward(logits.data(), targets, s.probs.data(), rows, vocab);
}

void Head::backward(Exec& e, const Saved& s, const std::int32_t* targets, float* dx,
                    std::int64_t rows, std::int64_t total_tokens) const {
  const std::int64_t dr = out.in;
  auto dlogits = buffer(rows * vocab), dy = buffer(rows * dr);
  cross_entropy_backward(s.probs.data(), targets, dlogits.data(), rows, vocab,
                         1.0f / static_cast<float>(total_tokens));
  out.backward(e, s.y.data(), dlogits.data(), dy.data(), rows);
  layernorm_backward(dy.data(), s.x.data(), ln_g->value.data(), s.mean.data(), s.rstd.data(), dx,
                     ln_g->grad.data(), ln_b->grad.data(), rows, dr, width, e.feature_sum());
}

}  // namespace meshcast::training
