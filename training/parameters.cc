#include "training/parameters.h"

#include <algorithm>
#include <chrono>

#include "meshcast/sparse.h"
#include "meshcast/spec.h"

namespace meshcast::training {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void timed_wait(Collective& c, double& blocked) {
  const double t0 = now();
  c.wait();
  blocked += now() - t0;
}

namespace {

// The row-major elements of `block` out of a full tensor of `shape` (1 or 2 dimensions).
std::vector<float> extract(const std::vector<float>& full, const std::vector<std::int64_t>& shape,
                           const Box& block) {
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(block.volume()));
  const std::int64_t cols = shape.size() == 2 ? shape[1] : 1;
  const Range rows = block[0];
  const Range span = shape.size() == 2 ? block[1] : Range{0, 1};
  for (std::int64_t i = rows.lo; i < rows.hi; ++i)
    for (std::int64_t j = span.lo; j < span.hi; ++j)
      out.push_back(full[static_cast<std::size_t>(i * cols + j)]);
  return out;
}

}  // namespace

const float* Param::weights(double& blocked) {
  if (!sharded) return value.data();
  if (!gather.done()) timed_wait(gather, blocked);
  return full.data();
}

Parameters::Parameters(const Place& place, const TrainConfig& train, const ModelConfig& model)
    : place_(place), seed_(train.seed), std_(model.init_std) {}

Param& Parameters::add(const std::string& name, std::vector<std::int64_t> shape,
                       std::vector<Split> split, Init init, bool sharded, bool sparse) {
  const bool depth = sharded && place_.shape.depth > 1;
  // The tensor's layout on the stage mesh {dp, R, C, D}: a dimension split over the grid's rows
  // (axis 1) or columns (axis 2), the first one also over depth (axis 3) when sharded;
  // replicated over the rest. The block drops the depth split.
  auto spec = [&](bool depth) {
    std::string text;
    for (std::size_t i = 0; i < split.size(); ++i) {
      std::string axes = split[i] == Split::Rows ? "1" : split[i] == Split::Cols ? "2" : "";
      if (i == 0 && depth) axes += "3";
      text += axes.empty() ? "R" : "S" + axes;
    }
    return ShardingSpec::parse(text);
  };
  const Mesh mesh = stage_mesh(place_.first, place_.shape);
  const int me = place_.device;
  Param& p = params_.emplace_back(name, Layout(shape, DType::f32, mesh, spec(depth), name));
  p.sparse = sparse;
  p.sharded = depth;
  p.block = Layout(shape, DType::f32, mesh, spec(false), name).tile_of(me);
  p.shard = p.layout.tile_of(me);
  // One device reports each element: the first of the tile's holders.
  const auto index = *mesh.index_of(me);
  std::vector<std::int64_t> shard_index;
  for (std::size_t i = 0; i < p.shape.size(); ++i)
    shard_index.push_back(p.layout.shard_index(i, index));
  p.counted = p.layout.holders(shard_index).front() == index;

  // Every device draws the whole tensor from (seed, name), so the values do not depend on the
  // parallel configuration.
  std::int64_t total = 1;
  for (auto e : p.shape) total *= e;
  std::vector<float> full(static_cast<std::size_t>(total), init == Init::Ones ? 1.0f : 0.0f);
  if (init == Init::Normal) fill_normal(full.data(), total, std_, seed_, name);
  p.value = extract(full, p.shape, p.shard);
  p.grad.assign(static_cast<std::size_t>(p.block_elements()), 0.0f);
  p.synced.assign(p.value.size(), 0.0f);
  p.m.assign(p.value.size(), 0.0f);
  p.v.assign(p.value.size(), 0.0f);
  return p;
}

double Parameters::start_gathers(const Group& depth, bool overlap) {
  double blocked = 0;
  for (auto& p : params_) {
    if (!p.sharded) continue;
    p.full.assign(static_cast<std::size_t>(p.block_elements()), 0.0f);
    p.gather = iall_gather(depth, p.value.data(), p.full.data(), p.block_elements(), DType::f32);
    if (!overlap) timed_wait(p.gather, blocked);
  }
  return blocked;
}

void Parameters::zero_grads() {
  for (auto& p : params_) std::fill(p.grad.begin(), p.grad.end(), 0.0f);
}

std::vector<ParameterPart> Parameters::parts() const {
  std::vector<ParameterPart> out;
  for (const auto& p : params_)
    if (p.counted) out.push_back({p.name, p.shape, p.shard, 0, p.value});
  return out;
}

