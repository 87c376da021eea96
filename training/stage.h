// Where a device sits: its pipeline stage, its coordinates in the stage's dp x R x C x D mesh,
// and the groups it runs collectives with.
#pragma once

#include <vector>

#include "meshcast/communicator.h"
#include "meshcast/layout.h"
#include "meshcast/training/engine.h"

namespace meshcast::training {

struct Place {
  int stage = -1;  // -1: the device takes no part
  StageShape shape;
  int first = 0;    // the stage's first device id
  int device = -1;  // this device's id
  int dp = 0, r = 0, c = 0, d = 0;
  // Devices that differ from this one only in R (rows), C (cols), D (depth), dp, or in dp and D
  // (tokens: the devices that hold the same parameter block and split the samples), in mesh
  // order. The row group sums the partial products of a linear whose input features are split
  // over R, and so on.
  std::vector<int> rows, cols, depth, replicas, tokens;
  bool active() const { return stage >= 0; }
};

// A place's groups as communicator groups, each of more than one device: an empty Group where
// the device is alone along those axes, or takes no part.
struct PlaceGroups {
  Group rows, cols, depth, replicas, tokens;
};
// Every group that place_of() forms on any device of `parallel` (of more than one device), made
// on every device of `comm` in the same order, as Communicator::group requires (stage by stage,
// replicas, rows, cols, depth, tokens, each kind in the mesh order of the groups' first
// devices); each device keeps its own. comm.size() >= parallel.devices().
PlaceGroups place_groups(Communicator& comm, const ParallelConfig& parallel);

// The stage mesh: shape {dp, R, C, D} over consecutive ids from `first`.
Mesh stage_mesh(int first, const StageShape& s);
// The place of device `me` under `parallel` (stage -1 when beyond its devices).
Place place_of(int me, const ParallelConfig& parallel);
// The first device id of each stage.
std::vector<int> stage_firsts(const ParallelConfig& parallel);
// The activations between pieces on stage `s`: [samples, seq, d_model], samples split over dp
// and D (dp major), features over R, replicated over C.
Layout activation_layout(const ModelConfig& model, int samples, int seq, int first,
                         const StageShape& s);

}  // namespace meshcast::training
