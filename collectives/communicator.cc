#include "meshcast/communicator.h"

#include <algorithm>

#include "meshcast/error.h"

namespace meshcast {
namespace {

// Sends a chain hop keeps in flight (see advance_chains). With 256 KiB chunks, 4 measured best
// on the emulated hosts (1 -> 4x2 devices, 16 MiB: 0.81 of the link-bound optimum; 1 -> 3x2,
// 64 MiB: 0.83 vs 0.70 for a window of 1 and 0.82 for 8 or 16).
constexpr std::size_t kChainWindow = 4;

// Several requests completed as one (the default broadcast's sends).
struct Composite : Request::Impl {
  std::vector<Request> parts;
};

}  // namespace

// One device's part of a chain broadcast.
struct Communicator::Chain : Request::Impl {
  std::byte* buf = nullptr;  // the packed box (region memory when contiguous, else staging)
  std::size_t bytes = 0, chunk = 0, chunks = 0;
  int prev = -1, next = -1, tag = 0;
  std::vector<Request> recvs, sends;
  std::vector<char> arrived;
  std::size_t forwarded = 0;  // chunks whose send on to `next` is posted
  std::size_t retired = 0;    // leading sends seen complete
  std::shared_ptr<void> staging;
  Region unpack_to;
  bool unpacked = true;

  std::size_t size_of(std::size_t k) const { return std::min(chunk, bytes - k * chunk); }
  Region piece(std::size_t k) const {
    return Region::contiguous(buf + k * chunk, bytes ? size_of(k) : 0);
  }
};

Request Communicator::ibcast_chain(const Region& region, int root, std::span<const int> group,
                                   int tag, std::size_t chunk) {
  auto c = std::make_shared<Chain>();
  std::size_t pos = 0;
  while (pos < group.size() && group[pos] != rank()) ++pos;
  if (group.empty() || group[0] != root || pos == group.size())
    throw ValidationError("group", "a chain starts at its root and contains the caller");
  c->prev = pos ? group[pos - 1] : -1;
  c->next = pos + 1 < group.size() ? group[pos + 1] : -1;
  c->bytes = region.bytes();
  c->chunk = std::max<std::size_t>(chunk, 1);
  c->chunks = std::max<std::size_t>(1, (c->bytes + c->chunk - 1) / c->chunk);
  c->tag = tag;
  if (region.is_contiguous()) {
    c->buf = static_cast<std::byte*>(region.origin());
  } else {
    c->staging = scratch(c->bytes);
    c->buf = static_cast<std::byte*>(c->staging.get());
    if (rank() == root) {
      copy(region, Region::packed_like(region, c->buf));
    } else {
      c->unpack_to = region;
      c->unpacked = false;
    }
  }
  // Sends are appended while wait() holds a reference to an earlier one: never reallocate.
  if (c->next >= 0) c->sends.reserve(c->chunks);
  if (rank() == root) {
    c->arrived.assign(c->chunks, 1);
  } else {
    for (std::size_t k = 0; k < c->chunks; ++k)
      c->recvs.push_back(irecv(c->piece(k), c->prev, tag));
    c->arrived.assign(c->chunks, 0);
  }
  if (c->next < 0) c->forwarded = c->chunks;
  chains_.push_back(c);
  advance_chains();  // the root's first window
  return Request(std::move(c));
}

bool Communicator::advance_chains() {
  bool moved = false;
  for (std::size_t i = 0; i < chains_.size();) {
    auto c = chains_[i].lock();
    if (!c || c->forwarded == c->chunks) {  // nothing left to forward
      chains_[i] = chains_.back();
      chains_.pop_back();
      continue;
    }
    // At most kChainWindow sends in flight per hop: a transport that shares its link among all
    // posted sends (Open MPI's TCP transport interleaves them) would otherwise finish every
    // chunk at about the same time, and the next hop could start only when this one ends (a
    // chain over 3 hosts took 3x one transfer on the emulated hosts; with the window, 1.1x).
    while (c->retired < c->sends.size() && test(c->sends[c->retired])) ++c->retired;
    while (c->forwarded < c->chunks && c->forwarded - c->retired < kChainWindow &&
           (c->arrived[c->forwarded] || test(c->recvs[c->forwarded]))) {
      c->arrived[c->forwarded] = 1;
      c->sends.push_back(isend(c->piece(c->forwarded), c->next, c->tag));
      ++c->forwarded;
      moved = true;
    }
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
    // Each chunk in order; waiting inside the backend keeps every chain forwarding.
    for (std::size_t k = 0; k < ch->recvs.size(); ++k) {
      wait(ch->recvs[k]);
      ch->arrived[k] = 1;
      advance_chains();
    }
    // The window holds later sends back until earlier ones finish.
    while (ch->retired < ch->sends.size() || ch->forwarded < ch->chunks) {
      if (ch->retired < ch->sends.size()) {
        // The backend's wait runs advance_chains, which may retire this send and later ones:
        // count only this one here, or an unfinished send would be skipped (and its staging
        // freed under it).
        const std::size_t k = ch->retired;
        wait(ch->sends[k]);
        ch->retired = std::max(ch->retired, k + 1);
      }
      advance_chains();
    }
    if (!ch->unpacked) {
      copy(Region::packed_like(ch->unpack_to, ch->buf), ch->unpack_to);
      ch->unpacked = true;
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
    for (std::size_t k = 0; k < ch->recvs.size(); ++k) {
      if (ch->arrived[k]) continue;
      if (!test(ch->recvs[k])) return false;
      ch->arrived[k] = 1;
    }
    advance_chains();  // forwards what just arrived
    while (ch->retired < ch->sends.size() && test(ch->sends[ch->retired])) ++ch->retired;
    if (ch->forwarded < ch->chunks || ch->retired < ch->sends.size()) return false;
    if (!ch->unpacked) {
      copy(Region::packed_like(ch->unpack_to, ch->buf), ch->unpack_to);
      ch->unpacked = true;
    }
    return true;
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

int Communicator::next_collective_tag(std::span<const int> group) {
  constexpr std::uint64_t kBase = 32768, kTags = 16384;
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the device ids
  for (int d : group) h = (h ^ static_cast<std::uint32_t>(d)) * 1099511628211ull;
  const unsigned seq = collective_seq_[h]++;
  return static_cast<int>(kBase + (h + seq) % kTags);
}

void Communicator::wait_all(std::span<Request> rs) {
  for (Request& r : rs) wait(r);
}

}  // namespace meshcast
