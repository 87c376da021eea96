// Tasks: the intersection of source and destination tiles. Each task is a box of the global
// tensor, the devices that hold it in the source and the devices that need it in the target.
#pragma once

#include <vector>

#include "meshcast/box.h"
#include "meshcast/layout.h"

namespace meshcast {

struct Task {
  Box box;
  // sources[g]: device ids holding addend g of the box (one entry when the source is complete),
  // in mesh order.
  std::vector<std::vector<int>> sources;
  // Device ids whose destination tile contains the box (for a partial target: the devices of
  // its first addend; the others are zero-filled), in mesh order.
  std::vector<int> destinations;
  friend bool operator==(const Task&, const Task&) = default;
};

// All non-empty tasks of a move src -> dst. Every element of the tensor lies in exactly one
// task's box. Time proportional to the output: a per-dimension interval sweep, then the
// product over dimensions. Throws ValidationError("dst.shape"/"dst.dtype") on mismatch.
std::vector<Task> tasks(const Layout& src, const Layout& dst);

}  // namespace meshcast
