// Chain broadcast in chunks, as rounds: in round t the member at chain position j receives
// chunk t - j + 1 and forwards chunk t - j, so after the pipeline fills every link is busy.
#include <algorithm>

#include "program.h"

namespace meshcast::detail {

void chain_broadcast(Program& p, std::span<const int> members, std::size_t me, void* buf,
                     std::size_t bytes, std::size_t chunk) {
  const std::size_t n = members.size();
  if (n < 2) return;
  chunk = std::max<std::size_t>(chunk, 1);
  // An empty buffer still passes one empty chunk down the chain: it carries the signature
  // (Program::exchange_signatures), so that a member given more elements fails by the count
  // instead of waiting for the timeout.
  const auto chunks =
      std::max<std::int64_t>(1, static_cast<std::int64_t>((bytes + chunk - 1) / chunk));
  const auto j = static_cast<std::int64_t>(me);
  auto piece = [&](std::int64_t k, int peer) {
    const std::size_t lo = static_cast<std::size_t>(k) * chunk;
    return Message{peer, static_cast<std::byte*>(buf) + lo, std::min(chunk, bytes - lo)};
  };
  const std::int64_t rounds = chunks + static_cast<std::int64_t>(n) - 2;
  for (std::int64_t t = 0; t < rounds; ++t) {
    const std::int64_t in = t - j + 1, out = t - j;
    const bool recv = j > 0 && in >= 0 && in < chunks;
    const bool send = j + 1 < static_cast<std::int64_t>(n) && out >= 0 && out < chunks;
    if (!recv && !send) continue;
    Round& r = p.add_round();
    if (recv) r.recvs.push_back(piece(in, members[me - 1]));
    if (send) r.sends.push_back(piece(out, members[me + 1]));
  }
}

}  // namespace meshcast::detail
