// The engine: each device builds its pieces of the model, plans the reshards between pipeline
// stages once, then runs its stage's schedule every step. Transfers between stages are started
// as soon as their data exists (the sender) or at the start of the step (a receiver) and waited
// on only where the data is needed, so that they proceed while the stages compute.
#include "meshcast/training/engine.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "lib/support/require.h"
#include "lib/support/text.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/reshard.h"
#include "training/checkpoint.h"
#include "training/layers.h"
#include "training/ops.h"
#include "training/parameters.h"
#include "training/stage.h"

namespace meshcast::training {
namespace {

using detail::require;

// A piece of the model: consecutive blocks, plus the embedding on the first piece and the head
// on the last.
struct Piece {
  int first_layer = 0, end_layer = 0;
  std::vector<Block> blocks;
  std::optional<Embedding> embed;
  std::optional<Head> head;
  int backwards_done = 0;  // this step
};

// What a piece keeps between a micro-batch's forward and its backward.
struct Saved {
  std::vector<Block::Saved> blocks;
  Head::Saved head;
};

// A tensor that moves between pieces on different meshes (or none): a boundary activation or
// gradient, or a skip connection's, for one micro-batch.
struct Route {
  int src_piece = 0, dst_piece = 0;
  int seq = 0;  // tokens per sample of the tensor it moves
  const Plan* plan = nullptr;
  bool forward() const { return src_piece < dst_piece; }
};

int piece_of_layer(const ModelConfig& model, int pieces, int layer) {
  for (int p = 0; p < pieces; ++p) {
    const Range r = shard_range(model.layers, pieces, p);
    if (layer >= r.lo && layer < r.hi) return p;
  }
  return -1;
}

// The routes of a model cut into `pieces` (plans not yet set): 2p / 2p+1 the forward / backward
// across the boundary after piece p; then, per skip whose ends lie on different pieces, its
// forward and backward. skip_routes[j]: skip j's forward route, -1 when within one piece.
std::vector<Route> routes_of(const ModelConfig& model, int pieces, std::vector<int>& skip_routes) {
  std::vector<Route> routes;
  for (int p = 0; p + 1 < pieces; ++p) {
    const int seq = model.seq_at(static_cast<int>(shard_range(model.layers, pieces, p + 1).lo));
    routes.push_back({p, p + 1, seq});
    routes.push_back({p + 1, p, seq});
  }
  skip_routes.clear();
  for (const auto& [from, to] : model.skips) {
    const int a = piece_of_layer(model, pieces, from), b = piece_of_layer(model, pieces, to);
    if (a == b) {
      skip_routes.push_back(-1);
      continue;
    }
    skip_routes.push_back(static_cast<int>(routes.size()));
    const int seq = model.seq_at(from);  // the output of `from`, before any resampling
    routes.push_back({a, b, seq});
    routes.push_back({b, a, seq});
  }
  return routes;
}

// The groups of a run, made on every device of the communicator in the same order (as
// Communicator::group requires; each device keeps those it belongs to): the run's devices, the
// places' groups, and one per route, of the devices of its two stages. Those are exactly the
// devices that call the route's ireshard, each once per micro-batch in the order the sending stage
// runs them (Runner::post_receives), so that every member starts the group's reshards in the same
// order; a route of its own keeps that order independent of every other route's.
struct RunGroups {
  Group world;
  PlaceGroups place;
  std::vector<Group> routes;

  RunGroups(Communicator& comm, const ModelConfig& model, const ParallelConfig& parallel) {
    std::vector<int> devices(static_cast<std::size_t>(parallel.devices()));
    std::iota(devices.begin(), devices.end(), 0);
    world = devices.size() == static_cast<std::size_t>(comm.size()) ? comm.world()
                                                                    : comm.group(devices);
    place = place_groups(comm, parallel);
    const auto firsts = stage_firsts(parallel);
    const int stages = static_cast<int>(parallel.stages.size());
    std::vector<int> skip_routes;
    for (const Route& r : routes_of(model, stages * parallel.chunks, skip_routes)) {
      std::vector<int> members;
      for (const int s : {r.src_piece % stages, r.dst_piece % stages}) {
        const int first = firsts[static_cast<std::size_t>(s)];
        for (int d = first; d < first + parallel.stages[static_cast<std::size_t>(s)].devices(); ++d)
          if (std::find(members.begin(), members.end(), d) == members.end()) members.push_back(d);
      }
      Group g = comm.group(std::move(members));
      routes.push_back(g.contains(comm.rank()) ? std::move(g) : Group());
    }
  }
};

struct Flight {
  Transfer transfer;
  std::vector<float> src, dst;
  bool receiver = false;  // this device consumes dst
};

class Runner {
 public:
  Runner(Communicator& comm, const RunGroups& groups, const ModelConfig& model,
         const ParallelConfig& parallel, const TrainConfig& train, const BatchSource& batches)
      : groups_(groups),
        model_(model),
        par_(parallel),
        cfg_(train),
        batches_(batches),
        place_(place_of(comm.rank(), parallel)),
        params_(place_, train, model),
        exec_{groups.place, CollectiveOptions{}, parallel.overlap, parallel.sub_batches},
        stages_(static_cast<int>(parallel.stages.size())),
        pieces_(stages_ * parallel.chunks),
        mb_samples_(train.batch / parallel.micro_batches) {
    exec_.options.topology = parallel.topology;
    exec_.poll = [this] { progress(); };
    firsts_ = stage_firsts(parallel);
    build_pieces();
    schedule_ = make_schedule(parallel.schedule, stages_, parallel.micro_batches, parallel.chunks);
    build_routes();
    const Box tile = layout(place_.stage, model.seq).tile_of(comm.rank());
    samples_ = tile[0];
    width_ = tile[2].size();
  }