double Parameters::counted_grad_sum_of_squares() const {
  double s = 0;
  for (const auto& p : params_)
    if (p.counted) s += sum_of_squares(p.synced.data(), static_cast<std::int64_t>(p.synced.size()));
  return s;
}

void Parameters::update(const AdamW& opt, std::int64_t step, float clip) {
  AdamW no_decay = opt;
  no_decay.weight_decay = 0;
  for (auto& p : params_) {
    const auto n = static_cast<std::int64_t>(p.value.size());
    if (clip != 1.0f) scale(p.synced.data(), n, clip);
    // Biases and layernorm gains are not decayed (the usual practice).
    (p.shape.size() == 2 ? opt : no_decay)
        .step(p.value.data(), p.synced.data(), p.m.data(), p.v.data(), n, step);
  }
}

GradSync::GradSync(const PlaceGroups& groups, const Place& place, const CollectiveOptions& options,
                   std::int64_t bucket_bytes, bool overlap)
    : groups_(groups),
      place_(place),
      options_(options),
      bucket_bytes_(bucket_bytes),
      overlap_(overlap) {}

void GradSync::add(Param& p) {
  if (p.sparse && place_.tokens.size() > 1) {
    sparse_.push_back(&p);
    return;
  }
  if (p.sharded) {
    Pending& q = pending_.emplace_back();
    q.params = {&p};
    q.op = ireduce_scatter(groups_.depth, p.grad.data(), p.synced.data(), p.block_elements(),
                           DType::f32, ReduceOp::Sum, options_);
    if (!overlap_) advance(q, true);
    return;
  }
  if (place_.tokens.size() == 1) {
    std::copy(p.grad.begin(), p.grad.end(), p.synced.begin());
    return;
  }
  open_.push_back(&p);
  open_bytes_ += p.block_elements() * 4;
  if (open_bytes_ >= bucket_bytes_) start_bucket();
}

void GradSync::start_bucket() {
  if (open_.empty()) return;
  Pending& q = pending_.emplace_back();
  q.params = std::move(open_);
  open_.clear();
  open_bytes_ = 0;
  for (const Param* p : q.params) q.buffer.insert(q.buffer.end(), p->grad.begin(), p->grad.end());
  q.op =
      iall_reduce(groups_.tokens, q.buffer.data(), q.buffer.data(),
                  static_cast<std::int64_t>(q.buffer.size()), DType::f32, ReduceOp::Sum, options_);
  if (!overlap_) advance(q, true);
}

bool GradSync::advance(Pending& q, bool block, bool may_start) {
  // A reduce-scatter whose replica all-reduce has yet to start.
  auto owes = [&] {
    return !q.params.empty() && q.params.front()->sharded && !q.second &&
           place_.replicas.size() > 1;
  };
  while (!q.params.empty()) {
    if (block)
      timed_wait(q.op, blocked_);
    else if (!q.op.test())
      return !owes();
    if (owes()) {
      if (!may_start) return false;
      Param& first = *q.params.front();
      q.second = true;
      q.op = iall_reduce(groups_.replicas, first.synced.data(), first.synced.data(),
                         static_cast<std::int64_t>(first.synced.size()), DType::f32, ReduceOp::Sum,
                         options_);
      continue;
    }
    complete(q);
  }
  return true;
}

void GradSync::complete(Pending& q) {
  std::size_t at = 0;
  for (Param* p : q.params) {
    if (!q.buffer.empty()) {
      std::copy(q.buffer.begin() + static_cast<std::ptrdiff_t>(at),
                q.buffer.begin() + static_cast<std::ptrdiff_t>(at + p->grad.size()),
                p->synced.begin());
      at += p->grad.size();
    }
  }
  q.params.clear();
}

void GradSync::progress() {
  bool in_order = true;
  for (auto& q : pending_) in_order = advance(q, false, in_order) && in_order;
  while (!pending_.empty() && pending_.front().params.empty()) pending_.pop_front();
}

double GradSync::finish() {
  start_bucket();
  for (auto& q : pending_) advance(q, true);
  pending_.clear();
  const double t0 = now();
  for (Param* p : sparse_) {
    const std::int64_t width = p->block[1].size();
    const SparseRows rows = SparseRows::from_dense(p->grad, p->block[0].size(), width);
    sparse_all_reduce(groups_.tokens, rows, p->synced, SparseMethod::Auto, options_);
  }
  sparse_.clear();
  return blocked_ + now() - t0;
}

}  // namespace meshcast::training
