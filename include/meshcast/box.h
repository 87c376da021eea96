// A box is a product of half-open index ranges: the region of a tensor a tile or task covers.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace meshcast {

// [lo, hi); empty when hi <= lo.
struct Range {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  std::int64_t size() const { return hi > lo ? hi - lo : 0; }
  bool empty() const { return hi <= lo; }
  friend bool operator==(const Range&, const Range&) = default;
};

// Intersection of two ranges; empty ranges come back as [x, x).
// intersect({0,4},{2,8}) == {2,4}.
Range intersect(Range a, Range b);

// Shard k of a dimension of n elements split p ways: [floor(k*n/p), floor((k+1)*n/p)).
// Shards may be empty when p > n; together they cover [0, n) exactly once.
// shard_range(10, 4, 1) == {2, 5}. Throws ValidationError("shard") unless n >= 0, p >= 1 and
// 0 <= k < p.
Range shard_range(std::int64_t n, std::int64_t p, std::int64_t k);

class Box {
 public:
  Box() = default;
  explicit Box(std::vector<Range> ranges) : r_(std::move(ranges)) {}
  // The whole tensor of this shape.
  static Box whole(const std::vector<std::int64_t>& shape);

  std::size_t ndim() const { return r_.size(); }
  const Range& operator[](std::size_t i) const { return r_[i]; }
  const std::vector<Range>& ranges() const { return r_; }
  std::vector<std::int64_t> extents() const;
  std::vector<std::int64_t> origin() const;
  // Number of elements (0 when any range is empty); ValidationError("box") past 2^63 - 1.
  std::int64_t volume() const;
  bool empty() const { return volume() == 0; }
  bool contains(const Box& inner) const;
  // "[0:4,2:8]"
  std::string str() const;
  friend bool operator==(const Box&, const Box&) = default;

 private:
  std::vector<Range> r_;
};

// Per-dimension intersection; both boxes must have the same ndim().
Box intersect(const Box& a, const Box& b);

std::ostream& operator<<(std::ostream& os, const Box& b);

}  // namespace meshcast
