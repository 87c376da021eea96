// Recursive doubling: log2(n) rounds in which partners exchange the whole piece and combine it,
// for small messages where the ring's 2(n - 1) rounds of latency dominate. Both partners compute
// a op b (op is commutative), so every member ends with the same bits.
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
    if (combine) r.combines.push_back({staging, data, piece.size()});
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
