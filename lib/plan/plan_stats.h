// A plan's byte counts (PlanStats, all but the prediction) from its ops: what the planner
// records, and what a saved plan's stats are checked against. Internal to lib/plan/.
#pragma once

#include <cstdint>
#include <vector>

#include "meshcast/error.h"
#include "meshcast/multicast_tree.h"
#include "meshcast/plan.h"

namespace meshcast::detail {

// `where` answers devices() (every device the ops name, sorted), slot(device) (its position
// there) and host(device). A template, not a callback: it is asked per hop of 4 M-op plans.
template <class Where>
PlanStats account(const std::vector<Op>& ops, const Where& where, std::int64_t elem) {
  PlanStats st;
  // Per-device sums in dense arrays (a map update per hop dominated large plans), turned into
  // the maps at the end: a device gets an entry once any hop names it, as with map::operator[].
  const std::vector<int>& devices = where.devices();
  const std::size_t n = devices.size();
  std::vector<std::int64_t> sent(n, 0), received(n, 0);
  std::vector<char> sends(n, 0), receives(n, 0);
  // Every count is at most bytes_moved or bytes_local: those two are checked.
  auto add = [](std::int64_t& sum, std::int64_t bytes) {
    if (__builtin_add_overflow(sum, bytes, &sum))
      throw ValidationError("shape", "the plan moves more than 2^63 - 1 bytes");
  };
  auto hop = [&](int from, int to, std::int64_t bytes) {
    add(st.bytes_moved, bytes);
    const std::size_t f = where.slot(from), t = where.slot(to);
    sent[f] += bytes;
    sends[f] = 1;
    received[t] += bytes;
    receives[t] = 1;
    (where.host(from) == where.host(to) ? st.bytes_intra_host : st.bytes_network) += bytes;
  };
  for (const Op& op : ops) {
    const std::int64_t bytes = op.box.volume() * elem;
    switch (op.kind) {
      case OpKind::Copy:
        add(st.bytes_local, bytes);
        break;
      case OpKind::Zero:
        break;
      case OpKind::Multicast: {  // a chain root -> peers[0] -> peers[1] -> ..., or a tree
        const auto m = static_cast<std::int64_t>(op.peers.size());
        for (std::int64_t k = 0; k < m; ++k) {
          const std::int64_t from = multicast_parent(k, m, op.group, op.fork);
          hop(from < 0 ? op.root : op.peers[static_cast<std::size_t>(from)],
              op.peers[static_cast<std::size_t>(k)], bytes);
        }
        break;
      }
      case OpKind::Reduce:
        for (int c : op.peers)
          if (c == op.root)
            add(st.bytes_local, bytes);
          else
            hop(c, op.root, bytes);
        break;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {  // devices are sorted: append in key order
    if (sends[i]) st.sent.emplace_hint(st.sent.end(), devices[i], sent[i]);
    if (receives[i]) st.received.emplace_hint(st.received.end(), devices[i], received[i]);
  }
  return st;
}

}  // namespace meshcast::detail
