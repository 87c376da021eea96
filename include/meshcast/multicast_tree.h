// A multicast as a tree of chains (Op::group, Op::fork, Communicator::ibcast): its n receivers,
// in chain order, are cut into groups of `group` counted from the end (the first group holds the
// n mod group left over, or a whole group). A trunk chain runs from the root through the groups'
// first receivers (their leaders); each leader also starts its group's own chain. A chain of
// thousands of hops pays each hop's latency and pipeline fill; the tree's deepest path has
// about n / group + group hops. group 0 (or 1, or >= n): one chain, root -> r0 -> r1 -> ...
//
// `fork` in (0, n) splits the receivers first: r0 .. r(fork-1) are a chain of their own from the
// root, and the tree of `group` over the others hangs from the root too. The root sends each
// message twice; the others' data then leaves the root's host through the root's NIC, not
// through the last receiver there (whose NIC, in a model's thousands of multicasts, would carry
// a tensor-parallel rank's share of the whole model). fork 0 (or >= n): no split.
#pragma once

#include <cstdint>

namespace meshcast {

// Whether `fork` splits a multicast to n receivers.
inline bool multicast_forks(std::int64_t n, std::int64_t fork) { return fork > 0 && fork < n; }

// The receiver (index in chain order) that sends receiver k its data; -1: the root.
inline std::int64_t multicast_parent(std::int64_t k, std::int64_t n, std::int64_t group,
                                     std::int64_t fork = 0) {
  if (multicast_forks(n, fork)) {
    if (k < fork) return k - 1;
    const std::int64_t p = multicast_parent(k - fork, n - fork, group);
    return p < 0 ? -1 : p + fork;
  }
  if (group < 2 || group >= n) return k - 1;
  const std::int64_t first = n % group ? n % group : group;  // the first group's size
  const bool leader = k == 0 || (k >= first && (k - first) % group == 0);
  if (!leader) return k - 1;
  return k == 0 ? -1 : (k - group > 0 ? k - group : 0);
}

// The number of chains (groups) of such a tree: 1 for a plain chain.
inline std::int64_t multicast_chains(std::int64_t n, std::int64_t group, std::int64_t fork = 0) {
  if (multicast_forks(n, fork)) return 1 + multicast_chains(n - fork, group);
  return group < 2 || group >= n ? 1 : (n + group - 1) / group;
}

}  // namespace meshcast
