#include "meshcast/box.h"

#include <algorithm>
#include <sstream>

namespace meshcast {

Range intersect(Range a, Range b) {
  const std::int64_t lo = std::max(a.lo, b.lo);
  const std::int64_t hi = std::min(a.hi, b.hi);
  return hi > lo ? Range{lo, hi} : Range{lo, lo};
}

Range shard_range(std::int64_t n, std::int64_t p, std::int64_t k) {
  // floor(k*n/p) without overflowing k*n: n = q*p + r, so k*n/p = k*q + floor(k*r/p), with
  // k*r < p*p (p is a product of mesh extents, far below 2^31).
  const std::int64_t q = n / p, r = n % p;
  return {k * q + k * r / p, (k + 1) * q + (k + 1) * r / p};
}

Box Box::whole(const std::vector<std::int64_t>& shape) {
  std::vector<Range> r;
  r.reserve(shape.size());
  for (std::int64_t n : shape) r.push_back({0, n});
  return Box(std::move(r));
}

std::vector<std::int64_t> Box::extents() const {
  std::vector<std::int64_t> e;
  e.reserve(r_.size());
  for (const Range& x : r_) e.push_back(x.size());
  return e;
}

std::vector<std::int64_t> Box::origin() const {
  std::vector<std::int64_t> o;
  o.reserve(r_.size());
  for (const Range& x : r_) o.push_back(x.lo);
  return o;
}

std::int64_t Box::volume() const {
  for (const Range& x : r_)
    if (x.empty()) return 0;  // first: the other extents may overflow together
  std::int64_t v = 1;
  for (const Range& x : r_) v *= x.size();
  return v;
}

bool Box::contains(const Box& inner) const {
  if (inner.ndim() != ndim()) return false;
  if (inner.empty()) return true;
  for (std::size_t i = 0; i < r_.size(); ++i)
    if (inner[i].lo < r_[i].lo || inner[i].hi > r_[i].hi) return false;
  return true;
}

std::string Box::str() const {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < r_.size(); ++i) os << (i ? "," : "") << r_[i].lo << ':' << r_[i].hi;
  os << ']';
  return os.str();
}

Box intersect(const Box& a, const Box& b) {
  std::vector<Range> r;
  r.reserve(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) r.push_back(intersect(a[i], b[i]));
  return Box(std::move(r));
}

std::ostream& operator<<(std::ostream& os, const Box& b) { return os << b.str(); }

}  // namespace meshcast