  StepStats step(int index) {
    StepStats st;
    const double t0 = now();
    exec_.blocked = 0;
    exec_.gemm_flops = exec_.gemm_seconds = 0;
    bubble_ = 0;
    loss_sum_ = 0;
    fill_batch(batches_, index);
    params_.zero_grads();
    waited_ = params_.start_gathers(groups_.place.depth, par_.overlap);
    for (auto& p : pieces_state_) p.backwards_done = 0;
    GradSync sync(groups_.place, place_, exec_.options, par_.bucket_bytes, par_.overlap);
    sync_ = &sync;
    post_receives(false);
    for (const PipeOp& op : schedule_[static_cast<std::size_t>(place_.stage)]) {
      if (op.forward)
        forward(op.piece, op.micro_batch);
      else
        backward(op.piece, op.micro_batch);
      progress();
    }
    double comm = exec_.blocked + waited_;
    const double t1 = now();
    for (auto& [key, f] : flights_) f.transfer.wait();
    flights_.clear();
    comm += now() - t1 + sync.finish();
    sync_ = nullptr;

    // With a pipeline, stages finish their last pass at different times (the drain): wait for
    // every device first, and count that as bubble rather than communication.
    if (stages_ > 1) {
      const double t = now();
      std::int32_t here = 1;
      all_reduce(groups_.world, &here, &here, 1, DType::i32, ReduceOp::Sum, exec_.options);
      bubble_ += now() - t;
    }
    // One all-reduce over every device: the loss and the squared gradient norm.
    const double t2 = now();
    double sums[2] = {place_.r == 0 && place_.c == 0 ? loss_sum_ : 0.0,
                      params_.counted_grad_sum_of_squares()};
    all_reduce(groups_.world, sums, sums, 2, DType::f64, ReduceOp::Sum, exec_.options);
    comm += now() - t2;
    st.loss = sums[0] / static_cast<double>(cfg_.batch * model_.seq);
    st.grad_norm = std::sqrt(sums[1]);
    // The same on every device (one all-reduce): all stop before an update makes weights that are
    // not finite (clipping by an infinite norm gives NaN), or a save keeps them.
    if (!std::isfinite(st.loss) || !std::isfinite(st.grad_norm)) {
      std::ostringstream why;
      why << "step " << index + 1 << "'s loss is " << st.loss << " and its gradient norm "
          << st.grad_norm
          << ": not finite (the run diverged, or its weights were loaded wrong); stopped before "
             "the update, nothing saved, older checkpoints kept";
      throw InternalError("loss", why.str());
    }
    AdamW opt;
    opt.lr = cfg_.lr;
    opt.weight_decay = cfg_.weight_decay;
    params_.update(opt, index + 1, clip_factor(sums[1], cfg_.clip));
    st.seconds = now() - t0;
    st.bubble = bubble_;
    st.exposed_comm = comm;
    st.compute = std::max(0.0, st.seconds - bubble_ - comm);
    st.gemm_flops = exec_.gemm_flops;
    st.gemm_seconds = exec_.gemm_seconds;
    return st;
  }

  // The mean loss on a batch of `source` (forward passes only, pieces in order), on every
  // device.
  double evaluate(const BatchSource& source, int index) {
    fill_batch(source, index);
    loss_sum_ = 0;
    // The weights changed since the step's gathers.
    params_.start_gathers(groups_.place.depth, true);
    post_receives(true);
    for (int p = place_.stage; p < pieces_; p += stages_)
      for (int mb = 0; mb < par_.micro_batches; ++mb) {
        forward(p, mb);
        saved_.erase({p, mb});
        progress();
      }
    for (auto& [key, f] : flights_) f.transfer.wait();
    flights_.clear();
    double sum = place_.r == 0 && place_.c == 0 ? loss_sum_ : 0.0;
    all_reduce(groups_.world, &sum, &sum, 1, DType::f64, ReduceOp::Sum, exec_.options);
    return sum / static_cast<double>(cfg_.batch * model_.seq);
  }

