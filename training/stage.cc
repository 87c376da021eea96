#include "training/stage.h"

#include <numeric>

#include "meshcast/spec.h"

namespace meshcast::training {

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
    auto group = [&](std::vector<bool> free) {
      std::vector<int> g;
      for (std::int64_t i = 0; i < mesh.size(); ++i) {
        const auto other = mesh.coord(i);
        bool same = true;
        for (std::size_t a = 0; a < 4; ++a) same = same && (free[a] || other[a] == coord[a]);
        if (same) g.push_back(mesh.device(i));
      }
      return g;
    };
    p.replicas = group({true, false, false, false});
    p.rows = group({false, true, false, false});
    p.cols = group({false, false, true, false});
    p.depth = group({false, false, false, true});
    p.tokens = group({true, false, false, true});
    break;
  }
  return p;
}

Layout activation_layout(const ModelConfig& model, int samples, int seq, int first,
                         const StageShape& s) {
  return Layout({samples, seq, model.d_model}, DType::f32, stage_mesh(first, s),
                ShardingSpec::parse("S03RS1"), "activation");
}

}  // namespace meshcast::training
