#include "meshcast/communicator.h"

#include <algorithm>
#include <thread>

#include "meshcast/error.h"

namespace meshcast {
namespace {

// Sends a chain hop keeps in flight (see advance_chain). With 256 KiB chunks, 4 measured best
// on the emulated hosts (1 -> 4x2 devices, 16 MiB: 0.81 of the link-bound optimum; 1 -> 3x2,
// 64 MiB: 0.83 vs 0.70 for a window of 1 and 0.82 for 8 or 16).
constexpr std::size_t kChainWindow = 4;

// Several requests completed as one (the default broadcast's sends).
struct Composite : Request::Impl {
  std::vector<Request> parts;
};

}  // namespace

// One device's part of a chain broadcast. Chunk k travels in slot k % slots: for a contiguous
// box the slots are the box itself (one per chunk, nothing staged); for a strided one they are
// a staging buffer of at most `slots` chunks, each packed at the root just before it is sent
// and unpacked downstream as soon as it arrives. A slot is reused once the chunk in it has been
// forwarded (its send completed) and unpacked.
struct Communicator::Chain : Request::Impl {
  Region region;  // the box in this device's buffer
  bool root = false, staged = false;
  std::byte* buf = nullptr;  // slot 0
  std::size_t bytes = 0, chunk = 0, chunks = 0, slots = 0;
  int prev = -1, next = -1, tag = 0;
  std::vector<Request> recvs, sends;  // posting order = chunk order
  std::size_t received = 0;           // leading chunks arrived (and unpacked)
  std::size_t forwarded = 0;          // chunks whose send on to `next` is posted
  std::size_t retired = 0;            // leading sends seen complete
  std::shared_ptr<void> staging;

  std::size_t size_of(std::size_t k) const { return std::min(chunk, bytes - k * chunk); }
  Region piece(std::size_t k) const {
    return Region::contiguous(buf + (k % slots) * chunk, bytes ? size_of(k) : 0);
  }
  // Whether chunk k may use its slot: the slot's previous chunk (k - slots) is done with it.
  bool slot_free(std::size_t k) const {
    if (k < slots) return true;
    const std::size_t before = k - slots;
    return next >= 0 ? retired > before : received > before;
  }
  bool done() const { return (root || received == chunks) && (next < 0 || retired == chunks); }
};

Request Communicator::ibcast_chain(const Region& region, int root, std::span<const int> group,
                                   int tag, std::size_t chunk, std::size_t staging_bytes) {
  auto c = std::make_shared<Chain>();
  std::size_t pos = 0;
  while (pos < group.size() && group[pos] != rank()) ++pos;
  if (group.empty() || group[0] != root || pos == group.size())
    throw ValidationError("group", "a chain starts at its root and contains the caller");
  c->region = region;
  c->root = rank() == root;
  c->prev = pos ? group[pos - 1] : -1;
  c->next = pos + 1 < group.size() ? group[pos + 1] : -1;
  c->bytes = region.bytes();
  c->chunk = std::max<std::size_t>(chunk, 1);
  c->chunks = std::max<std::size_t>(1, (c->bytes + c->chunk - 1) / c->chunk);
  c->tag = tag;
  c->staged = !region.is_contiguous();
  if (c->staged) {
    c->slots = std::clamp<std::size_t>(staging_bytes / c->chunk, 1, c->chunks);
    c->staging = scratch(std::min(c->slots * c->chunk, c->bytes));  // a small box: its bytes
    c->buf = static_cast<std::byte*>(c->staging.get());
  } else {
    c->slots = c->chunks;
    c->buf = static_cast<std::byte*>(region.origin());
  }
  // Requests are appended while wait() holds a reference to an earlier one: never reallocate.
  c->recvs.reserve(c->chunks);
  c->sends.reserve(c->chunks);
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
  const std::size_t ready = c.root ? c.chunks : c.received;
  while (c.next >= 0 && c.forwarded < ready && c.forwarded - c.retired < kChainWindow &&
         c.slot_free(c.forwarded)) {
    const std::size_t k = c.forwarded;
    if (c.root && c.staged) pack_range(c.region, k * c.chunk, c.size_of(k), c.piece(k).origin());
    c.sends.push_back(isend(c.piece(k), c.next, c.tag));
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

Request Communicator::ibcast(const Region& region, int root, std::span<const int> group, int tag) {
  if (rank() != root) return irecv(region, root, tag);
  auto all = std::make_shared<Composite>();
  for (int d : group)
    if (d != root) all->parts.push_back(isend(region, d, tag));
  return Request(std::move(all));
}

std::shared_ptr<void> Communicator::scratch(std::size_t bytes) {
  return std::shared_ptr<void>(::operator new(bytes), [](void* p) { ::operator delete(p); });
}

void Communicator::wait(Request& r) {
  if (!r.valid()) return;
  if (auto* c = dynamic_cast<Composite*>(r.get())) {
    wait_all(c->parts);
  } else if (auto* ch = dynamic_cast<Chain*>(r.get())) {
    // Block on what the chain needs next (its oldest send, else its next receive); the
    // backend's wait moves every chain on meanwhile, and advance_chain counts what completed
    // (a request waited here is reset, and a reset request tests complete).
    while (true) {
      advance_chain(*ch);
      if (ch->done()) break;
      if (ch->retired < ch->sends.size())
        wait(ch->sends[ch->retired]);
      else if (ch->received < ch->recvs.size())
        wait(ch->recvs[ch->received]);
    }
  } else {
    wait_one(*r.get());
  }
  r.reset();
}

bool Communicator::test(Request& r) {
  if (!r.valid()) return true;
  if (auto* c = dynamic_cast<Composite*>(r.get())) {
    for (Request& p : c->parts)
      if (!test(p)) return false;
    return true;
  }
  if (auto* ch = dynamic_cast<Chain*>(r.get())) {
    advance_chains();
    return ch->done();
  }
  return test_one(*r.get());
}

void Communicator::abandon_for(const std::exception& e) {
  if (const auto* c = dynamic_cast<const CommError*>(&e)) {
    const std::string what = c->what();  // "field: cause"
    abandon(c->field(), what.substr(std::min(what.size(), c->field().size() + 2)));
  } else {
    abandon("device " + std::to_string(rank()), std::string("failed: ") + e.what());
  }
}

std::pair<std::uint64_t, unsigned> Communicator::next_in_sequence(std::span<const int> group) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the device ids
  for (int d : group) h = (h ^ static_cast<std::uint32_t>(d)) * 1099511628211ull;
  return {h, collective_seq_[h]++};
}

int Communicator::next_collective_tag(std::span<const int> group) {
  constexpr std::uint64_t kBase = 32768, kTags = 16384;
  const auto [h, seq] = next_in_sequence(group);
  return static_cast<int>(kBase + (h + seq) % kTags);
}

std::uint64_t Communicator::next_collective_id(std::span<const int> group) {
  const auto [h, seq] = next_in_sequence(group);
  std::uint64_t z = h + 0x9e3779b97f4a7c15ull * (seq + 1ull);  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void Communicator::idle(std::span<const int> peers, int polls,
                        std::chrono::steady_clock::time_point since) {
  (void)peers;
  (void)since;
  if (polls > 64) std::this_thread::yield();
}

void Communicator::wait_all(std::span<Request> rs) {
  for (Request& r : rs) wait(r);
}

}  // namespace meshcast