  std::vector<ParameterPart> parts() const { return params_.parts(); }
  Parameters& parameters() { return params_; }
  const Group& world() const { return groups_.world; }

 private:
  int stage_of(int piece) const { return piece % stages_; }
  bool hosts(int piece) const { return stage_of(piece) == place_.stage; }

  void build_pieces() {
    pieces_state_.resize(static_cast<std::size_t>(pieces_));
    for (int p = 0; p < pieces_; ++p) {
      Piece& piece = pieces_state_[static_cast<std::size_t>(p)];
      const Range r = shard_range(model_.layers, pieces_, p);
      piece.first_layer = static_cast<int>(r.lo);
      piece.end_layer = static_cast<int>(r.hi);
      if (!hosts(p)) continue;
      if (p == 0) piece.embed = Embedding::make(params_, place_, model_);
      for (int l = piece.first_layer; l < piece.end_layer; ++l)
        piece.blocks.push_back(Block::make(params_, place_, model_, l));
      if (p == pieces_ - 1) piece.head = Head::make(params_, place_, model_);
    }
  }

  Layout layout(int stage, int seq) const {
    return activation_layout(model_, mb_samples_, seq, firsts_[static_cast<std::size_t>(stage)],
                             par_.stages[static_cast<std::size_t>(stage)]);
  }

  // The plan that moves a micro-batch's activations of `seq` tokens between two stages.
  const Plan* plan_between(int src_stage, int dst_stage, int seq) {
    const std::array<int, 3> key{src_stage, dst_stage, seq};
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      PlanOptions o;
      o.strategy = par_.reshard;
      const Topology topo = par_.topology ? *par_.topology : Topology::single_host();
      it = plans_.emplace(key, plan(layout(src_stage, seq), layout(dst_stage, seq), topo, o)).first;
    }
    return &it->second;
  }

  // The routes and their plans, and the order in which each route's micro-batches are sent in a
  // step: the order in which the sending stage runs the passes of the route's source piece.
  void build_routes() {
    routes_ = routes_of(model_, pieces_, skip_routes_);
    for (Route& r : routes_) {
      r.plan = plan_between(stage_of(r.src_piece), stage_of(r.dst_piece), r.seq);
      // A receiver posts every micro-batch's reshard of a route at the step's start: their
      // tags must fit the route group's window at once, or a reservation would wait for a
      // receive its sender has not reached yet.
      // (A reservation takes at most a window: one alone meets nothing.)
      const std::size_t each =
          std::min<std::size_t>(reshard_tags(r.plan->streams()), groups_.world.window());
      const std::size_t tags = each * static_cast<std::size_t>(par_.micro_batches);
      if (par_.micro_batches > 1 && tags > groups_.world.window())
        throw ValidationError("micro_batches",
                              std::to_string(par_.micro_batches) + " micro-batches of a stage " +
                                  "transfer of " + std::to_string(each) + " tags need " +
                                  std::to_string(tags) + " tags in flight, more than a group's " +
                                  std::to_string(groups_.world.window()) +
                                  "; use fewer micro-batches or fewer devices per stage");
      std::vector<int>& order = send_order_.emplace_back();
      for (const PipeOp& op : schedule_[static_cast<std::size_t>(stage_of(r.src_piece))])
        if (op.piece == r.src_piece && op.forward == r.forward()) order.push_back(op.micro_batch);
    }
  }

  void fill_batch(const BatchSource& source, int index) {
    source(index, batch_);
    require(batch_.inputs.size() == static_cast<std::size_t>(cfg_.batch) * model_.seq &&
                batch_.targets.size() == batch_.inputs.size(),
            "batch", "the batch source gave the wrong number of tokens");
  }

  // Receives this device only consumes are posted when the step starts (forward ones only for
  // an evaluation), in the order the sender starts its side: a route's group runs its reshards
  // in the same order on every member.
  void post_receives(bool evaluation) {
    std::vector<int> ascending(static_cast<std::size_t>(par_.micro_batches));
    std::iota(ascending.begin(), ascending.end(), 0);  // evaluate() runs each piece's in order
    for (std::size_t r = 0; r < routes_.size(); ++r) {
      const Route& route = routes_[r];
      if (!hosts(route.dst_piece) || hosts(route.src_piece)) continue;
      if (evaluation && !route.forward()) continue;
      for (const int mb : evaluation ? ascending : send_order_[r]) {
        Flight& f = flights_[{static_cast<int>(r), mb}];
        f.receiver = true;
        f.dst.assign(static_cast<std::size_t>(activation_elements(route.seq)), 0.0f);
        f.transfer = ireshard(*route.plan, groups_.routes[r], nullptr, f.dst.data());
      }
    }
  }

