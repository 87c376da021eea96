// Hierarchical collectives. The all-reduce: the fast links inside a host carry the
// reduce-scatter and the all-gather; each host's network link carries only 2(H - 1)/H of one
// local piece per device, instead of a ring that crosses hosts with the whole vector. The
// all-gather: a ring across hosts among the devices of each local index (a rail), then one
// exchange inside each host: the bytes over each host's link of a ring in host order, in
// H rounds instead of n - 1. The reduce-scatter: the same in reverse.
#include <algorithm>

#include "meshcast/cost.h"
#include "program.h"

namespace meshcast::detail {
namespace {

// The caller's host and its index there.
std::pair<std::size_t, std::size_t> place_of(const std::vector<std::vector<std::size_t>>& hosts,
                                             std::size_t me) {
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    const auto it = std::find(hosts[h].begin(), hosts[h].end(), me);
    if (it != hosts[h].end()) return {h, static_cast<std::size_t>(it - hosts[h].begin())};
  }
  return {0, 0};
}

}  // namespace

void hierarchical_all_reduce(Program& p, std::span<const int> members, std::size_t me, void* buf,
                             std::int64_t count,
                             const std::vector<std::vector<std::size_t>>& hosts) {
  const auto [host, local] = place_of(hosts, me);
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

void hierarchical_all_gather(Program& p, std::span<const int> members, std::size_t me, void* buf,
                             const std::vector<Span>& pieces,
                             const std::vector<std::vector<std::size_t>>& hosts) {
  const auto [host, local] = place_of(hosts, me);
  std::vector<int> rail;
  std::vector<Span> rail_pieces;
  for (const auto& h : hosts) {
    rail.push_back(members[h[local]]);
    rail_pieces.push_back(pieces[h[local]]);
  }
  ring_all_gather(p, rail, host, buf, rail_pieces);
  // Every member of the host now holds its rail's pieces: it sends them to each other member
  // and receives theirs, in host order on both sides (messages between two members match in
  // the order they are posted).
  Round& r = p.add_round();
  const auto bytes = [&](Span s) { return static_cast<std::size_t>(s.size()) * p.elem(); };
  for (std::size_t l = 0; l < hosts[host].size(); ++l) {
    if (l == local) continue;
    const int peer = members[hosts[host][l]];
    for (const auto& h : hosts) {
      const Span mine = pieces[h[local]], theirs = pieces[h[l]];
      r.sends.push_back({peer, p.at(buf, mine.lo), bytes(mine)});
      r.recvs.push_back({peer, p.at(buf, theirs.lo), bytes(theirs)});
    }
  }
}

void hierarchical_reduce_scatter(Program& p, std::span<const int> members, std::size_t me,
                                 const void* src, void* mine, const std::vector<Span>& pieces,
                                 const std::vector<std::vector<std::size_t>>& hosts) {
  const auto [host, local] = place_of(hosts, me);
  const std::size_t l_count = hosts[host].size();
  const auto bytes = [&](Span s) { return static_cast<std::size_t>(s.size()) * p.elem(); };
  // The caller's rail's pieces (those of the devices of its local index, host by host), packed:
  // `sum` gathers the host's contributions to them, `in` what each other device sends.
  std::vector<Span> packed;
  std::int64_t at = 0;
  for (const auto& h : hosts) {
    packed.push_back({at, at + pieces[h[local]].size()});
    at += packed.back().size();
  }
  auto* from = static_cast<std::byte*>(const_cast<void*>(src));
  std::byte* sum = p.scratch(static_cast<std::size_t>(at) * p.elem());
  std::byte* in = p.scratch(static_cast<std::size_t>(at) * p.elem() * (l_count - 1));
  // One exchange inside the host: each device sends every other one its share of that one's
  // rail, in host order on both sides (messages between two devices match in posting order).
  Round& r = p.add_round();
  for (std::size_t h = 0; h < hosts.size(); ++h)
    r.copies.push_back(
        {p.at(from, pieces[hosts[h][local]].lo), p.at(sum, packed[h].lo), bytes(packed[h])});
  std::size_t slot = 0;
  for (std::size_t l = 0; l < l_count; ++l) {
    if (l == local) continue;
    const int peer = members[hosts[host][l]];
    std::byte* base = in + slot++ * static_cast<std::size_t>(at) * p.elem();
    for (std::size_t h = 0; h < hosts.size(); ++h) {
      const Span theirs = pieces[hosts[h][l]];
      r.sends.push_back({peer, p.at(from, theirs.lo), bytes(theirs)});
      r.recvs.push_back({peer, p.at(base, packed[h].lo), bytes(packed[h])});
    }
    r.combines.push_back({base, sum, sum, at});
  }
  // Then a ring across hosts along the rail: each device ends with its own piece.
  std::vector<int> rail;
  for (const auto& h : hosts) rail.push_back(members[h[local]]);
  ring_reduce_scatter(p, rail, host, sum, nullptr, mine, packed);
}

namespace {

// The rail ring of a hierarchical algorithm: every member sends to the member of its local
// index on the next host, all rails at once (they share each host's NICs).
double rail_rounds(const CostOf& c, const std::vector<std::vector<std::size_t>>& hosts,
                   double rounds, double bytes) {
  std::vector<std::size_t> next(c.members.size());
  for (std::size_t h = 0; h < hosts.size(); ++h)
    for (std::size_t l = 0; l < hosts[h].size(); ++l)
      next[hosts[h][l]] = hosts[(h + 1) % hosts.size()][l];
  return rounds * round_cost(c.members, c.t, bytes, 1, [&](std::size_t i) { return next[i]; });
}

// The exchange inside each host: every member posts `messages` messages of `bytes` to each
// other member of its host (one round; no NIC).
double host_exchange(const CostOf& c, const std::vector<std::vector<std::size_t>>& hosts,
                     double messages, double bytes) {
  const auto l = static_cast<double>(hosts.front().size());
  return round_seconds(bytes, static_cast<std::int64_t>(messages * (l - 1)), 0, c.t);
}

}  // namespace

// A ring inside each host (L - 1 rounds of bytes / L) to reduce-scatter and one to all-gather;
// between them the rails reduce-scatter and all-gather each local piece (2(H - 1) rounds of
// bytes / n).
double hierarchical_all_reduce_cost(const CostOf& c,
                                    const std::vector<std::vector<std::size_t>>& hosts) {
  const auto h = static_cast<double>(hosts.size()), l = static_cast<double>(hosts.front().size());
  const auto n = static_cast<double>(c.members.size());
  return 2 * (l - 1) * round_seconds(c.bytes / l, 1, 0, c.t) +
         rail_rounds(c, hosts, 2 * (h - 1), c.bytes / n);
}

// The rails gather (H - 1 rounds of bytes / n), then each member sends its H pieces to every
// other member of its host.
double hierarchical_all_gather_cost(const CostOf& c,
                                    const std::vector<std::vector<std::size_t>>& hosts) {
  const auto h = static_cast<double>(hosts.size());
  const double piece = c.bytes / static_cast<double>(c.members.size());
  return rail_rounds(c, hosts, h - 1, piece) + host_exchange(c, hosts, h, piece);
}

// The same in reverse.
double hierarchical_reduce_scatter_cost(const CostOf& c,
                                        const std::vector<std::vector<std::size_t>>& hosts) {
  return hierarchical_all_gather_cost(c, hosts);
}

}  // namespace meshcast::detail
