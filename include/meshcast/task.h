// Tasks: the intersection of source and destination tiles. Each task is a box of the global
// tensor, the devices that hold it in the source and the devices that need it in the target.
#pragma once

#include <cstdint>
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

// The tasks of a move as a grid: per dimension, the pieces that the two layouts' cuts make;
// task i is the i-th of their product (the last dimension fastest), tasks(src, dst)[i]. Lets a
// device find the tasks of its own tiles without listing the others. Keeps references to the
// layouts, which must outlive it. Throws as tasks().
class TaskGrid {
 public:
  TaskGrid(const Layout& src, const Layout& dst);
  const Layout& src() const { return *src_; }
  const Layout& dst() const { return *dst_; }
  // Number of tasks (0 when a dimension is empty).
  std::int64_t size() const { return size_; }
  // Taking a task index, these throw ValidationError("task") for one outside [0, size()).
  Box box(std::int64_t i) const;
  // Task i's shard index per dimension in the source and in the destination.
  void shards(std::int64_t i, std::vector<std::int64_t>& src_shard,
              std::vector<std::int64_t>& dst_shard) const;
  // Task i with its holders and destinations listed.
  Task task(std::int64_t i) const;
  // The tasks whose boxes meet `region` (of the tensor's ndim, else ValidationError("region")),
  // ascending. O(ndim log pieces + output).
  std::vector<std::int64_t> meeting(const Box& region) const;

 private:
  void check_task(std::int64_t i) const;
  struct Piece {
    std::int64_t src_shard, dst_shard;
    Range range;
  };
  const Layout* src_;
  const Layout* dst_;
  std::vector<std::vector<Piece>> pieces_;  // per dimension, in order of their ranges
  std::int64_t size_ = 0;
};

// All non-empty tasks of a move src -> dst. Every element of the tensor lies in exactly one
// task's box. Time proportional to the output: a per-dimension interval sweep, then the
// product over dimensions. Throws ValidationError("dst.shape"/"dst.dtype") on mismatch.
std::vector<Task> tasks(const Layout& src, const Layout& dst);

}  // namespace meshcast
