// Recursive doubling: log2(n) rounds in which partners exchange the whole piece and combine it,
// for small messages where the ring's 2(n - 1) rounds of latency dominate. Both partners compute
// a op b (op is commutative), so every member ends with the same bits.
#include <algorithm>

#include "program.h"

namespace meshcast::detail {

void recursive_doubling_all_reduce(Program& p, std::span<const int> members, std::size_t me,
                                   void* buf, Span piece) {
  const std::size_t n = members.size();
  if (n < 2) return;
  std::size_t p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const std::size_t extra = n - p2;  // members p2 .. n-1 fold into members 0 .. extra-1
  const std::size_t bytes = static_cast<std::size_t>(piece.size()) * p.elem();
  std::byte* data = p.at(buf, piece.lo);
  std::byte* staging = p.scratch(bytes);
  auto exchange = [&](int peer, bool send, bool recv, bool combine) {
    Round& r = p.add_round();
    if (send) r.sends.push_back({peer, data, bytes});
    if (recv) r.recvs.push_back({peer, combine ? staging : data, bytes});
    if (combine) r.combines.push_back({staging, data, data, piece.size()});
  };
  if (me >= p2) {  // hand the data in, get the result back
    exchange(members[me - p2], true, false, false);
    exchange(members[me - p2], false, true, false);
    return;
  }
  if (me < extra) exchange(members[me + p2], false, true, true);
  for (std::size_t mask = 1; mask < p2; mask *= 2) exchange(members[me ^ mask], true, true, true);
  if (me < extra) exchange(members[me + p2], true, false, false);
}

}  // namespace meshcast::detail

