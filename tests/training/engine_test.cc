// The parallel engine against the serial run (one device, no pipeline): for every kind of
// parallelism and their combination, the losses of the first steps and the final parameters
// must agree within 1e-4 relative (in norm).
#include "meshcast/training/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "meshcast/error.h"
#include "meshcast/local.h"

namespace mt = meshcast::training;

namespace {

struct Run {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;  // full tensors
};

mt::ModelConfig small_model() {
  mt::ModelConfig m;
  m.vocab = 32;
  m.seq = 8;
  m.d_model = 16;
  m.heads = 4;
  m.layers = 4;
  m.ffn = 32;
  return m;
}

mt::TrainConfig short_training() {
  mt::TrainConfig t;
  t.batch = 8;
  t.steps = 3;
  t.lr = 1e-2f;
  t.clip = 0.5f;  // small enough to clip, so the global norm is exercised
  return t;
}

// Writes each part into its full tensor (row-major block, from its offset on).
void assemble(const mt::ParameterPart& part, std::map<std::string, std::vector<float>>& out) {
  std::int64_t total = 1;
  for (auto e : part.shape) total *= e;
  auto& full = out[part.name];
  if (full.empty()) full.assign(static_cast<std::size_t>(total), NAN);
  const auto ext = part.box.extents();
  const std::int64_t cols = part.shape.size() == 2 ? part.shape[1] : 1;
  const std::int64_t bcols = ext.size() == 2 ? ext[1] : 1;
  for (std::size_t i = 0; i < part.values.size(); ++i) {
    const std::int64_t flat = part.offset + static_cast<std::int64_t>(i);
    const std::int64_t row = part.box[0].lo + flat / bcols;
    const std::int64_t col = (ext.size() == 2 ? part.box[1].lo : 0) + flat % bcols;
    full[static_cast<std::size_t>(row * cols + col)] = part.values[i];
  }
}

Run run(const mt::ModelConfig& model, const mt::ParallelConfig& par, const mt::TrainConfig& t) {
  const int n = par.devices();
  meshcast::LocalWorld world(n);
  std::vector<mt::TrainResult> results(static_cast<std::size_t>(n));
  const auto batches = mt::random_batches(model, t.batch, 7);
  world.run([&](meshcast::Communicator& comm) {
    results[static_cast<std::size_t>(comm.rank())] = mt::train(comm, model, par, t, batches);
  });
  Run r;
  for (const auto& s : results[0].steps) r.losses.push_back(s.loss);
  for (const auto& res : results) {
    EXPECT_EQ(res.steps.size(), static_cast<std::size_t>(t.steps));
    for (std::size_t i = 0; i < res.steps.size(); ++i)
      EXPECT_EQ(res.steps[i].loss, r.losses[i]) << "every device reports the same loss";
    for (const auto& p : res.parameters) assemble(p, r.params);
  }
  return r;
}

mt::ParallelConfig stages(std::vector<std::string> shapes, int micro_batches = 1,
                          mt::ScheduleKind kind = mt::ScheduleKind::OneFOneB, int chunks = 1) {
  mt::ParallelConfig p;
  p.stages.clear();
  for (const auto& s : shapes) p.stages.push_back(mt::parse_stage_shape(s));
  p.micro_batches = micro_batches;
  p.schedule = kind;
  p.chunks = chunks;
  return p;
}

void expect_same_as_serial(const mt::ParallelConfig& par, mt::ModelConfig model = small_model()) {
  const auto t = short_training();
  const Run serial = run(model, stages({"dp=1"}), t);
  const Run parallel = run(model, par, t);
  ASSERT_EQ(parallel.losses.size(), serial.losses.size());
  for (std::size_t i = 0; i < serial.losses.size(); ++i)
    EXPECT_NEAR(parallel.losses[i], serial.losses[i], 1e-4 * std::abs(serial.losses[i]))
        << "step " << i;
  ASSERT_EQ(parallel.params.size(), serial.params.size());
  // Relative errors in norm: of all parameters together (1e-4) and of each tensor (1e-3). Adam
  // divides each gradient element by its own running magnitude, so an element whose gradient
  // nearly cancels moves by an amount that the summation order can change; one such element can
  // dominate a small tensor (a bias) without the model being any different.
  double norm_all = 0, diff_all = 0;
  for (const auto& [name, want] : serial.params) {
    const auto& got = parallel.params.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    double norm = 0, diff = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << name << " element " << i << " reported by no device";
      norm += static_cast<double>(want[i]) * want[i];
      diff += static_cast<double>(got[i] - want[i]) * (got[i] - want[i]);
    }
    EXPECT_LE(std::sqrt(diff), 1e-3 * std::sqrt(norm)) << name;
    norm_all += norm;
    diff_all += diff;
  }
  EXPECT_LE(std::sqrt(diff_all), 1e-4 * std::sqrt(norm_all));
  // The run moved the parameters (so agreeing is not trivial).
  const Run untrained = [&] {
    auto t0 = t;
    t0.steps = 0;
    return run(model, stages({"dp=1"}), t0);
  }();
  EXPECT_NE(untrained.params.at("block0.fc1.w"), serial.params.at("block0.fc1.w"));
}

}  // namespace