  std::int64_t activation_elements(int seq) const { return samples_.size() * seq * width_; }

  void send(std::size_t route, int mb, std::vector<float> data) {
    const Route& r = routes_[route];
    Flight& f = flights_[{static_cast<int>(route), mb}];
    f.src = std::move(data);
    f.receiver = hosts(r.dst_piece);
    if (f.receiver) f.dst.assign(static_cast<std::size_t>(activation_elements(r.seq)), 0.0f);
    f.transfer =
        ireshard(*r.plan, groups_.routes[route], f.src.data(), f.receiver ? f.dst.data() : nullptr);
    // Without overlap the sender waits for its transfer (exposed communication).
    if (!par_.overlap && !f.receiver) waited_ += await({static_cast<int>(route), mb});
  }

  // Completes a flight while moving every other one on (a device that only waited on its own
  // request could leave a peer waiting for it); returns the seconds it took.
  double await(std::pair<int, int> key) {
    Transfer& t = flights_.at(key).transfer;
    const double t0 = now();
    int spins = 0;
    while (!t.test()) {
      progress(key);
      if (++spins > 64)
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      else
        std::this_thread::yield();
    }
    return now() - t0;
  }

  // The data of a route for a micro-batch, once it arrived; the wait counts as bubble.
  std::vector<float> take(std::size_t route, int mb) {
    const std::pair<int, int> key{static_cast<int>(route), mb};
    bubble_ += await(key);
    std::vector<float> out = std::move(flights_.at(key).dst);
    flights_.erase(key);
    return out;
  }

  // Moves the transfers and the gradient synchronisation on (never blocks): a few flights a
  // call, round robin, since a step of M micro-batches makes O(M) calls with O(M) flights in
  // flight (testing every one each time, 2048 micro-batches took minutes a step). A device that
  // waits calls it until its flight completes, so every flight is tested in turn meanwhile.
  void progress(std::pair<int, int> skip = {-1, -1}) {
    constexpr std::size_t kFlightsPerCall = 8;
    auto it = flights_.lower_bound(next_flight_);
    for (std::size_t n = std::min(kFlightsPerCall, flights_.size()); n > 0; --n) {
      if (it == flights_.end()) it = flights_.begin();
      if (it->first != skip && it->second.transfer.test() && !it->second.receiver)
        it = flights_.erase(it);
      else
        ++it;
    }
    next_flight_ = it == flights_.end() ? std::pair<int, int>{-1, -1} : it->first;
    if (sync_ != nullptr) sync_->progress();
  }

  // This device's samples of micro-batch `mb` out of `all` (inputs or targets).
  const std::int32_t* sample_tokens(int mb, const std::vector<std::int32_t>& all,
                                    std::vector<std::int32_t>& out) const {
    const std::int64_t s = model_.seq;
    const std::int64_t first = static_cast<std::int64_t>(mb) * mb_samples_ + samples_.lo;
    out.assign(all.begin() + first * s, all.begin() + (first + samples_.size()) * s);
    return out.data();
  }

  void forward(int p, int mb) {
    Piece& piece = pieces_state_[static_cast<std::size_t>(p)];
    Saved& saved = saved_[{p, mb}];
    const std::int64_t b = samples_.size();
    std::vector<float> x;
    if (piece.embed) {
      x.assign(static_cast<std::size_t>(b * model_.seq * width_), 0.0f);
      std::vector<std::int32_t> ids;
      embedding_forward(sample_tokens(mb, batch_.inputs, ids), piece.embed->table->value.data(),
                        piece.embed->pos->value.data(), x.data(), b, model_.seq, width_);
    } else {
      x = take(static_cast<std::size_t>(2 * (p - 1)), mb);
    }
    saved.blocks.resize(piece.blocks.size());
    for (std::size_t i = 0; i < piece.blocks.size(); ++i) {
      const int layer = piece.first_layer + static_cast<int>(i);
      const int seq = model_.seq_at(layer);
      for (std::size_t j = 0; j < model_.skips.size(); ++j)
        if (model_.skips[j].second == layer)
          add_into(skip_in(j, mb, true).data(), x.data(), static_cast<std::int64_t>(x.size()));
      std::vector<float> y(x.size());
      piece.blocks[i].forward(exec_, x.data(), y.data(), b, seq, saved.blocks[i]);
      x = std::move(y);
      for (std::size_t j = 0; j < model_.skips.size(); ++j)
        if (model_.skips[j].first == layer) skip_out(j, mb, true, x);
      x = resample(layer, x, b, seq, true);
      progress();
    }
    if (piece.head) {
      std::vector<std::int32_t> targets;
      loss_sum_ += piece.head->forward(exec_, x.data(), sample_tokens(mb, batch_.targets, targets),
                                       b * model_.seq, saved.head);
    } else {
      send(static_cast<std::size_t>(2 * p), mb, std::move(x));
    }
  }

