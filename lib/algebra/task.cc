#include "meshcast/task.h"

#include "meshcast/error.h"

namespace meshcast {
namespace {

// One non-empty piece of a dimension: source shard, destination shard, and their overlap.
struct Piece {
  std::int64_t src_shard;
  std::int64_t dst_shard;
  Range range;
};

// Sweeps the sorted shard ranges of one dimension split p ways (source) and q ways (target):
// O(p + q) pieces, each element of [0, n) in exactly one.
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

std::vector<Task> tasks(const Layout& src, const Layout& dst) {
  if (src.shape() != dst.shape())
    throw ValidationError("dst.shape", "shape " + shape_str(dst.shape()) +
                                           " differs from the source's " + shape_str(src.shape()));
  if (src.dtype() != dst.dtype())
    throw ValidationError("dst.dtype", "dtype " + to_string(dst.dtype()) +
                                           " differs from the source's " + to_string(src.dtype()));
  const std::size_t ndim = src.ndim();
  std::vector<std::vector<Piece>> pieces(ndim);
  for (std::size_t d = 0; d < ndim; ++d) {
    pieces[d] = sweep(src.shape()[d], src.splits(d), dst.splits(d));
    if (pieces[d].empty()) return {};  // an empty dimension: nothing to move
  }
  const std::int64_t groups = src.partial_groups();
  std::vector<Task> out;
  std::vector<std::size_t> at(ndim, 0);  // odometer over the product of the pieces
  std::vector<Range> box(ndim);
  std::vector<std::int64_t> s_shard(ndim), d_shard(ndim);
  while (true) {
    for (std::size_t d = 0; d < ndim; ++d) {
      const Piece& pc = pieces[d][at[d]];
      box[d] = pc.range;
      s_shard[d] = pc.src_shard;
      d_shard[d] = pc.dst_shard;
    }
    Task t;
    t.box = Box(box);
    t.sources.resize(static_cast<std::size_t>(groups));
    if (groups == 1) {  // complete source: every holder holds addend 0
      t.sources[0] = device_ids(src.mesh(), src.holders(s_shard));
    } else {
      for (auto i : src.holders(s_shard))
        t.sources[static_cast<std::size_t>(src.partial_group(i))].push_back(src.mesh().device(i));
    }
    auto dst_idx = dst.holders(d_shard);
    if (dst.spec().is_partial())  // only the first addend receives the value
      std::erase_if(dst_idx, [&](auto i) { return dst.partial_group(i) != 0; });
    t.destinations = device_ids(dst.mesh(), dst_idx);
    out.push_back(std::move(t));
    std::size_t d = ndim;
    while (d-- > 0) {
      if (++at[d] < pieces[d].size()) break;
      at[d] = 0;
    }
    if (d == static_cast<std::size_t>(-1)) break;
  }
  return out;
}

}  // namespace meshcast
