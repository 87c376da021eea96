// The devices holding one addend of one tile of a layout, as a view: how many, the k-th in mesh
// order, and whether a device is one, without listing them. A replicated tile has as many
// holders as the mesh has devices; a device planning its own ops asks about a few of them.
// Internal to lib/.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshcast/layout.h"

namespace meshcast::detail {

class HolderSet {
 public:
  explicit HolderSet(const Layout& layout);
  // Selects the holders of addend `addend` of the tile with shard indices `shard` (per tensor
  // dimension): layout.holders(shard) restricted to partial_group() == addend; addend < 0: the
  // holders of any addend (one membership test where a sum has thousands of addends).
  void select(const std::vector<std::int64_t>& shard, std::int64_t addend);
  std::int64_t size() const { return size_; }
  // The k-th holder's device id, 0 <= k < size().
  int operator[](std::int64_t k) const;
  // Whether device `id` is one of them.
  bool contains(int id) const { return position(id) >= 0; }
  // Its k (operator[](k) == id), or -1 where it is not one of them.
  std::int64_t position(int id) const;

 private:
  const Layout* layout_;
  // Device id -> mesh index (-1: not in the mesh), shared by copies: contains() is asked per
  // receiver of every task a device prices or plans, and Mesh::index_of's binary search
  // dominated. Null where the ids are too sparse for a table.
  std::shared_ptr<const std::vector<std::int32_t>> index_;
  std::vector<std::int64_t> fixed_;   // per mesh axis: its coordinate, or -1 where free
  std::vector<std::int64_t> stride_;  // per mesh axis, row-major
  std::vector<std::size_t> free_;     // the free axes, in order
  std::int64_t base_ = 0;             // the mesh index of holder 0 (the fixed axes' part)
  std::int64_t size_ = 0;
  int only_ = -1;  // the one holder, where size_ is 1 (a tile no other device holds: position()
                   // without a division, asked per target of every task)
};

}  // namespace meshcast::detail
