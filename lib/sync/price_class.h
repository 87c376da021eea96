// Auto's choice for a model's tensors, priced once per class of alike moves, within a budget.
// Pricing a move is O(tasks x receivers) (lib/plan/strategy_price.h): a model of 1,000 tensors
// of distinct extents, each all-gathered over 128 devices, took 1.8 s of a device's planning
// when every tensor was priced. A model's tensors mostly share their meshes and specs and differ
// a little in extent (a vocabulary, an expert's width), which moves the strategies' prices
// together.
// Internal to lib/sync/.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/support/fnv.h"
#include "meshcast/layout.h"
#include "meshcast/plan.h"
#include "meshcast/topology.h"

namespace meshcast::detail {

// Moves of one class take the choice of the first priced: equal meshes, specs and dtypes, and
// per dimension extents in the same bucket (32 per octave: within 1/32 of each other, exact
// below 32) that divide alike by either side's splits and are alike below them (so tiles left
// empty, or cut evenly, stay so). Equal moves are always alike.
bool alike(const Layout& src_a, const Layout& dst_a, const Layout& src_b, const Layout& dst_b);
// Adds what a layout is but its extents (dtype, rank, mesh, spec) to `f`.
void add_but_extents(Fnv& f, const Layout& l);
// A digest equal for alike moves (the same in every process of a job).
std::uint64_t class_digest(const Layout& src, const Layout& dst);

// Pricing's budget for one model (AutoChoice::work: link loads added, ten per task walked),
// about 0.2 s of the 2-core development machine. Models of repeated layers spend far less
// (DeepSeek-V3 128 -> 128 on meshes/h100-cluster.json: 0.12 M; 4,096 -> 4,096: 4.9 M); 1,000
// all-gathers over 128 devices, no two alike (bench/uneven_model.py --gather --rotate), would
// spend 198 M: 2.3 s of a device's planning.
inline constexpr std::int64_t kPricingWork = std::int64_t{16} << 20;

// The strategy of each move (`src[t]` to `dst[t]`) under `options`: options.strategy, or for
// Auto, the first alike move's priced choice (auto_strategy), in order. Once the moves priced
// have spent kPricingWork, a move no priced move is alike to is not priced: it takes the choice
// of a priced move akin to it (alike but for device ids and extents: meshes of the same shapes
// that share as many devices, extents that divide alike), the one nearest in size (the first
// priced of the nearest octave of elements), else broadcast (the multicast a sync is built on;
// its parts' sum then bounds the memory, as for priced choices). A device's planning is so
// bounded whatever the model. The same on every device given the same moves in the same order.
// (`budget`: kPricingWork but in tests.)
std::vector<Strategy> tensor_strategies(const std::vector<const Layout*>& src,
                                        const std::vector<const Layout*>& dst,
                                        const Topology& topology, const PlanOptions& options,
                                        std::int64_t budget = kPricingWork);

}  // namespace meshcast::detail
