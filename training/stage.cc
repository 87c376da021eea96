#include "training/stage.h"

#include <array>
#include <numeric>

#include "meshcast/spec.h"

namespace meshcast::training {
namespace {

// The groups of a place, by the axes {dp, R, C, D} along which their members differ.
struct Kind {
  std::vector<int> Place::*devices;
  Group PlaceGroups::*group;
  std::array<bool, 4> free;
};
constexpr Kind kKinds[] = {{&Place::replicas, &PlaceGroups::replicas, {true, false, false, false}},
                           {&Place::rows, &PlaceGroups::rows, {false, true, false, false}},
                           {&Place::cols, &PlaceGroups::cols, {false, false, true, false}},
                           {&Place::depth, &PlaceGroups::depth, {false, false, false, true}},
                           {&Place::tokens, &PlaceGroups::tokens, {true, false, false, true}}};

}  // namespace

Mesh stage_mesh(int first, const StageShape& s) {
  std::vector<int> ids(static_cast<std::size_t>(s.devices()));
  std::iota(ids.begin(), ids.end(), first);
  return Mesh({s.dp, s.rows, s.cols, s.depth}, std::move(ids), "stage");
}

std::vector<int> stage_firsts(const ParallelConfig& parallel) {
  std::vector<int> firsts;
  int next = 0;
  for (const auto& s : parallel.stages) {
    firsts.push_back(next);
    next += s.devices();
  }
  return firsts;
}

Place place_of(int me, const ParallelConfig& parallel) {
  Place p;
  const auto firsts = stage_firsts(parallel);
  for (std::size_t s = 0; s < parallel.stages.size(); ++s) {
    const StageShape& sh = parallel.stages[s];
    if (me < firsts[s] || me >= firsts[s] + sh.devices()) continue;
    p.stage = static_cast<int>(s);
    p.shape = sh;
    p.first = firsts[s];
    p.device = me;
    const Mesh mesh = stage_mesh(p.first, sh);
    const auto coord = mesh.coord(me - p.first);
    p.dp = static_cast<int>(coord[0]);
    p.r = static_cast<int>(coord[1]);
    p.c = static_cast<int>(coord[2]);
    p.d = static_cast<int>(coord[3]);
    // Every device whose coordinates differ from ours only on the axes in `free`.
    auto group = [&](const std::array<bool, 4>& free) {
      std::vector<int> g;
      for (std::int64_t i = 0; i < mesh.size(); ++i) {
        const auto other = mesh.coord(i);
        bool same = true;
        for (std::size_t a = 0; a < 4; ++a) same = same && (free[a] || other[a] == coord[a]);
        if (same) g.push_back(mesh.device(i));
      }
      return g;
    };
    for (const Kind& k : kKinds) p.*k.devices = group(k.free);
    break;
  }
  return p;
}

PlaceGroups place_groups(Communicator& comm, const ParallelConfig& parallel) {
  PlaceGroups mine;
  const auto firsts = stage_firsts(parallel);
  for (std::size_t s = 0; s < parallel.stages.size(); ++s) {
    const StageShape& sh = parallel.stages[s];
    const std::array<int, 4> extent{sh.dp, sh.rows, sh.cols, sh.depth};
    const int n = sh.devices();
    auto coord = [&](int i) {
      std::array<int, 4> c{};
      for (std::size_t a = 4; a-- > 0;) {
        c[a] = i % extent[a];
        i /= extent[a];
      }
      return c;
    };
    for (const Kind& k : kKinds) {
      const std::array<bool, 4>& free = k.free;
      int size = 1;
      for (std::size_t a = 0; a < 4; ++a) size *= free[a] ? extent[a] : 1;
      if (size < 2) continue;
      // A group per device at 0 along the free axes, in mesh order.
      for (int i = 0; i < n; ++i) {
        const auto lead = coord(i);
        bool first = true;
        for (std::size_t a = 0; a < 4; ++a) first = first && (!free[a] || lead[a] == 0);
        if (!first) continue;
        std::vector<int> devices;
        for (int j = i; j < n; ++j) {
          const auto c = coord(j);
          bool same = true;
          for (std::size_t a = 0; a < 4; ++a) same = same && (free[a] || c[a] == lead[a]);
          if (same) devices.push_back(firsts[s] + j);
        }
        Group g = comm.group(std::move(devices));
        if (g.contains(comm.rank())) mine.*k.group = std::move(g);
      }
    }
  }
  return mine;
}

Layout activation_layout(const ModelConfig& model, int samples, int seq, int first,
                         const StageShape& s) {
  return Layout({samples, seq, model.d_model}, DType::f32, stage_mesh(first, s),
                ShardingSpec::parse("S03RS1"), "activation");
}

}  // namespace meshcast::training