  void backward(int p, int mb) {
    Piece& piece = pieces_state_[static_cast<std::size_t>(p)];
    Saved& saved = saved_[{p, mb}];
    const std::int64_t b = samples_.size();
    const bool last = ++piece.backwards_done == par_.micro_batches;
    std::vector<float> dy;
    if (piece.head) {
      dy.assign(static_cast<std::size_t>(b * model_.seq * width_), 0.0f);
      std::vector<std::int32_t> targets;
      piece.head->backward(exec_, saved.head, sample_tokens(mb, batch_.targets, targets), dy.data(),
                           b * model_.seq, static_cast<std::int64_t>(cfg_.batch) * model_.seq);
      if (last)
        for (Param* q : {piece.head->ln_g, piece.head->ln_b, piece.head->out.w}) sync_->add(*q);
    } else {
      dy = take(static_cast<std::size_t>(2 * p + 1), mb);
    }
    for (std::size_t i = piece.blocks.size(); i-- > 0;) {
      const int layer = piece.first_layer + static_cast<int>(i);
      const int seq = model_.seq_at(layer);
      dy = resample(layer, dy, b, seq, false);
      for (std::size_t j = 0; j < model_.skips.size(); ++j)
        if (model_.skips[j].first == layer)
          add_into(skip_in(j, mb, false).data(), dy.data(), static_cast<std::int64_t>(dy.size()));
      std::vector<float> dx(dy.size());
      const Block& blk = piece.blocks[i];
      blk.backward(exec_, saved.blocks[i], dy.data(), dx.data(), b, seq);
      dy = std::move(dx);
      for (std::size_t j = 0; j < model_.skips.size(); ++j)
        if (model_.skips[j].second == layer) skip_out(j, mb, false, dy);
      if (last)
        for (Param* q : {blk.fc2.w, blk.fc2.b, blk.fc1.w, blk.fc1.b, blk.ln2_g, blk.ln2_b,
                         blk.proj.w, blk.proj.b, blk.qkv.w, blk.qkv.b, blk.ln1_g, blk.ln1_b})
          sync_->add(*q);
      progress();  // the buckets started so far move on while the next block computes
    }
    if (piece.embed) {
      std::vector<std::int32_t> ids;
      embedding_backward(sample_tokens(mb, batch_.inputs, ids), dy.data(),
                         piece.embed->table->grad.data(), piece.embed->pos->grad.data(), b,
                         model_.seq, width_);
      if (last) {
        sync_->add(*piece.embed->pos);
        sync_->add(*piece.embed->table);
      }
    } else {
      send(static_cast<std::size_t>(2 * (p - 1) + 1), mb, std::move(dy));
    }
    saved_.erase({p, mb});
  }

  // Block `layer`'s resampling of its output (b samples of `seq` tokens in, width_ features):
  // forward, or the gradient's way back (from the resampled length to `seq`).
  std::vector<float> resample(int layer, const std::vector<float>& in, std::int64_t b, int seq,
                              bool fwd) const {
    const Resample r =
        model_.resample.empty() ? Resample::None : model_.resample[static_cast<std::size_t>(layer)];
    if (r == Resample::None) return in;
    const bool halve = r == Resample::Halve;
    // The long sequence has `seq` tokens when halving, 2 seq when doubling.
    const std::int64_t long_seq = halve ? seq : 2 * seq, w = width_;
    const bool to_short = halve == fwd;
    std::vector<float> out(static_cast<std::size_t>(b * (to_short ? long_seq / 2 : long_seq) * w),
                           0.0f);
    // Halving forward averages a pair, so its gradient halves; doubling's gradient sums a pair.
    const float pair = halve ? 0.5f : 1.0f;
    for (std::int64_t s = 0; s < b; ++s)
      for (std::int64_t t = 0; t < long_seq; ++t) {
        const std::int64_t li = (s * long_seq + t) * w, si = (s * (long_seq / 2) + t / 2) * w;
        for (std::int64_t c = 0; c < w; ++c) {
          if (to_short)
            out[static_cast<std::size_t>(si + c)] += pair * in[static_cast<std::size_t>(li + c)];
          else
            out[static_cast<std::size_t>(li + c)] = pair * in[static_cast<std::size_t>(si + c)];
        }
      }
    return out;
  }

