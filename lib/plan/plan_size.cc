#include "meshcast/plan_size.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "lib/plan/links.h"
#include "lib/plan/planner.h"
#include "lib/plan/task_ops.h"
#include "lib/support/saturated.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/units.h"

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

// The most distinct non-empty pieces of [0, n) cut as pieces() does that one shard of the
// p-way split holds: the tasks meeting one tile, along one dimension. O(p + q).
double pieces_in_shard(std::int64_t n, std::int64_t p, std::int64_t q) {
  std::int64_t most = 0, j = 1;  // j: the next cut of the q-way split
  for (std::int64_t k = 0; k < p; ++k) {
    const Range shard = shard_range(n, p, k);
    if (shard.empty()) continue;
    while (j < q && shard_range(n, q, j - 1).hi <= shard.lo) ++j;
    std::int64_t inside = 1, last = shard.lo;  // distinct cuts inside the shard, plus one
    for (std::int64_t c = j; c < q; ++c) {
      const std::int64_t cut = shard_range(n, q, c - 1).hi;
      if (cut >= shard.hi) break;
      if (cut > last) ++inside, last = cut;
    }
    most = std::max(most, inside);
  }
  return static_cast<double>(most);
}

double tiles(const Layout& l) {
  double t = 1;
  for (std::size_t d = 0; d < l.ndim(); ++d) t *= static_cast<double>(l.splits(d));
  return t;
}

}  // namespace

namespace {
// The process itself (code, libraries: about 11 MiB resident before planning).
constexpr double kProcessBytes = 16 << 20;
}  // namespace

PlanSize estimate_plan_size(const Layout& src, const Layout& dst, Strategy strategy,
                            Balance balance) {
  if (strategy == Strategy::Auto) {
    PlanSize best;
    best.bytes = std::numeric_limits<double>::infinity();
    for (Strategy s : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv})
      for (Balance b : {balance, Balance::Local}) {
        const PlanSize e = estimate_plan_size(src, dst, s, b);
        if (e.bytes < best.bytes) best = e;
      }
    return best;
  }
  PlanSize e;
  e.strategy = strategy;
  e.balance = balance;
  e.boxes = 1;
  for (std::size_t d = 0; d < src.ndim(); ++d)
    e.boxes *= pieces(src.shape()[d], src.splits(d), dst.splits(d));
  // Per box: its destinations (a partial target's first addend), the holders of each of the
  // source's addends, the devices that copy it (holders that are destinations).
  const auto groups = static_cast<double>(src.partial_groups());
  const double receivers = static_cast<double>(dst.mesh().size()) / tiles(dst) /
                           static_cast<double>(dst.partial_groups());
  const double holders = static_cast<double>(src.mesh().size()) / tiles(src) / groups;
  const double copies =
      groups > 1 ? 0
                 : std::min({receivers, holders, detail::shared_devices(src.mesh(), dst.mesh())});
  double sends = 1, peers = receivers;  // broadcast: one chain through every receiver
  if (strategy == Strategy::SendRecv) sends = receivers;
  if (strategy == Strategy::AllGather) {
    sends = 2 * receivers;           // a slice to each, which each forwards
    peers += receivers * receivers;  // through the others
  }
  e.ops = e.boxes * ((groups > 1 ? 1 : 0) + copies + sends) +
          (dst.spec().is_partial() ? static_cast<double>(dst.mesh().size()) : 0);  // zeros
  // Greedy and search keep every addend's holders once per box, as the candidate senders its
  // transfers share (a unit's choices: a list of views, about 7 words each), and search a copy
  // of every unit (greedy's plan, kept if the search does no better), unless no transfer has a
  // choice (one holder per tile, no pending sum): the planner then builds none's ops. Per op: its
  // box (ndim ranges), peers, the schedule's entry, vector slack; calibrated on `meshcast plan`
  // peak RSS (dense 8,192-device reshard, 4.19 M ops, 3 dimensions: none and local 219 B per op;
  // with a schedule, greedy 371 B, search 722 B).
  const bool scheduled =
      (balance == Balance::Greedy || balance == Balance::Search) && detail::senders_to_choose(src);
  const double ints = peers + groups + (scheduled ? groups * holders + 7 * (sends + groups) : 0);
  const auto ndim = static_cast<double>(src.ndim());
  double per_op = 192 + 32 * ndim, per_int = 8;
  if (scheduled && balance == Balance::Greedy) per_op = 320 + 32 * ndim;
  if (scheduled && balance == Balance::Search) per_op = 640 + 48 * ndim, per_int = 16;
  // Per device: the schedule's and the cost model's link arrays, pricing's, the byte accounts;
  // and the process itself.
  const auto devices = static_cast<double>(src.mesh().size() + dst.mesh().size());
  e.transient = devices * 448 + kProcessBytes;
  e.peers = e.boxes * (peers + groups);
  e.bytes = e.ops * per_op + e.boxes * ints * per_int + e.transient;
  return e;
}

