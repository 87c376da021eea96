// A pipelined chain broadcast, the engine's multicast over point-to-point (Communicator::ibcast
// with TransportCaps::Multicast::Chain): the box travels root -> members[1] -> members[2] ... in
// chunks, each member forwarding a chunk as soon as it arrived, so the time is about
// bytes/bandwidth + (members - 2) * chunk/bandwidth. In a tree of chains
// (meshcast/multicast_tree.h) a leader forwards each chunk to two members: the next leader and
// its group's first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "meshcast/communicator.h"

namespace meshcast {

// One device's part of a chain. Chunk k travels in slot k % slots: for a contiguous box the
// slots are the box itself (one per chunk, nothing staged); for a strided one they are a staging
// buffer of at most `slots` chunks, each packed at the root just before it is sent and unpacked
// downstream as soon as it arrives. A slot is reused once the chunk in it has been forwarded (its
// sends to every successor completed) and unpacked.
struct Communicator::Chain : Request::Impl {
  Region region;  // the box in this device's buffer
  bool root = false, staged = false;
  std::byte* buf = nullptr;  // slot 0
  std::size_t bytes = 0, chunk = 0, chunks = 0, slots = 0;
  int prev = -1, tag = 0;
  std::vector<int> next;  // the successors each chunk is forwarded to (none: the chain's end)
  std::vector<Request> recvs, sends;  // posting order = chunk order, then `next` order
  std::size_t received = 0;           // leading chunks arrived (and unpacked)
  std::size_t forwarded = 0;          // chunks whose sends on to `next` are posted
  std::size_t retired = 0;            // leading sends seen complete
  std::shared_ptr<void> staging;

  std::size_t size_of(std::size_t k) const { return std::min(chunk, bytes - k * chunk); }
  Region piece(std::size_t k) const {
    return Region::contiguous(buf + (k % slots) * chunk, bytes ? size_of(k) : 0);
  }
  // Leading chunks whose every send completed.
  std::size_t retired_chunks() const { return next.empty() ? 0 : retired / next.size(); }
  // Whether chunk k may use its slot: the slot's previous chunk (k - slots) is done with it.
  bool slot_free(std::size_t k) const {
    if (k < slots) return true;
    const std::size_t before = k - slots;
    return !next.empty() ? retired_chunks() > before : received > before;
  }
  bool done() const { return (root || received == chunks) && retired == chunks * next.size(); }
};

}  // namespace meshcast
