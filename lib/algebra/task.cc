#include "meshcast/task.h"

#include <algorithm>

#include "meshcast/error.h"

namespace meshcast {
namespace {

// Sweeps the sorted shard ranges of one dimension split p ways (source) and q ways (target):
// O(p + q) pieces, each element of [0, n) in exactly one.
template <class Piece>
std::vector<Piece> sweep(std::int64_t n, std::int64_t p, std::int64_t q) {
  std::vector<Piece> out;
  std::int64_t i = 0, j = 0;
  while (i < p && j < q) {
    const Range s = shard_range(n, p, i), d = shard_range(n, q, j);
    const Range r = intersect(s, d);
    if (!r.empty()) out.push_back({i, j, r});
    if (s.hi <= d.hi)
      ++i;
    else
      ++j;
  }
  return out;
}

std::vector<int> device_ids(const Mesh& mesh, const std::vector<std::int64_t>& indices) {
  std::vector<int> ids;
  ids.reserve(indices.size());
  for (auto i : indices) ids.push_back(mesh.device(i));
  return ids;
}

}  // namespace

TaskGrid::TaskGrid(const Layout& src, const Layout& dst) : src_(&src), dst_(&dst) {
  if (src.shape() != dst.shape())
    throw ValidationError("dst.shape", "shape " + shape_str(dst.shape()) +
                                           " differs from the source's " + shape_str(src.shape()));
  if (src.dtype() != dst.dtype())
    throw ValidationError("dst.dtype", "dtype " + to_string(dst.dtype()) +
                                           " differs from the source's " + to_string(src.dtype()));
  pieces_.resize(src.ndim());
  size_ = 1;
  for (std::size_t d = 0; d < src.ndim(); ++d) {
    pieces_[d] = sweep<Piece>(src.shape()[d], src.splits(d), dst.splits(d));
    size_ *= static_cast<std::int64_t>(pieces_[d].size());  // <= elements: no overflow
  }
}

void TaskGrid::check_task(std::int64_t i) const {
  if (i < 0 || i >= size_)
    throw ValidationError("task", "index " + std::to_string(i) + " is outside the grid's " +
                                      std::to_string(size_) + " tasks");
}

Box TaskGrid::box(std::int64_t i) const {
  check_task(i);
  std::vector<Range> r(pieces_.size());
  for (std::size_t d = pieces_.size(); d-- > 0;) {
    const auto n = static_cast<std::int64_t>(pieces_[d].size());
    r[d] = pieces_[d][static_cast<std::size_t>(i % n)].range;
    i /= n;
  }
  return Box(std::move(r));
}

void TaskGrid::shards(std::int64_t i, std::vector<std::int64_t>& src_shard,
                      std::vector<std::int64_t>& dst_shard) const {
  check_task(i);
  src_shard.resize(pieces_.size());
  dst_shard.resize(pieces_.size());
  for (std::size_t d = pieces_.size(); d-- > 0;) {
    const auto n = static_cast<std::int64_t>(pieces_[d].size());
    const Piece& pc = pieces_[d][static_cast<std::size_t>(i % n)];
    src_shard[d] = pc.src_shard;
    dst_shard[d] = pc.dst_shard;
    i /= n;
  }
}

Task TaskGrid::task(std::int64_t i) const {
  std::vector<std::int64_t> s_shard, d_shard;
  shards(i, s_shard, d_shard);
  const Layout& src = *src_;
  const Layout& dst = *dst_;
  Task t;
  t.box = box(i);
  const std::int64_t groups = src.partial_groups();
  t.sources.resize(static_cast<std::size_t>(groups));
  if (groups == 1) {  // complete source: every holder holds addend 0
    t.sources[0] = device_ids(src.mesh(), src.holders(s_shard));
  } else {
    for (auto k : src.holders(s_shard))
      t.sources[static_cast<std::size_t>(src.partial_group(k))].push_back(src.mesh().device(k));
  }
  auto dst_idx = dst.holders(d_shard);
  if (dst.spec().is_partial())  // only the first addend receives the value
    std::erase_if(dst_idx, [&](auto k) { return dst.partial_group(k) != 0; });
  t.destinations = device_ids(dst.mesh(), dst_idx);
  return t;
}

std::vector<std::int64_t> TaskGrid::meeting(const Box& region) const {
  // Per dimension, the run of pieces meeting the region's range (pieces are sorted and
  // disjoint); the tasks are the product of the runs, ascending in mixed radix.
  const std::size_t nd = pieces_.size();
  if (region.ndim() != nd)
    throw ValidationError("region", "a " + std::to_string(region.ndim()) + "-D box " +
                                        "for a grid of " + std::to_string(nd) + " dims");
  std::vector<std::size_t> lo(nd), hi(nd);
  for (std::size_t d = 0; d < nd; ++d) {
    const auto& ps = pieces_[d];
    const Range r = region[d];
    lo[d] = static_cast<std::size_t>(
        std::partition_point(ps.begin(), ps.end(),
                             [&](const Piece& p) { return p.range.hi <= r.lo; }) -
        ps.begin());
    hi[d] = static_cast<std::size_t>(
        std::partition_point(ps.begin(), ps.end(),
                             [&](const Piece& p) { return p.range.lo < r.hi; }) -
        ps.begin());
    if (lo[d] >= hi[d]) return {};
  }
  std::vector<std::int64_t> out;
  std::vector<std::size_t> at = lo;
  while (true) {
    std::int64_t i = 0;
    for (std::size_t d = 0; d < nd; ++d)
      i = i * static_cast<std::int64_t>(pieces_[d].size()) + static_cast<std::int64_t>(at[d]);
    out.push_back(i);
    std::size_t d = nd;
    while (d-- > 0) {
      if (++at[d] < hi[d]) break;
      at[d] = lo[d];
    }
    if (d == static_cast<std::size_t>(-1)) break;
  }
  return out;
}

std::vector<Task> tasks(const Layout& src, const Layout& dst) {
  const TaskGrid grid(src, dst);
  std::vector<Task> out;
  out.reserve(static_cast<std::size_t>(grid.size()));
  for (std::int64_t i = 0; i < grid.size(); ++i) out.push_back(grid.task(i));
  return out;
}

}  // namespace meshcast
