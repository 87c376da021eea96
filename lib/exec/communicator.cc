// The progress engine's front: requests of every kind (a transport's own, a chain, a fan-out),
// the wait loop that drives the transport and the chains together, and failure hand-off.
#include "meshcast/communicator.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "lib/exec/chain.h"

namespace meshcast {

// Several requests completed as one (a fan-out's sends).
struct Communicator::Composite : Request::Impl {
  std::vector<Request> parts;
};

Request Transport::post_broadcast(const Region&, int, std::span<const int>, int) {
  throw InternalError("transport", name() + " has no native broadcast");
}

std::shared_ptr<void> Transport::scratch(std::size_t bytes) {
  return std::shared_ptr<void>(::operator new(bytes), [](void* p) { ::operator delete(p); });
}

std::shared_ptr<void> Communicator::kept_scratch(std::size_t bytes) {
  const bool free = kept_.use_count() == 1;
  if (free && kept_bytes_ >= bytes) return kept_;
  std::shared_ptr<void> fresh = scratch(bytes);
  if (!kept_ || free) {
    kept_ = fresh;
    kept_bytes_ = bytes;
  }
  return fresh;
}

Communicator::Communicator(std::unique_ptr<Transport> transport)
    : transport_(std::move(transport)),
      caps_(transport_->caps()),
      rank_(transport_->rank()),
      size_(transport_->size()) {
  init_groups();
}

Communicator::~Communicator() = default;

std::string Communicator::backend() const { return transport_->name(); }

Request Communicator::isend(const Region& from, int dst, int tag) {
  return transport_->post_send(from, dst, tag);
}

Request Communicator::irecv(const Region& to, int src, int tag) {
  return transport_->post_recv(to, src, tag);
}

Request Communicator::ibcast(const Region& region, int root, std::span<const int> chain, int tag,
                             std::int64_t group, std::int64_t fork) {
  if (chain.empty() || chain.front() != root)
    throw ValidationError("group", "a multicast's devices start with its root");
  switch (caps_.multicast) {
    case TransportCaps::Multicast::Native:
      return transport_->post_broadcast(region, root, chain, tag);
    case TransportCaps::Multicast::Chain:
      return this->chain(region, chain, tag, group, fork);
    case TransportCaps::Multicast::Fanout:
      break;
  }
  if (rank_ != root) return irecv(region, root, tag);
  auto all = std::make_shared<Composite>();
  for (int d : chain.subspan(1)) all->parts.push_back(isend(region, d, tag));
  return Request(std::move(all));
}

void Communicator::wait_request(Request::Impl& r) {
  auto since = Clock::now();
  for (int polls = 0; !transport_->test(r);) {
    if (advance_chains()) {  // a chain's progress is progress: its peers are alive
      polls = 0;
      since = Clock::now();
    }
    transport_->idle(&r, {}, ++polls, since);
    poll_in_flight();
    interrupt_point();
    if ((polls & 63) == 0 && while_waiting_) {  // a wait longer than a spin (per poll: 2 us a call)
      struct Kept {  // out of the slot while it runs (no recursion), back however it ends
        std::function<void()>& slot;
        std::function<void()> check;
        ~Kept() { slot = std::move(check); }
      } kept{while_waiting_, std::exchange(while_waiting_, nullptr)};
      kept.check();
    }
  }
}

void Communicator::interrupt_point() {
  if (!interrupt_) return;
  const auto now = Clock::now();
  if (now < next_interrupt_) return;
  next_interrupt_ = now + std::chrono::milliseconds(50);
  try {
    interrupt_();
  } catch (const std::exception& e) {
    abandon_for(e);  // a barrier gives up nothing else: its peers would wait on this device
    throw;
  }
}

void Communicator::wait(Request& r) {
  if (!r.valid()) return;
  if (auto* c = dynamic_cast<Composite*>(r.get())) {
    wait_all(c->parts);
  } else if (auto* ch = dynamic_cast<Chain*>(r.get())) {
    // Block on what the chain needs next (its oldest send, else its next receive); every chain
    // moves on meanwhile, and advance_chain counts what completed (a request waited here is
    // reset, and a reset request tests complete).
    while (true) {
      advance_chain(*ch);
      if (ch->done()) break;
      if (ch->retired < ch->sends.size())
        wait(ch->sends[ch->retired]);
      else if (ch->received < ch->recvs.size())
        wait(ch->recvs[ch->received]);
    }
  } else {
    wait_request(*r.get());
  }
  r.reset();
}

void Communicator::wait_all(std::span<Request> rs) {
  for (Request& r : rs) wait(r);
}

void Communicator::wait_all_or_cancel(std::span<Request> rs) {
  try {
    wait_all(rs);
  } catch (...) {
    cancel_and_settle(rs);
    throw;
  }
}

void Communicator::cancel_and_settle(std::span<Request> rs) noexcept {
  for (Request& r : rs) try {
      cancel(r);
    } catch (...) {  // the others are still cancelled
    }
  try {
    (void)settle_cancelled(Clock::now() + std::chrono::seconds(1));
  } catch (...) {  // best effort: the failure is what the caller hears of
  }
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
  return transport_->test(*r.get());
}

void Communicator::progress() {
  const auto start = Clock::now();
  if (start < next_progress_) return;
  try {
    advance_chains();
  } catch (const std::exception&) {
    // Another operation's chain failed: its own test or wait reports it, as poll_in_flight
    // leaves an operation's failure to it.
  }
  poll_in_flight();
  // Polling costs its operations' count: it takes at most a fifth of the time, so that a device
  // with thousands in flight (a pipeline's micro-batches) still has its cores for its work.
  const auto now = Clock::now();
  next_progress_ =
      now + std::max<Clock::duration>(std::chrono::microseconds(50), 4 * (now - start));
}

void Communicator::cancel(Request& r) {
  if (!r.valid()) return;
  if (auto* c = dynamic_cast<Composite*>(r.get())) {
    for (Request& p : c->parts) cancel(p);
  } else if (auto* ch = dynamic_cast<Chain*>(r.get())) {
    for (Request& p : ch->sends) cancel(p);
    for (Request& p : ch->recvs) cancel(p);
    ch->received = ch->chunks;  // done: advance_chains drops it
    ch->next.clear();
    ch->retired = 0;
  } else {
    transport_->cancel(*r.get());
  }
  // Kept, with a chain's staging, while the transport may still read or write them.
  cancelled_.push_back(std::exchange(r, Request()));
}

bool Communicator::settle_cancelled(Clock::time_point until) {
  const bool settled = transport_->settle_cancelled(until);
  // Still going at the deadline (a peer that never ends its side): kept, with their staging,
  // while the communicator lives, and not waited for by the next caller.
  if (!settled) std::move(cancelled_.begin(), cancelled_.end(), std::back_inserter(given_up_));
  cancelled_.clear();
  return settled;
}

void Communicator::barrier() {
  check_live();
  try {
    auto since = Clock::now();
    for (int polls = 0;;) {
      if (advance_chains()) {
        polls = 0;
        since = Clock::now();
      }
      if (chains_.empty()) break;
      std::vector<int> peers;
      for (const auto& w : chains_)
        if (const auto c = w.lock()) {
          if (c->prev >= 0) peers.push_back(c->prev);
          peers.insert(peers.end(), c->next.begin(), c->next.end());
        }
      transport_->idle(nullptr, peers, ++polls, since);
      poll_in_flight();  // a chain's peer may wait on another operation of this device
      interrupt_point();
    }
    transport_->barrier([this] {
      poll_in_flight();
      interrupt_point();
    });
  } catch (const std::exception& e) {
    abandon_for(e);  // its peers gave it up, or will wait on this device
    throw;
  }
}

void Communicator::abandon(const Error& why) {
  if (abandoned_) return;  // the peers were told; each abort lingers up to a second
  abandoned_ = why.device() >= 0 ? CommError(why.device(), why.cause(), why.field())
                                 : CommError(why.field(), why.cause());
  transport_->abort(why);
}

void Communicator::check_live() {
  if (abandoned_) {
    const std::string cause = abandoned_->cause() + " (an earlier call gave this communicator up)";
    if (abandoned_->device() >= 0)
      throw CommError(abandoned_->device(), cause, abandoned_->field());
    throw CommError(abandoned_->field(), cause);
  }
  try {
    transport_->check_peers();  // a peer gave it up since (Transport::check_peers)
  } catch (const std::exception& e) {
    abandon_for(e);  // a notice passes its device on; a transport's own error names this one
    throw;
  }
}

void Communicator::abandon_for(const std::exception& e) {
  const auto* err = dynamic_cast<const Error*>(&e);
  if (err && err->kind() == ErrorKind::PeerFailure)
    abandon(*err);  // pass on the device that failed
  else
    abandon(CommError(rank_, std::string("failed: ") + e.what()));
}

void Communicator::idle(std::span<const int> peers, int polls, Clock::time_point since) {
  advance_chains();  // chains forward what arrived
  poll_in_flight();
  transport_->idle(nullptr, peers, polls, since);
  interrupt_point();
}

}  // namespace meshcast
