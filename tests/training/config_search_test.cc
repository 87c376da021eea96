// The configuration search: collective costs by hand on the emulated cluster, the FLOP count by
// hand on one device, and the order's laws (valid, ordered, sums, bubble falling with
// micro-batches, tensor parallelism kept inside a host where the network is slow).
#include "meshcast/training/config_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "meshcast/error.h"
#include "training/stage.h"

namespace meshcast::training {
namespace {

// 5 hosts x 4 devices; 0.75 GB/s, 2 us inside a host; 1 Gbit/s, 12 ms between hosts.
Topology emulated() { return Topology::load(MESHCAST_SOURCE_DIR "/meshes/emulated.json"); }

ModelConfig brief_model() {
  ModelConfig m;
  m.vocab = 256;
  m.seq = 64;
  m.d_model = 128;
  m.heads = 8;
  m.layers = 8;
  return m;
}

TrainConfig batch_of(int batch) {
  TrainConfig t;
  t.batch = batch;
  return t;
}

template <typename F>
std::string field_of(F&& f) {
  try {
    f();
  } catch (const ValidationError& e) {
    return e.field();
  }
  return "(nothing thrown)";
}

TEST(ConfigSearch, CollectiveSecondsWithinOneHost) {
  const Topology t = emulated();
  const std::vector<int> host1{4, 5, 6, 7};
  // A step: the latency, then the sender's overhead and a quarter of the bytes through its port.
  const double mb = 1e6, bw = 0.75e9, lat = 2e-6, step = lat + t.intra().overhead + mb / 4 / bw;
  EXPECT_NEAR(collective_seconds(host1, mb, CollectiveKind::AllReduce, t), 6 * step, 1e-12);
  EXPECT_NEAR(collective_seconds(host1, mb, CollectiveKind::AllGather, t), 3 * step, 1e-12);
  EXPECT_NEAR(collective_seconds(host1, mb, CollectiveKind::ReduceScatter, t), 3 * step, 1e-12);
  EXPECT_EQ(collective_seconds({3}, mb, CollectiveKind::AllReduce, t), 0);
  EXPECT_EQ(collective_seconds({}, mb, CollectiveKind::AllReduce, t), 0);
}

TEST(ConfigSearch, CollectiveSecondsAcrossHosts) {
  const Topology t = emulated();
  const double mb = 1e6, net = 1e9 / 8, lat = 12e-3;
  // Two members send through host 0's one NIC in each step: two thirds of the bytes, which take
  // longer there than through a sender's port.
  const std::vector<int> group{0, 1, 4};
  EXPECT_NEAR(collective_seconds(group, mb, CollectiveKind::AllReduce, t),
              4 * (lat + 2 * mb / 3 / net), 1e-12);
  EXPECT_NEAR(collective_seconds(group, mb, CollectiveKind::AllReduce, t), 0.069333, 1e-6);
  EXPECT_NEAR(collective_seconds(group, mb, CollectiveKind::ReduceScatter, t),
              2 * (lat + 2 * mb / 3 / net), 1e-12);
  // One member per host: each has its host's NIC to itself.
  EXPECT_NEAR(collective_seconds({0, 4}, mb, CollectiveKind::AllGather, t), lat + 0.5 * mb / net,
              1e-12);
}

TEST(ConfigSearch, CollectiveSecondsRejectsBadInputs) {
  const Topology t = emulated();
  EXPECT_EQ(field_of([&] {
              collective_seconds({0, 1}, -1, CollectiveKind::AllReduce, t);
            }),
            "bytes");
  EXPECT_EQ(field_of([&] {
              collective_seconds({0, 20}, 1, CollectiveKind::AllReduce, t);
            }),
            "topology");
}

TEST(ConfigSearch, OneDeviceIsTheSerialRun) {
  ModelConfig m;
  m.vocab = 16;
  m.seq = 4;
  m.d_model = 8;
  m.heads = 2;
  m.layers = 2;
  // Per token: blocks 2 x 3 x (2 (8*24 + 8*8 + 2*8*32) + 4*4*8) = 9984, head 3 x 2*8*16 = 768;
  // 2 samples of 4 tokens: 86016 FLOP, 1 ms at this rate.
  const Machine machine{86016e3};
  const auto ordered =
      search_configurations(m, batch_of(2), 1, Topology::single_host(), machine, 10);
  ASSERT_EQ(ordered.size(), 2u);  // 1 or 2 micro-batches
  for (const auto& p : ordered) {
    ASSERT_EQ(p.parallel.stages.size(), 1u);
    EXPECT_EQ(p.parallel.stages[0], StageShape{});
    EXPECT_NEAR(p.compute, 1e-3, 1e-15);
    EXPECT_EQ(p.tensor_comm + p.data_comm + p.pipeline_comm + p.bubble, 0);
    EXPECT_EQ(p.total, p.compute);
  }
  EXPECT_EQ(ordered[0].str(),
            "pp=1 dp=1 grid=1x1x1 mb=1 1f1b: 1.0 ms = compute 1.0 + tp 0.0 + dp 0.0 + pp 0.0 + "
            "bubble 0.0");
}

TEST(ConfigSearch, EveryConfigurationIsValidUniformAndOrderedByTotal) {
  const Topology t = emulated();
  const ModelConfig m = brief_model();
  const TrainConfig train = batch_of(32);
  const auto ordered = search_configurations(m, train, 20, t, Machine{2e9}, 1000);
  ASSERT_GT(ordered.size(), 20u);
  std::map<int, int> per_pipeline;
  for (std::size_t i = 0; i < ordered.size(); ++i) {
    const ConfigEstimate& p = ordered[i];
    SCOPED_TRACE(p.str());
    EXPECT_NO_THROW(validate(m, p.parallel, train));
    EXPECT_EQ(p.parallel.devices(), 20);
    EXPECT_EQ(p.parallel.topology, &t);
    const int pp = static_cast<int>(p.parallel.stages.size());
    ++per_pipeline[pp];
    for (const StageShape& s : p.parallel.stages) EXPECT_EQ(s, p.parallel.stages[0]);
    EXPECT_EQ(p.parallel.schedule, pp > 1 ? ScheduleKind::Eager1F1B : ScheduleKind::OneFOneB);
    const int mb = p.parallel.micro_batches;
    EXPECT_EQ(mb % pp, 0);
    const int k = mb / pp;
    EXPECT_EQ(k & (k - 1), 0) << "a power of two times pp";
    EXPECT_DOUBLE_EQ(p.total, p.compute + p.tensor_comm + p.data_comm + p.pipeline_comm + p.bubble);
    EXPECT_EQ(p.bubble == 0, pp == 1);
    EXPECT_EQ(p.pipeline_comm == 0, pp == 1);
    if (i > 0) {
      EXPECT_LE(ordered[i - 1].total, p.total);
    }
  }
  // pp = 5 has no micro-batch count dividing 32; 10 and 20 stages exceed the 8 layers.
  EXPECT_EQ(per_pipeline.size(), 3u);
  EXPECT_EQ(per_pipeline.count(5), 0u);

  const auto top3 = search_configurations(m, train, 20, t, Machine{2e9}, 3);
  ASSERT_EQ(top3.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(top3[i].str(), ordered[i].str());
}

TEST(ConfigSearch, SlowNetworkKeepsTensorParallelismInsideAHost) {
  const Topology t = emulated();
  const auto ordered = search_configurations(brief_model(), batch_of(32), 20, t, Machine{2e9}, 1);
  const ParallelConfig& best = ordered.at(0).parallel;
  SCOPED_TRACE(ordered[0].str());
  EXPECT_GT(best.stages[0].rows * best.stages[0].cols * best.stages[0].depth, 1)
      << "the model is worth splitting inside a host";
  auto one_host = [&](const std::vector<int>& group) {
    return std::all_of(group.begin(), group.end(),
                       [&](int d) { return t.host_of(d) == t.host_of(group[0]); });
  };
  for (int d = 0; d < best.devices(); ++d) {
    const Place p = place_of(d, best);
    EXPECT_TRUE(one_host(p.rows) && one_host(p.cols) && one_host(p.depth)) << "device " << d;
  }
}

TEST(ConfigSearch, MoreMicroBatchesLowerTheBubble) {
  const auto ordered =
      search_configurations(brief_model(), batch_of(32), 20, emulated(), Machine{2e9}, 1000);
  // Per pipelined shape, the bubble by micro-batch count.
  std::map<std::pair<int, std::string>, std::map<int, double>> bubbles;
  for (const auto& p : ordered) {
    const int pp = static_cast<int>(p.parallel.stages.size());
    if (pp > 1) bubbles[{pp, to_string(p.parallel.stages[0])}][p.parallel.micro_batches] = p.bubble;
  }
  int compared = 0;
  for (const auto& [shape, by_mb] : bubbles) {
    SCOPED_TRACE("pp=" + std::to_string(shape.first) + " " + shape.second);
    compared += by_mb.size() > 1;
    for (auto it = std::next(by_mb.begin()); it != by_mb.end(); ++it)
      EXPECT_LT(it->second, std::prev(it)->second) << it->first << " micro-batches";
  }
  EXPECT_GE(compared, 2) << "shapes with several micro-batch counts";
}

TEST(ConfigSearch, RejectsBadInputsNamingTheField) {
  const Topology t = emulated();
  const ModelConfig m = brief_model();
  const TrainConfig train = batch_of(32);
  EXPECT_EQ(field_of([&] { search_configurations(m, train, 0, t, Machine{1e9}, 5); }), "devices");
  EXPECT_EQ(field_of([&] { search_configurations(m, train, 4, t, Machine{1e9}, 0); }), "top_k");
  EXPECT_EQ(field_of([&] { search_configurations(m, train, 4, t, Machine{0}, 5); }), "flops");
  EXPECT_EQ(field_of([&] { search_configurations(m, train, 21, t, Machine{1e9}, 5); }), "devices")
      << "the topology places 20";
  EXPECT_EQ(field_of([&] { search_configurations(m, batch_of(0), 4, t, Machine{1e9}, 5); }),
            "batch");
  // 7 devices: no pipeline of 7 stages in 8 layers fits a batch of 4, no grid axis of 7 divides
  // the model, and 7 sample groups need 7 samples.
  EXPECT_EQ(field_of([&] { search_configurations(m, batch_of(4), 7, t, Machine{1e9}, 5); }),
            "devices");
}

}  // namespace
}  // namespace meshcast::training