  // A skip connection's tensor (forward: the activation; backward: its gradient) arriving at
  // this end, from a local hand-over or a route.
  std::vector<float> skip_in(std::size_t j, int mb, bool fwd) {
    const int route = skip_routes_[j];
    if (route < 0) {
      auto node = local_skips_.extract({static_cast<int>(j) * 2 + (fwd ? 0 : 1), mb});
      return std::move(node.mapped());
    }
    return take(static_cast<std::size_t>(route + (fwd ? 0 : 1)), mb);
  }
  void skip_out(std::size_t j, int mb, bool fwd, const std::vector<float>& data) {
    const int route = skip_routes_[j];
    if (route < 0)
      local_skips_[{static_cast<int>(j) * 2 + (fwd ? 0 : 1), mb}] = data;
    else
      send(static_cast<std::size_t>(route + (fwd ? 0 : 1)), mb, data);
  }

  const RunGroups& groups_;
  const ModelConfig& model_;
  const ParallelConfig& par_;
  const TrainConfig& cfg_;
  const BatchSource& batches_;
  Place place_;
  Parameters params_;
  Exec exec_;
  int stages_, pieces_, mb_samples_;
  std::vector<int> firsts_;
  std::vector<Piece> pieces_state_;
  std::map<std::array<int, 3>, Plan> plans_;  // by (source stage, target stage, seq)
  std::vector<Route> routes_;
  std::vector<int> skip_routes_;  // per skip: its forward route, -1 when within one piece
  std::vector<std::vector<int>> send_order_;  // per route: its micro-batches in sending order
  std::vector<std::vector<PipeOp>> schedule_;
  Range samples_;
  std::int64_t width_ = 0;
  Batch batch_;
  std::map<std::pair<int, int>, Saved> saved_;
  std::map<std::pair<int, int>, Flight> flights_;
  std::pair<int, int> next_flight_{-1, -1};  // where progress() tests on
  std::map<std::pair<int, int>, std::vector<float>> local_skips_;
  GradSync* sync_ = nullptr;
  double bubble_ = 0, loss_sum_ = 0;
  double waited_ = 0;  // blocked outside the layers: weight gathers, sends (overlap off)
};

}  // namespace

int ParallelConfig::devices() const {
  int n = 0;
  for (const auto& s : stages) n += s.devices();
  return n;
}

namespace {
// devices() multiplies ints: counted in double first (four extents of up to 2^31 overflow even
// 64 bits), with the stages before it, and bounded by limits().devices.
void check_stage_devices(const StageShape& s, const std::string& field, double earlier = 0) {
  const double n = earlier + static_cast<double>(s.dp) * s.rows * s.cols * s.depth;
  if (n <= static_cast<double>(limits().devices)) return;
  throw ValidationError(field,
                        std::string(earlier > 0 ? "with the stages before it, " : "") + "needs " +
                            (n < 0x1p62 ? std::to_string(std::llround(n)) : "over 2^62") +
                            " devices, more than the limit of " + std::to_string(limits().devices) +
                            " (raise it with MESHCAST_MAX_DEVICES)");
}
}  // namespace

StageShape parse_stage_shape(const std::string& text, const std::string& field) {
  StageShape s;
  bool tp = false, grid = false;
  // Digits only: no sign, blank or trailing text ("dp=+2", "dp= 2").
  auto number = [&](std::string_view v, const std::string& name) {
    const std::int64_t n = detail::digits_value(v, std::int64_t{1} << 30);
    if (n < 1)
      throw ParseError(field + "." + name, "expected a positive integer, got " + detail::quote(v));
    return static_cast<int>(n);
  };
  std::set<std::string> keys;
  for (std::string_view item : detail::split(text, ',')) {  // "dp=2," has an empty last item
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      throw ParseError(
          field, "expected key=value items (dp=, tp=, grid=RxCxD), got " + detail::quote(item));
    const std::string key(item.substr(0, eq));
    const std::string_view value = item.substr(eq + 1);
    if (!keys.insert(key).second) throw ParseError(field + "." + key, "given twice");
    if (key == "dp") {
      s.dp = number(value, "dp");
    } else if (key == "tp") {
      s.cols = number(value, "tp");
      tp = true;
    } else if (key == "grid") {
      std::vector<int> g;
      for (std::string_view part : detail::split(value, 'x')) g.push_back(number(part, "grid"));
      if (g.size() != 3)
        throw ParseError(field + ".grid",
                         "expected RxCxD (three extents), got " + detail::quote(value));
      s.rows = g[0];
      s.cols = g[1];
      s.depth = g[2];
      grid = true;
    } else {
      throw ParseError(field, "unknown key " + detail::quote(key) + " (expected dp, tp or grid)");
    }
  }
  if (tp && grid) throw ValidationError(field, "give tp (Megatron) or grid (3D), not both");
  check_stage_devices(s, field);
  return s;
}

