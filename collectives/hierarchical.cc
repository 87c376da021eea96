// Hierarchical all-reduce: the fast links inside a host carry the reduce-scatter and the
// all-gather; each host's network link carries only 2(H - 1)/H of one local piece per device,
// instead of a ring that crosses hosts with the whole vector.
#include <algorithm>

#include "program.h"

namespace meshcast::detail {

void hierarchical_all_reduce(Program& p, std::span<const int> members, std::size_t me, void* buf,
                             std::int64_t count,
                             const std::vector<std::vector<std::size_t>>& hosts) {
  std::size_t host = 0, local = 0;
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    const auto it = std::find(hosts[h].begin(), hosts[h].end(), me);
    if (it != hosts[h].end()) {
      host = h;
      local = static_cast<std::size_t>(it - hosts[h].begin());
    }
  }
  std::vector<int> inside, across;
  for (std::size_t pos : hosts[host]) inside.push_back(members[pos]);
  for (const auto& h : hosts) across.push_back(members[h[local]]);
  const std::vector<Span> pieces = split(count, inside.size());
  ring_reduce_scatter(p, inside, local, buf, buf, p.at(buf, pieces[local].lo), pieces);
  const Span mine = pieces[local];
  const std::vector<Span> sub = shifted(split(mine.size(), across.size()), mine.lo);
  ring_reduce_scatter(p, across, host, buf, buf, p.at(buf, sub[host].lo), sub);
  ring_all_gather(p, across, host, buf, sub);
  ring_all_gather(p, inside, local, buf, pieces);
}

}  // namespace meshcast::detail