TEST(Engine, DataParallel) { expect_same_as_serial(stages({"dp=4"}, 2)); }

TEST(Engine, MegatronTensorParallel) { expect_same_as_serial(stages({"tp=2"})); }

TEST(Engine, MegatronTensorParallelSubBatches) {
  auto p = stages({"tp=4"});
  p.sub_batches = 3;
  expect_same_as_serial(p);
}

TEST(Engine, ThreeDTensorParallel) { expect_same_as_serial(stages({"grid=2x2x2"})); }

TEST(Engine, ThreeDTensorParallelWithDataParallelNoOverlap) {
  auto p = stages({"dp=2,grid=2x1x2"});
  p.overlap = false;
  p.sub_batches = 2;
  expect_same_as_serial(p);
}

// Overlapped, the replicas' all-reduces of the depth shards start as reduce-scatters complete,
// in the same order on every replica.
TEST(Engine, ThreeDTensorParallelWithDataParallelOverlapped) {
  auto p = stages({"dp=2,grid=2x1x2"});
  p.sub_batches = 2;
  expect_same_as_serial(p);
}

// A world larger than the run: the devices beyond it make the run's groups and return; an
// evaluation after every step runs the forward routes again, on the same groups.
TEST(Engine, DevicesBeyondTheRunAndEvaluations) {
  auto model = small_model();
  model.skips = {{0, 3}};
  const auto par = stages({"dp=1", "tp=2", "dp=2"}, 2, mt::ScheduleKind::Eager1F1B);
  const auto t = short_training();
  const auto batches = mt::random_batches(model, t.batch, 7),
             held_out = mt::random_batches(model, t.batch, 8);
  mt::RunOptions opts;
  opts.held_out = &held_out;
  opts.eval_every = 1;
  const int n = par.devices() + 2;
  std::vector<mt::TrainResult> results(static_cast<std::size_t>(n));
  meshcast::LocalWorld world(n);
  world.run([&](meshcast::Communicator& comm) {
    results[static_cast<std::size_t>(comm.rank())] = mt::train(comm, model, par, t, batches, opts);
  });
  for (int d = 0; d < n; ++d) {
    const auto& steps = results[static_cast<std::size_t>(d)].steps;
    if (d >= par.devices()) {
      EXPECT_TRUE(steps.empty()) << "device " << d;
      continue;
    }
    ASSERT_EQ(steps.size(), static_cast<std::size_t>(t.steps)) << "device " << d;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      EXPECT_GT(steps[i].eval_loss, 0) << "device " << d << " step " << i;
      EXPECT_EQ(steps[i].eval_loss, results[0].steps[i].eval_loss) << "device " << d;
    }
  }
}

TEST(Engine, PipelineGPipe) {
  expect_same_as_serial(stages({"dp=1", "dp=1"}, 4, mt::ScheduleKind::GPipe));
}

TEST(Engine, Pipeline1F1B) {
  expect_same_as_serial(stages({"dp=1", "dp=1", "dp=1"}, 4, mt::ScheduleKind::OneFOneB));
}

TEST(Engine, PipelineInterleaved) {
  expect_same_as_serial(stages({"dp=1", "dp=1"}, 4, mt::ScheduleKind::Interleaved, 2));
}

TEST(Engine, PipelineEager1F1B) {
  expect_same_as_serial(stages({"dp=1", "dp=1", "dp=1", "dp=1"}, 8, mt::ScheduleKind::Eager1F1B));
}