namespace meshcast::detail {

void doubling_all_gather(Program& p, std::span<const int> members, std::size_t me, void* buf,
                         const std::vector<Span>& pieces) {
  // Blocks of 1, 2, 4 ... pieces, aligned, each exchanged whole with the partner.
  auto range = [&](std::size_t a, std::size_t b) { return Span{pieces[a].lo, pieces[b - 1].hi}; };
  const auto bytes = [&](Span s) { return static_cast<std::size_t>(s.size()) * p.elem(); };
  std::size_t lo = me;
  for (std::size_t mask = 1; mask < members.size(); mask *= 2) {
    const std::size_t base = lo & ~(2 * mask - 1);
    const Span mine = range(lo, lo + mask);
    const Span theirs =
        (lo & mask) ? range(base, base + mask) : range(base + mask, base + 2 * mask);
    Round& r = p.add_round();
    r.sends.push_back({members[me ^ mask], p.at(buf, mine.lo), bytes(mine)});
    r.recvs.push_back({members[me ^ mask], p.at(buf, theirs.lo), bytes(theirs)});
    lo = base;
  }
}

void bruck_all_gather(Program& p, std::span<const int> members, std::size_t me, void* buf,
                      const std::vector<Span>& pieces) {
  // Before the round of distance d a member holds the d pieces from its own on (cyclically); it
  // sends up to n - d of them to the member d before it and gets as many from the member d
  // after. Pieces stay in place, so a cyclic run of them is one span of buf, or two at the wrap.
  const std::size_t n = members.size();
  auto add = [&](std::vector<Message>& to, int peer, std::size_t first, std::size_t count) {
    while (count) {
      const std::size_t run = std::min(count, n - first);
      const Span s{pieces[first].lo, pieces[first + run - 1].hi};
      to.push_back({peer, p.at(buf, s.lo), static_cast<std::size_t>(s.size()) * p.elem()});
      count -= run;
      first = 0;
    }
  };
  for (std::size_t d = 1; d < n; d *= 2) {
    const std::size_t count = std::min(d, n - d);
    Round& r = p.add_round();
    add(r.sends, members[(me + n - d) % n], me, count);
    add(r.recvs, members[(me + d) % n], (me + d) % n, count);
  }
}

void halving_doubling_all_reduce(Program& p, std::span<const int> members, std::size_t me,
                                 const void* src, void* buf, std::int64_t count) {
  const std::size_t n = members.size();
  const std::size_t total = static_cast<std::size_t>(count) * p.elem();
  if (src != buf)
    p.add_round().copies.push_back(
        {static_cast<const std::byte*>(src), static_cast<std::byte*>(buf), total});
  if (n < 2) return;
  std::size_t p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const std::size_t extra = n - p2;
  std::byte* data = static_cast<std::byte*>(buf);
  auto round = [&](int peer, Span out, Span in, std::byte* staging) {
    Round& r = p.add_round();
    r.sends.push_back({peer, p.at(data, out.lo), static_cast<std::size_t>(out.size()) * p.elem()});
    r.recvs.push_back({peer, staging ? staging : p.at(data, in.lo),
                       static_cast<std::size_t>(in.size()) * p.elem()});
    if (staging) r.combines.push_back({staging, p.at(data, in.lo), p.at(data, in.lo), in.size()});
  };
  if (me >= p2) {  // fold in, get the result back (as in recursive doubling)
    p.add_round().sends.push_back({members[me - p2], data, total});
    p.add_round().recvs.push_back({members[me - p2], data, total});
    return;
  }
  if (me < extra) {
    std::byte* staging = p.scratch(total);
    Round& r = p.add_round();
    r.recvs.push_back({members[me + p2], staging, total});
    r.combines.push_back({staging, data, data, count});
  }
  const std::vector<Span> pieces = split(count, p2);
  auto range = [&](std::size_t a, std::size_t b) { return Span{pieces[a].lo, pieces[b - 1].hi}; };
  // Recursive halving: each round keeps the half of the current block that holds the caller's
  // piece, sends the other half to the partner and combines the partner's copy of its own half.
  std::byte* staging =
      p.scratch(static_cast<std::size_t>(range(0, p2).size() / 2 + 1) * p.elem() + p.elem() * p2);
  std::size_t lo = 0, hi = p2;
  for (std::size_t mask = p2 / 2; mask >= 1; mask /= 2) {
    const std::size_t mid = (lo + hi) / 2;
    const bool upper = (me & mask) != 0;
    const Span keep = upper ? range(mid, hi) : range(lo, mid);
    const Span give = upper ? range(lo, mid) : range(mid, hi);
    round(members[me ^ mask], give, keep, staging);
    (upper ? lo : hi) = mid;
  }
  doubling_all_gather(p, members.first(p2), me, buf, pieces);
  if (me < extra) p.add_round().sends.push_back({members[me + p2], data, total});
}

namespace {

std::size_t power_below(std::size_t n) {
  std::size_t p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  return p2;
}

}  // namespace

// log2(p2) rounds exchanging the whole vector with the partner (i ^ mask), and for members
// beyond the largest power of two p2 one round to fold in and one to hand the result back.
double recursive_doubling_all_reduce_cost(const CostOf& c) {
  const std::size_t n = c.members.size(), p2 = power_below(std::max<std::size_t>(n, 1));
  if (n < 2) return 0;
  double s = 0;
  for (std::size_t mask = 1; mask < p2; mask *= 2)
    s += round_cost(c.members, c.t, c.bytes, 1,
                    [&](std::size_t i) { return i < p2 ? i ^ mask : i; });
  if (n > p2)
    s += 2 * round_cost(c.members, c.t, c.bytes, 1,
                        [&](std::size_t i) { return i >= p2 ? i - p2 : i; });
  return s;
}

// Round k exchanges the 2^k pieces gathered so far with the partner (i ^ 2^k).
double doubling_all_gather_cost(const CostOf& c) {
  const std::size_t n = c.members.size();
  double s = 0;
  for (std::size_t mask = 1; mask < n; mask *= 2)
    s += round_cost(c.members, c.t, c.bytes * static_cast<double>(mask) / static_cast<double>(n), 1,
                    [&](std::size_t i) { return i ^ mask; });
  return s;
}

// Round k passes min(2^k, n - 2^k) pieces to the member 2^k before.
double bruck_all_gather_cost(const CostOf& c) {
  const std::size_t n = c.members.size();
  double s = 0;
  for (std::size_t k = 1; k < n; k *= 2)
    s += round_cost(c.members, c.t,
                    c.bytes * static_cast<double>(std::min(k, n - k)) / static_cast<double>(n), 1,
                    [&](std::size_t i) { return (i + n - k) % n; });
  return s;
}

}  // namespace meshcast::detail
