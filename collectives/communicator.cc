#include "meshcast/communicator.h"

#include <algorithm>

#include "meshcast/error.h"

namespace meshcast {
namespace {

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
  std::size_t forwarded = 0;  // chunks sent on to `next`
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
  if (rank() == root) {
    if (c->next >= 0)
      for (std::size_t k = 0; k < c->chunks; ++k)
        c->sends.push_back(isend(c->piece(k), c->next, tag));
    c->forwarded = c->chunks;
  } else {
    for (std::size_t k = 0; k < c->chunks; ++k)
      c->recvs.push_back(irecv(c->piece(k), c->prev, tag));
    c->arrived.assign(c->chunks, 0);
    if (c->next < 0) c->forwarded = c->chunks;
  }
  chains_.push_back(c);
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
    while (c->forwarded < c->chunks && (c->arrived[c->forwarded] || test(c->recvs[c->forwarded]))) {
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
    wait_all(ch->sends);
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
  if (dynamic_cast<Chain*>(r.get())) return false;  // completed by wait()
  return test_one(*r.get());
}

void Communicator::wait_all(std::span<Request> rs) {
  for (Request& r : rs) wait(r);
}

}  // namespace meshcast