TEST(Engine, PipelineAcrossMeshesOfDifferentShapes) {
  // Megatron tp=2 feeds a 3D grid, which feeds two data-parallel replicas: every boundary is a
  // reshard between differently shaped meshes.
  expect_same_as_serial(stages({"tp=2", "grid=2x1x1", "dp=2"}, 2, mt::ScheduleKind::Eager1F1B));
}

TEST(Engine, DataTensorPipelineTogether) {
  expect_same_as_serial(stages({"dp=2,tp=2", "dp=2,tp=2"}, 2, mt::ScheduleKind::OneFOneB));
}

TEST(Engine, SkipAcrossNonAdjacentStages) {
  auto model = small_model();
  model.skips = {{0, 3}, {1, 2}};
  expect_same_as_serial(stages({"dp=1", "tp=2", "dp=1", "dp=2"}, 2, mt::ScheduleKind::Eager1F1B),
                        model);
}

TEST(Engine, UShapedAcrossStages) {
  // Encoder blocks halve the sequence (8 -> 4 -> 2), decoder blocks double it back, and each
  // encoder block's output is added to its mirror's input: skips of different lengths that
  // cross non-adjacent meshes of different shapes, with bidirectional attention.
  auto model = small_model();
  model.layers = 6;
  mt::make_u_shaped(model);
  EXPECT_EQ(model.seq_at(3), 2);
  EXPECT_EQ(model.seq_at(6), 8);
  expect_same_as_serial(stages({"dp=1", "tp=2", "grid=2x1x1", "dp=2", "dp=1", "tp=2"}, 2,
                               mt::ScheduleKind::Eager1F1B),
                        model);
  expect_same_as_serial(stages({"dp=2,tp=2", "dp=1"}, 4, mt::ScheduleKind::OneFOneB), model);
}

TEST(Engine, RejectsConfigurationsThatDoNotFit) {
  const auto m = small_model();
  const auto t = short_training();
  auto field = [&](const mt::ParallelConfig& p, mt::ModelConfig model, mt::TrainConfig tr) {
    try {
      mt::validate(model, p, tr);
    } catch (const meshcast::ValidationError& e) {
      return e.field();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(field(stages({"tp=3"}), m, t), "stages[0].cols");
  EXPECT_EQ(field(stages({"grid=3x1x1"}), m, t), "stages[0].rows");
  EXPECT_EQ(field(stages({"dp=1"}, 3), m, t), "batch");
  EXPECT_EQ(field(stages({"dp=1", "dp=1", "dp=1", "dp=1", "dp=1"}), m, t), "layers");
  EXPECT_EQ(field(stages({"dp=16"}), m, t), "stages[0]");
  EXPECT_EQ(field(stages({"dp=1", "dp=1"}, 3, mt::ScheduleKind::Interleaved, 2), m,
                  [&] {
                    auto x = t;
                    x.batch = 6;
                    return x;
                  }()),
            "micro_batches");
  auto bad = m;
  bad.skips = {{2, 1}};
  EXPECT_EQ(field(stages({"dp=1"}), bad, t), "skips");
  auto odd = m;
  odd.seq = 6;
  odd.layers = 6;
  mt::make_u_shaped(odd);  // 6 -> 3 -> halving 3 tokens
  EXPECT_EQ(field(stages({"dp=1"}), odd, t), "seq");
  auto three = m;
  three.layers = 3;
  EXPECT_THROW(mt::make_u_shaped(three), meshcast::ValidationError);
  EXPECT_EQ(field(stages({"grid=1x1x2"}), m,
                  [&] {
                    auto x = t;
                    x.batch = 8;
                    return x;
                  }()),
            "accepted");
  EXPECT_EQ(field(stages({"grid=1x4x8"}), m,
                  [&] {
                    auto x = t;
                    x.batch = 16;
                    return x;
                  }()),
            "stages[0].depth");
  EXPECT_THROW(mt::parse_stage_shape("dp=2,tp=x"), meshcast::ParseError);
  EXPECT_THROW(mt::parse_stage_shape("tp=2,grid=1x2x1"), meshcast::ValidationError);
  EXPECT_EQ(mt::to_string(mt::parse_stage_shape("dp=2,grid=2x2x1")), "dp=2,grid=2x2x1");
  EXPECT_EQ(mt::to_string(mt::parse_stage_shape("tp=4")), "dp=1,tp=4");
}
