// Auto's choice per class of alike moves (price_class.h).
#include "lib/sync/price_class.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <map>
#include <optional>
#include <unordered_map>

#include "lib/plan/task_ops.h"

namespace meshcast::detail {
namespace {

// What of extent `e` on a dimension split `a` ways at the source and `b` at the target decides
// its class: its bucket (the octave, then 32 even steps in it: integer math, alike everywhere;
// none if not `bucketed`), whether each split divides it and whether it is below each.
std::int64_t extent_class(std::int64_t e, std::int64_t a, std::int64_t b, bool bucketed = true) {
  std::int64_t bucket = -1;
  if (e > 0 && bucketed) {
    const int k = std::bit_width(static_cast<std::uint64_t>(e)) - 1;
    const std::int64_t past = e - (std::int64_t{1} << k);  // < 2^k
    const std::int64_t within = k >= 5 ? past >> (k - 5) : past << (5 - k);
    bucket = k * 32 + within;
  }
  const auto flag = [](bool x, int at) { return static_cast<std::int64_t>(x) << at; };
  return bucket * 16 + flag(e % a == 0, 0) + flag(e % b == 0, 1) + flag(e < a, 2) + flag(e < b, 3);
}

// A layout but its extents and device ids: dtype, rank, mesh shape, spec.
bool same_form(const Layout& x, const Layout& y) {
  return x.dtype() == y.dtype() && x.scalar() == y.scalar() && x.ndim() == y.ndim() &&
         x.mesh().shape() == y.mesh().shape() && x.spec() == y.spec();
}
// Whether the sources' extents fall in one extent_class per dimension (the moves of one form).
bool extents_alike(const Layout& src_a, const Layout& dst_a, const Layout& src_b, bool bucketed) {
  for (std::size_t d = 0; d < src_a.ndim(); ++d) {
    const std::int64_t s = src_a.splits(d), t = dst_a.splits(d);
    if (extent_class(src_a.shape()[d], s, t, bucketed) !=
        extent_class(src_b.shape()[d], s, t, bucketed))
      return false;
  }
  return true;
}

// Priced moves by class of akin moves, for a model past its pricing budget: alike but for device
// ids (meshes of the same shapes that share as many devices) and extents (those that divide by
// the splits, or are below them, alike). Per class, the first priced move of each octave of
// elements: a move takes the choice of the one nearest in size.
class AkinMoves {
 public:
  AkinMoves(const std::vector<const Layout*>& src, const std::vector<const Layout*>& dst)
      : src_(src), dst_(dst), shared_(src.size(), -1) {}
  void add(std::size_t t) {
    Class* c = find(t);
    if (!c) {
      index_.emplace(digest(t), classes_.size());
      c = &classes_.emplace_back(Class{t, {}});
    }
    c->by_octave.try_emplace(octave(t), t);
  }
  // The priced move akin to move t nearest in size (the smaller on a tie), if any.
  std::optional<std::size_t> nearest(std::size_t t) {
    const Class* c = find(t);
    if (!c) return {};
    const std::map<int, std::size_t>& by = c->by_octave;
    const int o = octave(t);
    const auto above = by.lower_bound(o);
    if (above == by.begin()) return above->second;
    const auto below = std::prev(above);
    if (above == by.end() || o - below->first <= above->first - o) return below->second;
    return above->second;
  }

 private:
  struct Class {
    std::size_t first;                     // its first priced move: akin to all of them
    std::map<int, std::size_t> by_octave;  // the first priced move of each octave
  };
  Class* find(std::size_t t) {  // move t's class, if any
    const auto [lo, hi] = index_.equal_range(digest(t));
    const auto it =
        std::find_if(lo, hi, [&](const auto& e) { return akin(classes_[e.second].first, t); });
    return it == hi ? nullptr : &classes_[it->second];
  }
  bool akin(std::size_t a, std::size_t b) {
    return same_form(*src_[a], *src_[b]) && same_form(*dst_[a], *dst_[b]) &&
           shared(a) == shared(b) && extents_alike(*src_[a], *dst_[a], *src_[b], false);
  }
  double shared(std::size_t t) {  // O(devices log devices): once a move
    double& s = shared_[t];
    if (s < 0) s = shared_devices(src_[t]->mesh(), dst_[t]->mesh());
    return s;
  }
  std::uint64_t digest(std::size_t t) const {
    const Layout &src = *src_[t], &dst = *dst_[t];
    Fnv f;
    for (const Layout* l : {&src, &dst}) {
      f.add(static_cast<std::int64_t>(l->dtype())).add(static_cast<std::int64_t>(l->ndim()));
      for (std::int64_t n : l->mesh().shape()) f.add(n);
    }
    for (std::size_t d = 0; d < src.ndim(); ++d)
      f.add(extent_class(src.shape()[d], src.splits(d), dst.splits(d), false));
    return f.h;
  }
  int octave(std::size_t t) const {
    return std::bit_width(
        static_cast<std::uint64_t>(std::max<std::int64_t>(1, src_[t]->elements())));
  }

  const std::vector<const Layout*>& src_;
  const std::vector<const Layout*>& dst_;
  std::vector<double> shared_;  // per move: shared(), or -1 not yet
  std::vector<Class> classes_;
  std::unordered_multimap<std::uint64_t, std::size_t> index_;  // digest -> class
};

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
  return same_form(src_a, src_b) && src_a.mesh() == src_b.mesh() && same_form(dst_a, dst_b) &&
         dst_a.mesh() == dst_b.mesh() && extents_alike(src_a, dst_a, src_b, true);
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
                                        const Topology& topology, const PlanOptions& options,
                                        std::int64_t budget) {
  std::vector<Strategy> out(src.size(), options.strategy);
  if (options.strategy != Strategy::Auto) return out;
  std::unordered_multimap<std::uint64_t, std::size_t> priced;  // class_digest -> a move priced
  AkinMoves akin(src, dst);
  std::int64_t spent = 0;
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
    if (spent >= budget) {
      const std::optional<std::size_t> near = akin.nearest(t);
      out[t] = near ? out[*near] : Strategy::Broadcast;
      continue;
    }
    std::int64_t work = 0;
    out[t] = tensor_strategy(*src[t], *dst[t], topology, options, &work);
    spent += work;
    priced.emplace(digest, t);
    akin.add(t);
  }
  return out;
}

}  // namespace meshcast::detail
