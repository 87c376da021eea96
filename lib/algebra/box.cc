#include "meshcast/box.h"

#include <algorithm>
#include <sstream>

#include "meshcast/error.h"

namespace meshcast {

Range intersect(Range a, Range b) {
  const std::int64_t lo = std::max(a.lo, b.lo);
  const std::int64_t hi = std::min(a.hi, b.hi);
  return hi > lo ? Range{lo, hi} : Range{lo, lo};
}

namespace {
__extension__ typedef __int128 i128;  // (GCC's and Clang's; -pedantic would refuse it bare)

// floor(k*n/p) without overflowing k*n: n = q*p + r, so k*n/p = k*q + floor(k*r/p), and k*r
// (below p*p) fits 64 bits unless p is past 2^31 (mesh extents never are; 128 bits then).
std::int64_t shard_start(std::int64_t q, std::int64_t r, std::int64_t p, std::int64_t k) {
  std::int64_t kr;
  if (!__builtin_mul_overflow(k, r, &kr)) return k * q + kr / p;
  return k * q + static_cast<std::int64_t>(static_cast<i128>(k) * r / p);
}
}  // namespace

Range shard_range(std::int64_t n, std::int64_t p, std::int64_t k) {
  if (p < 1 || n < 0 || k < 0 || k >= p)
    throw ValidationError("shard", "shard " + std::to_string(k) + " of " + std::to_string(n) +
                                       " elements split " + std::to_string(p) +
                                       " ways (n >= 0 and 0 <= k < p)");
  const std::int64_t q = n / p, r = n % p;
  return {shard_start(q, r, p, k), shard_start(q, r, p, k + 1)};
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
  for (const Range& x : r_)
    if (__builtin_mul_overflow(v, x.size(), &v))
      throw ValidationError("box", str() + " holds more than 2^63 - 1 elements");
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