PlanSize estimate_part_size(const Layout& src, const Layout& dst, Strategy strategy,
                            Balance balance) {
  if (strategy == Strategy::Auto) {
    PlanSize best;
    for (Strategy s : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv}) {
      const PlanSize e = estimate_part_size(src, dst, s, balance);
      if (s == Strategy::Broadcast || e.bytes < best.bytes) best = e;
    }
    return best;
  }
  PlanSize e;
  e.strategy = strategy;
  e.balance = balance == Balance::None ? Balance::None : Balance::Local;  // a part's rules
  // The tasks meeting one source tile (a device holds them) and one destination tile (it
  // receives them): the most of any device.
  double held = 1, received = 1;
  for (std::size_t d = 0; d < src.ndim(); ++d) {
    held *= pieces_in_shard(src.shape()[d], src.splits(d), dst.splits(d));
    received *= pieces_in_shard(src.shape()[d], dst.splits(d), src.splits(d));
  }
  const auto groups = static_cast<double>(src.partial_groups());
  const double r = static_cast<double>(dst.mesh().size()) / tiles(dst) /
                   static_cast<double>(dst.partial_groups());
  // Per task a device sends from, and per task it receives: its ops and their peers. Broadcast:
  // the chain (every receiver listed in each); sendrecv: a send per receiver; allgather: a slice
  // per receiver, and at a receiver its slice, its forward and the others' forwards.
  double serve_ops = 1, serve_ints = r, recv_ops = 1, recv_ints = r;
  if (strategy == Strategy::SendRecv) serve_ops = r, recv_ints = 1;
  if (strategy == Strategy::AllGather) serve_ops = r, recv_ops = 1 + r, recv_ints = 1 + r * r;
  double ints = 0;
  if (groups > 1) {  // holders send addends to a reduce, whose root (a target) then serves
    e.ops = held + received * (1 + serve_ops + recv_ops);
    ints = held * groups + received * (groups + serve_ints + recv_ints);
  } else {  // and copy what they also receive (where the meshes share devices)
    const double copy = detail::shared_devices(src.mesh(), dst.mesh()) > 0 ? 1 : 0;
    e.ops = held * (serve_ops + copy) + received * recv_ops;
    ints = held * serve_ints + received * recv_ints;
  }
  e.ops += dst.spec().is_partial() ? 1 : 0;  // its zero-fill
  e.boxes = held + received;
  const auto devices = static_cast<double>(src.mesh().size() + dst.mesh().size());
  e.transient = devices * 448 + kProcessBytes;
  e.peers = ints;
  e.bytes = e.ops * (192 + 32 * static_cast<double>(src.ndim())) + ints * 8 + e.transient;
  return e;
}

double host_bytes(const Topology& topology, const Layout& src, const Layout& dst) {
  std::vector<int> hosts;
  detail::plan_hosts(topology, detail::union_devices(src, dst), hosts);
  // Per host: a NIC's two link loads in the schedule and two in the cost model's links, each
  // with its name slot; the host's device list and flags (2^20 one-device hosts: 208 B each).
  return static_cast<double>(hosts.size()) * (160.0 + 64.0 * topology.nics_per_host());
}

PlanSize with_hosts(PlanSize size, double host_bytes) {
  size.transient += host_bytes;
  size.bytes += host_bytes;
  return size;
}

PlanSize combined(const PlanSize& a, const PlanSize& b) {
  PlanSize c = a;
  c.boxes += b.boxes;
  c.ops += b.ops;
  c.peers += b.peers;
  c.bytes = a.bytes + b.bytes - std::min(a.transient, b.transient);  // one planning at a time
  c.transient = std::max(a.transient, b.transient);
  if (a.strategy != b.strategy) c.strategy = Strategy::Auto;  // each its own
  return c;
}

std::int64_t plan_memory_bound(std::int64_t max_bytes) {
  return max_bytes > 0 ? max_bytes : limits().plan_memory_bytes;
}

std::int64_t plan_memory_share(std::int64_t bound, std::int64_t parts) {
  const auto process = static_cast<std::int64_t>(kProcessBytes);
  parts = std::max<std::int64_t>(1, parts);
  if (bound <= process) return std::max<std::int64_t>(1, bound / parts);
  return process + (bound - process) / parts;
}

void check_plan_size(const PlanSize& size, std::int64_t max_bytes) {
  check_limit("plan ops", detail::saturated_int64(size.ops), limits().plan_ops, "PLAN_OPS");
  const std::int64_t bound = plan_memory_bound(max_bytes),
                     bytes = detail::saturated_int64(size.bytes);
  if (bytes <= bound) return;
  // One line with what the plan would be and the bound, e.g. "plan memory: an estimated
  // 17.00 GiB (1 box, 65538 ops, strategy sendrecv) exceeds the limit of 8.00 GiB (...)".
  std::ostringstream os;
  os << "an estimated " << human_bytes(bytes) << " (" << std::setprecision(4) << size.boxes
     << (size.boxes == 1 ? " box, " : " boxes, ") << size.ops << " ops, strategy "
     << to_string(size.strategy) << ", balance " << to_string(size.balance)
     << ") exceeds the limit of " << human_bytes(bound)
     << (max_bytes > 0 ? " (PlanOptions::max_plan_bytes)"
                       : " (raise it with MESHCAST_MAX_PLAN_MEMORY_BYTES)");
  throw ValidationError("plan memory", os.str());
}

bool within_limits(const PlanSize& size, std::int64_t max_bytes) {
  return detail::saturated_int64(size.ops) <= limits().plan_ops &&
         detail::saturated_int64(size.bytes) <= plan_memory_bound(max_bytes);
}

}  // namespace meshcast
