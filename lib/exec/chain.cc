#include "lib/exec/chain.h"

#include "meshcast/error.h"

namespace meshcast {
namespace {

// Sends a chain hop keeps in flight (see advance_chain). With 256 KiB chunks, 4 measured best
// on the emulated hosts (1 -> 4x2 devices, 16 MiB: 0.81 of the link-bound optimum; 1 -> 3x2,
// 64 MiB: 0.83 vs 0.70 for a window of 1 and 0.82 for 8 or 16).
constexpr std::size_t kChainWindow = 4;

}  // namespace

Request Communicator::chain(const Region& region, std::span<const int> members, int tag,
                            std::int64_t group, std::int64_t fork) {
  auto c = std::make_shared<Chain>();
  std::size_t pos = 0;
  while (pos < members.size() && members[pos] != rank_) ++pos;
  if (pos == members.size())
    throw ValidationError("group",
                          "a chain contains the caller (device " + std::to_string(rank_) + ")");
  c->region = region;
  c->root = pos == 0;
  // Receiver k is members[k + 1]; the root is receiver -1. A member's successors lie within
  // one group after it (its chain's next, and a leader's next leader), or are a fork's two
  // chains' first receivers: farther first, so that the trunk, whose path is the deepest, gets
  // each chunk first.
  const auto n = static_cast<std::int64_t>(members.size()) - 1,
             k = static_cast<std::int64_t>(pos) - 1;
  const auto parent = [&](std::int64_t j) { return multicast_parent(j, n, group, fork); };
  if (k >= 0) c->prev = members[static_cast<std::size_t>(parent(k) + 1)];
  const bool forks = multicast_forks(n, fork);
  const std::int64_t rest = forks ? n - fork : n;  // the receivers the groups cut
  const std::int64_t reach = group < 2 || group >= rest ? 1 : group;
  for (std::int64_t j = std::min(n - 1, k < 0 && forks ? fork : k + reach); j > k; --j)
    if (parent(j) == k) c->next.push_back(members[static_cast<std::size_t>(j + 1)]);
  c->bytes = region.bytes();
  c->chunk = std::max<std::size_t>(transport_->chain_chunk(members), 1);
  c->chunks = std::max<std::size_t>(1, (c->bytes + c->chunk - 1) / c->chunk);
  c->tag = tag;
  c->staged = !region.is_contiguous();
  if (c->staged) {
    c->slots = std::clamp<std::size_t>(caps_.chain_staging_bytes / c->chunk, 1, c->chunks);
    c->staging = scratch(std::min(c->slots * c->chunk, c->bytes));  // a small box: its bytes
    c->buf = static_cast<std::byte*>(c->staging.get());
  } else {
    c->slots = c->chunks;
    c->buf = static_cast<std::byte*>(region.origin());
  }
  // Requests are appended while wait() holds a reference to an earlier one: never reallocate.
  c->recvs.reserve(c->chunks);
  c->sends.reserve(c->chunks * c->next.size());
  chains_.push_back(c);
  advance_chains();  // the first receives, or the root's first window
  return Request(std::move(c));
}

bool Communicator::advance_chain(Chain& c) {
  bool moved = false;
  while (c.retired < c.sends.size() && test(c.sends[c.retired])) {
    ++c.retired;
    moved = true;
  }
  while (c.received < c.recvs.size() && test(c.recvs[c.received])) {
    if (c.staged)
      unpack_range(c.piece(c.received).origin(), c.region, c.received * c.chunk,
                   c.size_of(c.received));
    ++c.received;
    moved = true;
  }
  // At most kChainWindow sends in flight per hop: a transport that shares its link among all
  // posted sends (Open MPI's TCP transport interleaves them) would otherwise finish every
  // chunk at about the same time, and the next hop could start only when this one ends (a
  // chain over 3 hosts took 3x one transfer on the emulated hosts; with the window, 1.1x).
  // (Counted in chunks: a tree's leader keeps the window on each of its two hops.)
  const std::size_t ready = c.root ? c.chunks : c.received;
  while (!c.next.empty() && c.forwarded < ready &&
         c.forwarded - c.retired_chunks() < kChainWindow && c.slot_free(c.forwarded)) {
    const std::size_t k = c.forwarded;
    if (c.root && c.staged) pack_range(c.region, k * c.chunk, c.size_of(k), c.piece(k).origin());
    for (const int to : c.next) c.sends.push_back(isend(c.piece(k), to, c.tag));
    ++c.forwarded;
    moved = true;
  }
  while (!c.root && c.recvs.size() < c.chunks && c.slot_free(c.recvs.size())) {
    c.recvs.push_back(irecv(c.piece(c.recvs.size()), c.prev, c.tag));
    moved = true;
  }
  return moved;
}

bool Communicator::advance_chains() {
  bool moved = false;
  for (std::size_t i = 0; i < chains_.size();) {
    auto c = chains_[i].lock();
    if (!c || c->done()) {  // nothing left to do
      chains_[i] = chains_.back();
      chains_.pop_back();
      continue;
    }
    moved = advance_chain(*c) || moved;
    ++i;
  }
  return moved;
}

}  // namespace meshcast
