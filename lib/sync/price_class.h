// Auto's choice for a model's tensors, priced once per class of alike moves. Pricing a move is
// O(tasks x receivers) (lib/plan/strategy_price.h): a model of 1,000 tensors of distinct
// extents, each all-gathered over 128 devices, took 1.8 s of a device's planning when every
// tensor was priced. A model's tensors mostly share their meshes and specs and differ a little
// in extent (a vocabulary, an expert's width), which moves the strategies' prices together.
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

// The strategy of each move (`src[t]` to `dst[t]`) under `options`: options.strategy, or for
// Auto, the first alike move's priced choice (auto_strategy), in order. The same on every
// device given the same moves in the same order.
std::vector<Strategy> tensor_strategies(const std::vector<const Layout*>& src,
                                        const std::vector<const Layout*>& dst,
                                        const Topology& topology, const PlanOptions& options);

}  // namespace meshcast::detail
