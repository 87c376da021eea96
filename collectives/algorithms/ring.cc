// Ring reduce-scatter and all-gather: n - 1 rounds each, every member sending one piece to the
// next and receiving one from the previous, so each link carries (n - 1) / n of the data.
#include <algorithm>

#include "program.h"

namespace meshcast::detail {
namespace {

std::size_t mod(std::int64_t a, std::size_t n) {
  const auto m = static_cast<std::int64_t>(n);
  return static_cast<std::size_t>(((a % m) + m) % m);
}

std::int64_t largest(const std::vector<Span>& pieces) {
  std::int64_t m = 0;
  for (const Span& s : pieces) m = std::max(m, s.size());
  return m;
}

}  // namespace

void ring_reduce_scatter(Program& p, std::span<const int> members, std::size_t me, const void* src,
                         void* work, void* mine, const std::vector<Span>& pieces) {
  const std::size_t n = members.size();
  const auto bytes = [&](Span s) { return static_cast<std::size_t>(s.size()) * p.elem(); };
  auto* in_buf = static_cast<std::byte*>(const_cast<void*>(src));
  if (n < 2) {
    p.add_round().copies.push_back(
        {p.at(in_buf, pieces[me].lo), static_cast<std::byte*>(mine), bytes(pieces[me])});
    return;
  }
  const int next = members[(me + 1) % n], prev = members[(me + n - 1) % n];
  const std::size_t most = static_cast<std::size_t>(largest(pieces)) * p.elem();
  // What arrives is staged, then combined with the caller's own piece of src into the partial
  // sum that the next round forwards: no copy of src is made.
  std::byte* staging = p.scratch(most);
  std::byte* slot[2] = {work ? nullptr : p.scratch(most), work ? nullptr : p.scratch(most)};
  const auto m = static_cast<std::int64_t>(me);
  const std::byte* sent = nullptr;  // the partial sum made in the previous round
  for (std::int64_t s = 0; s + 1 < static_cast<std::int64_t>(n); ++s) {
    // After round s, piece me - s - 2 holds s + 2 contributions; after n - 1 rounds, piece me
    // holds all n.
    const Span out = pieces[mod(m - s - 1, n)], in = pieces[mod(m - s - 2, n)];
    const bool last = s + 2 == static_cast<std::int64_t>(n);
    std::byte* to = last ? static_cast<std::byte*>(mine)
                         : (work ? p.at(work, in.lo) : slot[static_cast<std::size_t>(s) % 2]);
    Round& r = p.add_round();
    r.sends.push_back({next, const_cast<std::byte*>(s ? sent : p.at(in_buf, out.lo)), bytes(out)});
    r.recvs.push_back({prev, staging, bytes(in)});
    r.combines.push_back({staging, p.at(in_buf, in.lo), to, in.size()});
    sent = to;
  }
}

void ring_all_gather(Program& p, std::span<const int> members, std::size_t me, void* buf,
                     const std::vector<Span>& pieces) {
  const std::size_t n = members.size();
  if (n < 2) return;
  const int next = members[(me + 1) % n], prev = members[(me + n - 1) % n];
  const auto m = static_cast<std::int64_t>(me);
  for (std::int64_t s = 0; s + 1 < static_cast<std::int64_t>(n); ++s) {
    const Span out = pieces[mod(m - s, n)], in = pieces[mod(m - s - 1, n)];
    Round& r = p.add_round();
    r.sends.push_back({next, p.at(buf, out.lo), static_cast<std::size_t>(out.size()) * p.elem()});
    r.recvs.push_back({prev, p.at(buf, in.lo), static_cast<std::size_t>(in.size()) * p.elem()});
  }
}

// n - 1 rounds in which every member sends one piece (bytes / n) to the next.
double ring_reduce_scatter_cost(const CostOf& c) {
  const std::size_t n = c.members.size();
  if (n < 2) return 0;
  return static_cast<double>(n - 1) * round_cost(c.members, c.t, c.bytes / static_cast<double>(n),
                                                 1, [n](std::size_t i) { return (i + 1) % n; });
}

double ring_all_gather_cost(const CostOf& c) { return ring_reduce_scatter_cost(c); }

double ring_all_reduce_cost(const CostOf& c) { return 2 * ring_reduce_scatter_cost(c); }

}  // namespace meshcast::detail