std::string to_string(const StageShape& s) {
  std::string out = "dp=" + std::to_string(s.dp);
  if (s.rows == 1 && s.depth == 1) return out + ",tp=" + std::to_string(s.cols);
  return out + ",grid=" + std::to_string(s.rows) + "x" + std::to_string(s.cols) + "x" +
         std::to_string(s.depth);
}

BatchSource random_batches(const ModelConfig& model, int batch, std::uint64_t seed) {
  return [model, batch, seed](int step, Batch& out) {
    Rng rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(step));
    const std::size_t s = static_cast<std::size_t>(model.seq);
    out.inputs.resize(static_cast<std::size_t>(batch) * s);
    out.targets.resize(out.inputs.size());
    std::vector<std::int32_t> row(s + 1);
    for (std::size_t b = 0; b < static_cast<std::size_t>(batch); ++b) {
      for (auto& t : row)
        t = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(model.vocab));
      std::copy(row.begin(), row.end() - 1,
                out.inputs.begin() + static_cast<std::ptrdiff_t>(b * s));
      std::copy(row.begin() + 1, row.end(),
                out.targets.begin() + static_cast<std::ptrdiff_t>(b * s));
    }
  };
}

int ModelConfig::seq_at(int layer) const {
  int s = seq;
  for (int l = 0; l < layer && l < static_cast<int>(resample.size()); ++l) {
    if (resample[static_cast<std::size_t>(l)] == Resample::Halve) s /= 2;
    if (resample[static_cast<std::size_t>(l)] == Resample::Double) s *= 2;
  }
  return s;
}

void make_u_shaped(ModelConfig& m) {
  require(m.layers >= 2 && m.layers % 2 == 0, "layers",
          "a U-Transformer needs an even number of blocks, got " + std::to_string(m.layers));
  const int half = m.layers / 2;
  m.causal = false;
  m.skips.clear();
  m.resample.assign(static_cast<std::size_t>(m.layers), Resample::None);
  for (int i = 0; i < half; ++i) {
    m.skips.emplace_back(i, m.layers - 1 - i);
    if (i + 1 < half) {
      m.resample[static_cast<std::size_t>(i)] = Resample::Halve;
      m.resample[static_cast<std::size_t>(m.layers - 2 - i)] = Resample::Double;
    }
  }
}

void validate(const ModelConfig& model, const ParallelConfig& parallel, const TrainConfig& train) {
  require(model.vocab >= 1, "vocab", "must be at least 1");
  require(model.seq >= 1, "seq", "must be at least 1");
  require(model.heads >= 1 && model.d_model >= 1 && model.d_model % model.heads == 0, "heads",
          "must divide d_model (" + std::to_string(model.d_model) + ")");
  require(model.layers >= 1, "layers", "must be at least 1");
  require(model.ffn >= 0, "ffn", "must be >= 0");
  require(model.resample.empty() || model.resample.size() == static_cast<std::size_t>(model.layers),
          "resample", "give one entry per block (or none)");
  // Block by block, seq_at(l) walked along (it walks from the first block: quadratic in them),
  // the message built only for a block that fails (a search checks thousands of candidates).
  std::int64_t seq = model.seq;
  for (int l = 0; l < model.layers; ++l) {
    const Resample r =
        model.resample.empty() ? Resample::None : model.resample[static_cast<std::size_t>(l)];
    if (seq < 1 || (r == Resample::Halve && seq % 2 != 0))
      throw ValidationError("seq", "block " + std::to_string(l) + " halves a sequence of " +
                                       std::to_string(seq) + " tokens");
    if (r == Resample::Halve) seq /= 2;
    if (r == Resample::Double) seq = std::min<std::int64_t>(2 * seq, std::int64_t{1} << 40);
  }
  require(model.seq_at(model.layers) == model.seq, "resample",
          "the last block must give back seq tokens (" + std::to_string(model.seq) + "), not " +
              std::to_string(model.seq_at(model.layers)));
  for (const auto& [a, b] : model.skips)
    require(a >= 0 && b < model.layers && b > a && model.seq_at(a) == model.seq_at(b), "skips",
            "a skip goes from a block to a later one whose input has as many tokens as its "
            "output (" +
                std::to_string(a) + "->" + std::to_string(b) + ")");
  require(!parallel.stages.empty(), "stages", "need at least one pipeline stage");
  require(parallel.chunks >= 1, "chunks", "must be at least 1");
  require(parallel.micro_batches >= 1, "micro_batches", "must be at least 1");
  require(parallel.sub_batches >= 1, "sub_batches", "must be at least 1");
  require(parallel.bucket_bytes >= 1, "bucket_bytes", "must be at least 1");
  require(train.batch >= 1 && train.batch % parallel.micro_batches == 0, "batch",
          "must be a positive multiple of micro_batches (" +
              std::to_string(parallel.micro_batches) + ")");
  require(train.steps >= 0, "steps", "must be >= 0");
  const int pieces = static_cast<int>(parallel.stages.size()) * parallel.chunks;
  require(pieces <= model.layers, "layers",
          std::to_string(model.layers) + " blocks cannot fill " + std::to_string(pieces) +
              " pipeline pieces (stages x chunks)");
  const int mb = train.batch / parallel.micro_batches;
  double devices = 0;
  for (std::size_t i = 0; i < parallel.stages.size(); ++i) {
    const StageShape& s = parallel.stages[i];
    // A stage as the one before (every stage of a searched candidate) passes as it did: only
    // the devices add up (the checks' messages cost thousands of strings per candidate).
    if (i > 0 && s == parallel.stages[i - 1] &&
        devices + s.devices() <= static_cast<double>(limits().devices)) {
      devices += s.devices();
      continue;
    }
    const std::string f = "stages[" + std::to_string(i) + "]";
    require(s.dp >= 1 && s.rows >= 1 && s.cols >= 1 && s.depth >= 1, f,
            "every degree must be at least 1");
    check_stage_devices(s, f, devices);
    devices += s.devices();
    require(model.heads % s.cols == 0, f + ".cols",
            std::to_string(s.cols) + " columns do not divide " + std::to_string(model.heads) +
                " heads");
    require(model.ffn_width() % s.cols == 0, f + ".cols",
            std::to_string(s.cols) + " columns do not divide the MLP width " +
                std::to_string(model.ffn_width()));
    require(
        model.d_model % s.rows == 0, f + ".rows",
        std::to_string(s.rows) + " rows do not divide d_model " + std::to_string(model.d_model));
    // A linear's weight block is sharded by rows over depth: every block's rows must split
    // evenly, so that the shard is a box (a meshcast layout) and a reduce-scatter's range.
    for (const int rows :
         {model.d_model / s.rows, model.d_model / s.cols, model.ffn_width() / s.cols})
      require(rows % s.depth == 0, f + ".depth",
              std::to_string(s.depth) + " depth shards do not divide a weight block of " +
                  std::to_string(rows) + " rows");
    require(mb >= s.dp * s.depth, f,
            "a micro-batch of " + std::to_string(mb) + " samples cannot feed dp x depth = " +
                std::to_string(s.dp * s.depth) + " sample groups");
  }
  check_schedule(parallel.schedule, static_cast<int>(parallel.stages.size()),
                 parallel.micro_batches, parallel.chunks);
}

