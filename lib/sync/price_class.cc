// Auto's choice per class of alike moves (price_class.h).
#include "lib/sync/price_class.h"

#include <algorithm>
#include <bit>
#include <unordered_map>

#include "lib/plan/task_ops.h"

namespace meshcast::detail {
namespace {

// What of extent `e` on a dimension split `a` ways at the source and `b` at the target decides
// its class: its bucket (the octave, then 32 even steps in it: integer math, alike everywhere),
// whether each split divides it and whether it is below each.
std::int64_t extent_class(std::int64_t e, std::int64_t a, std::int64_t b) {
  std::int64_t bucket = -1;
  if (e > 0) {
    const int k = std::bit_width(static_cast<std::uint64_t>(e)) - 1;
    const std::int64_t past = e - (std::int64_t{1} << k);  // < 2^k
    const std::int64_t within = k >= 5 ? past >> (k - 5) : past << (5 - k);
    bucket = k * 32 + within;
  }
  const auto flag = [](bool x, int at) { return static_cast<std::int64_t>(x) << at; };
  return bucket * 16 + flag(e % a == 0, 0) + flag(e % b == 0, 1) + flag(e < a, 2) + flag(e < b, 3);
}

}  // namespace

void add_but_extents(Fnv& f, const Layout& l) {
  f.add(static_cast<std::int64_t>(l.dtype())).add(static_cast<std::int64_t>(l.ndim()));
  f.add(static_cast<std::int64_t>(l.scalar()));
  for (std::int64_t n : l.mesh().shape()) f.add(n);
  f.add(std::int64_t{-1});  // the mesh's shape ends
  for (int d : l.mesh().devices()) f.add(d);
  for (const auto& axes : l.spec().dims()) {
    f.add(static_cast<std::int64_t>(axes.size()));
    for (int a : axes) f.add(a);
  }
  for (int a : l.spec().partial()) f.add(a);
}

bool alike(const Layout& src_a, const Layout& dst_a, const Layout& src_b, const Layout& dst_b) {
  const auto same_but_shape = [](const Layout& x, const Layout& y) {
    return x.dtype() == y.dtype() && x.scalar() == y.scalar() && x.ndim() == y.ndim() &&
           x.mesh() == y.mesh() && x.spec() == y.spec();
  };
  if (!same_but_shape(src_a, src_b) || !same_but_shape(dst_a, dst_b)) return false;
  for (std::size_t d = 0; d < src_a.ndim(); ++d) {
    const std::int64_t s = src_a.splits(d), t = dst_a.splits(d);
    if (extent_class(src_a.shape()[d], s, t) != extent_class(src_b.shape()[d], s, t)) return false;
  }
  return true;
}

std::uint64_t class_digest(const Layout& src, const Layout& dst) {
  Fnv f;
  add_but_extents(f, src);
  add_but_extents(f, dst);
  for (std::size_t d = 0; d < src.ndim(); ++d)
    f.add(extent_class(src.shape()[d], src.splits(d), dst.splits(d)));
  return f.h;
}

std::vector<Strategy> tensor_strategies(const std::vector<const Layout*>& src,
                                        const std::vector<const Layout*>& dst,
                                        const Topology& topology, const PlanOptions& options) {
  std::vector<Strategy> out(src.size(), options.strategy);
  if (options.strategy != Strategy::Auto) return out;
  std::unordered_multimap<std::uint64_t, std::size_t> priced;  // digest -> a move priced
  for (std::size_t t = 0; t < src.size(); ++t) {
    const std::uint64_t digest = class_digest(*src[t], *dst[t]);
    const auto [lo, hi] = priced.equal_range(digest);
    const auto same = std::find_if(lo, hi, [&](const auto& e) {
      return alike(*src[e.second], *dst[e.second], *src[t], *dst[t]);
    });
    if (same != hi) {
      out[t] = out[same->second];
      continue;
    }
    out[t] = tensor_strategy(*src[t], *dst[t], topology, options);
    priced.emplace(digest, t);
  }
  return out;
}

}  // namespace meshcast::detail
