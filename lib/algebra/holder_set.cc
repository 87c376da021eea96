#include "lib/algebra/holder_set.h"

#include <algorithm>

namespace meshcast::detail {

HolderSet::HolderSet(const Layout& layout) : layout_(&layout) {
  const Mesh& m = layout.mesh();
  const auto& ids = m.devices();
  const auto top = static_cast<std::size_t>(*std::max_element(ids.begin(), ids.end()));
  if (top < 4 * ids.size() + 4096) {
    auto index = std::make_shared<std::vector<std::int32_t>>(top + 1, -1);
    for (std::size_t i = 0; i < ids.size(); ++i)
      (*index)[static_cast<std::size_t>(ids[i])] = static_cast<std::int32_t>(i);
    index_ = std::move(index);
  }
  stride_.assign(m.ndim(), 1);
  for (std::size_t a = m.ndim(); a-- > 1;) stride_[a - 1] = stride_[a] * m.extent(a);
}

void HolderSet::select(const std::vector<std::int64_t>& shard, std::int64_t addend) {
  const Layout& l = *layout_;
  const Mesh& m = l.mesh();
  fixed_.assign(m.ndim(), -1);
  // Splitting axes from the shard indices, partial axes from the addend (mixed radix, major
  // first, as Layout::shard_index and partial_group number them); the rest are free.
  auto fix = [&](const std::vector<int>& axes, std::int64_t k) {
    for (std::size_t j = axes.size(); j-- > 0;) {
      const auto ax = static_cast<std::size_t>(axes[j]);
      fixed_[ax] = k % m.extent(ax);
      k /= m.extent(ax);
    }
  };
  for (std::size_t d = 0; d < l.ndim(); ++d) fix(l.spec().axes(d), shard[d]);
  if (addend >= 0) fix(l.spec().partial(), addend);
  free_.clear();
  size_ = 1;
  base_ = 0;
  for (std::size_t a = 0; a < m.ndim(); ++a)
    if (fixed_[a] < 0) {
      free_.push_back(a);
      size_ *= m.extent(a);
    } else {
      base_ += fixed_[a] * stride_[a];
    }
  only_ = size_ == 1 ? m.device(base_) : -1;
}

int HolderSet::operator[](std::int64_t k) const {
  // Row-major over the free axes (mesh order); the major one takes what is left of k (< its
  // extent), so one free axis costs no division: asked per receiver of every task priced.
  const Mesh& m = layout_->mesh();
  std::int64_t index = base_;
  for (std::size_t j = free_.size(); j-- > 1;) {
    const std::size_t a = free_[j];
    index += (k % m.extent(a)) * stride_[a];
    k /= m.extent(a);
  }
  if (!free_.empty()) index += k * stride_[free_[0]];
  return m.device(index);
}

std::int64_t HolderSet::position(int id) const {
  if (size_ == 1) return id == only_ ? 0 : -1;
  std::int64_t index = -1;
  if (index_) {
    if (id >= 0 && static_cast<std::size_t>(id) < index_->size())
      index = (*index_)[static_cast<std::size_t>(id)];
  } else if (const auto i = layout_->mesh().index_of(id)) {
    index = *i;
  }
  if (index < 0) return -1;
  const Mesh& m = layout_->mesh();
  for (std::size_t a = 0; a < fixed_.size(); ++a)
    if (fixed_[a] >= 0 && (index / stride_[a]) % m.extent(a) != fixed_[a]) return -1;
  std::int64_t k = 0;  // row-major over the free axes, as operator[] counts
  for (std::size_t a : free_) k = k * m.extent(a) + (index / stride_[a]) % m.extent(a);
  return k;
}

}  // namespace meshcast::detail
