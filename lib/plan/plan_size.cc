#include "meshcast/plan_size.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshcast/limits.h"

namespace meshcast {
namespace {

// Distinct non-empty pieces of [0, n) cut at floor(k n / p) and at floor(k n / q).
double pieces(std::int64_t n, std::int64_t p, std::int64_t q) {
  if (n == 0) return 0;
  std::int64_t count = 0, last = 0, i = 1, j = 1;
  const auto cut = [n](std::int64_t k, std::int64_t parts) {
    return shard_range(n, parts, k - 1).hi;
  };
  while (i <= p || j <= q) {  // merge the two ascending cut sequences
    const std::int64_t a = i <= p ? cut(i, p) : n + 1, b = j <= q ? cut(j, q) : n + 1;
    const std::int64_t next = std::min(a, b);
    if (a == next) ++i;
    if (b == next) ++j;
    if (next > last) ++count, last = next;
  }
  return static_cast<double>(count);
}

double tiles(const Layout& l) {
  double t = 1;
  for (std::size_t d = 0; d < l.ndim(); ++d) t *= static_cast<double>(l.splits(d));
  return t;
}

}  // namespace

PlanSize estimate_plan_size(const Layout& src, const Layout& dst, Strategy strategy) {
  if (strategy == Strategy::Auto) {
    PlanSize best;
    best.bytes = std::numeric_limits<double>::infinity();
    for (Strategy s : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv}) {
      const PlanSize e = estimate_plan_size(src, dst, s);
      if (e.bytes < best.bytes) best = e;
    }
    return best;
  }
  PlanSize e;
  e.boxes = 1;
  for (std::size_t d = 0; d < src.ndim(); ++d)
    e.boxes *= pieces(src.shape()[d], src.splits(d), dst.splits(d));
  const double receivers = static_cast<double>(dst.mesh().size()) / tiles(dst);
  const double holders = static_cast<double>(src.mesh().size()) / tiles(src);
  double ints = holders + receivers;  // the task's lists
  e.ops = e.boxes * (2 + receivers);  // a zero or reduce, a copy or send per receiver
  if (strategy == Strategy::SendRecv) ints += receivers * (holders + 1);
  if (strategy == Strategy::AllGather) {
    e.ops = e.boxes * (2 + 2 * receivers);
    ints += receivers * (holders + receivers);
  }
  // An op: its box (two corners per dimension), peers, a unit's choices, the schedule's entry.
  const double per_op = 192 + 16 * static_cast<double>(src.ndim());
  e.bytes = e.ops * per_op + e.boxes * ints * 4;
  return e;
}

namespace {
std::int64_t clamp(double v) {
  return v >= 9e18 ? std::numeric_limits<std::int64_t>::max() : static_cast<std::int64_t>(v);
}
}  // namespace

void check_plan_size(const PlanSize& size) {
  check_limit("plan ops", clamp(size.ops), limits().plan_ops, "PLAN_OPS");
  check_limit("plan memory", clamp(size.bytes), limits().plan_memory_bytes, "PLAN_MEMORY_BYTES");
}

bool within_limits(const PlanSize& size) {
  return clamp(size.ops) <= limits().plan_ops && clamp(size.bytes) <= limits().plan_memory_bytes;
}

}  // namespace meshcast