TrainResult train(Communicator& comm, const ModelConfig& model, const ParallelConfig& parallel,
                  const TrainConfig& train, const BatchSource& batches, const RunOptions& run) {
  validate(model, parallel, train);
  require(comm.size() >= parallel.devices(), "devices",
          "the configuration needs " + std::to_string(parallel.devices()) +
              " devices, the communicator has " + std::to_string(comm.size()));
  require(run.eval_every >= 0, "eval_every", "must be >= 0");
  require(run.checkpoint_every >= 0, "checkpoint_every", "must be >= 0");
  TrainResult result;
  const RunGroups groups(comm, model, parallel);
  if (comm.rank() >= parallel.devices()) return result;
  static std::once_flag blas;
  std::call_once(blas, use_single_threaded_blas);
  Runner runner(comm, groups, model, parallel, train, batches);
  int first = 0;
  if (!run.checkpoint_dir.empty())
    check_checkpoint_size(comm, runner.world().devices(), runner.parameters(), run.description);
  if (run.resume && !run.checkpoint_dir.empty()) {
    LoadStats loaded;
    LoadOptions options;
    options.accept = run.accept_checkpoint;
    result.resumed_from = load_checkpoint(comm, runner.world().devices(), runner.parameters(),
                                          run.checkpoint_dir, options, &loaded);
    if (run.on_resume) run.on_resume(result.resumed_from, loaded.passed_over);
    first = static_cast<int>(std::max<std::int64_t>(0, result.resumed_from));
  }
  for (int s = first; s < train.steps; ++s) {
    StepStats st = runner.step(s);
    st.step = s + 1;
    const bool last = s + 1 == train.steps;
    auto due = [&](int every) { return last || (every > 0 && (s + 1) % every == 0); };
    if (run.held_out != nullptr && due(run.eval_every))
      st.eval_loss = runner.evaluate(*run.held_out, s);
    if (!run.checkpoint_dir.empty() && due(run.checkpoint_every))
      save_checkpoint(comm, runner.world().devices(), runner.parameters(), s + 1,
                      run.checkpoint_dir, run.description);
    if (run.on_step) run.on_step(st);
    result.steps.push_back(st);
  }
  result.parameters = runner.parts();
  return result;
}

}  // namespace meshcast::training
