// A multicast as a tree of chains (Op::group, Communicator::ibcast's `group`): its n receivers,
// in chain order, are cut into groups of `group` counted from the end (the first group holds the
// n mod group left over, or a whole group). A trunk chain runs from the root through the groups'
// first receivers (their leaders); each leader also starts its group's own chain. A chain of
// thousands of hops pays each hop's latency and pipeline fill; the tree's deepest path has
// about n / group + group hops. group 0 (or 1, or >= n): one chain, root -> r0 -> r1 -> ...
#pragma once

#include <cstdint>

namespace meshcast {

// The receiver (index in chain order) that sends receiver k its data; -1: the root.
inline std::int64_t multicast_parent(std::int64_t k, std::int64_t n, std::int64_t group) {
  if (group < 2 || group >= n) return k - 1;
  const std::int64_t first = n % group ? n % group : group;  // the first group's size
  const bool leader = k == 0 || (k >= first && (k - first) % group == 0);
  if (!leader) return k - 1;
  return k == 0 ? -1 : (k - group > 0 ? k - group : 0);
}

// The number of chains (groups) of such a tree: 1 for a plain chain.
inline std::int64_t multicast_chains(std::int64_t n, std::int64_t group) {
  return group < 2 || group >= n ? 1 : (n + group - 1) / group;
}

}  // namespace meshcast
