// What two devices of a transfer must agree on, as a word each sender passes to its receivers:
// a device that runs another plan than its peer (another dtype, layout or op) fails by name,
// where it would otherwise leave wrong data (messages of the same sizes, which the transports'
// length checks cannot tell) or wait for a message the peer never sends until the timeout.
// Words travel on the transfer's first tag: a reshard posts them after its first phase's data
// (ahead of it, and waited on first, they cost a 64 KiB reshard 40% more); a sync before its
// messages, which keep off that tag until the words arrived. A receiver checks each as it
// arrives, also while a wait for data blocks (WaitHook), and waits for the rest at the end; a
// sync whose data arrived with another length than expected (CommError field "length") first
// waits a moment for that sender's word, which names the cause (await_from). Not on
// a transport of device memory (NCCL), whose buffers cannot take host words. Internal to lib/exec/.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/support/fnv.h"
#include "meshcast/communicator.h"
#include "meshcast/plan.h"

namespace meshcast::detail {

class PeerSignatures {
 public:
  // (device, word) pairs: the words this device sends, and the ones it expects from its senders.
  using Words = std::vector<std::pair<int, std::uint64_t>>;
  // Called for a sender whose word is not the one expected (device, theirs, mine); throws.
  using Differ = std::function<void(int, std::uint64_t, std::uint64_t)>;

  void post(Communicator& comm, int tag, Words to, Words from);
  // Checks the words that arrived. Returns whether all did (and the sends completed).
  bool test(Communicator& comm, const Differ& differ);
  // Waits for every word and checks it.
  void wait_all(Communicator& comm, const Differ& differ);
  // Waits up to `most` for `device`'s word, if this device expects one not yet checked, and
  // checks it: after a failure naming `device`, the word that differs names the cause.
  void await_from(Communicator& comm, int device, const Differ& differ,
                  std::chrono::milliseconds most);
  void cancel(Communicator& comm);

 private:
  void check(std::size_t i, const Differ& differ);

  Words to_, from_;
  std::vector<std::uint64_t> arrived_;  // per from_ entry
  std::vector<char> checked_;           // per from_ entry
  std::vector<Request> sends_, recvs_;
};

// The words `me` sends and expects over a plan's items (ops, messages: anything with kind, root
// and peers, in plan order): per peer, `common` (its top 40 bits) and 24 bits of the digest of
// the items the two take part in together, in plan order, each fed by add(digest, item).
// Multicast: the root sends to each peer; Reduce: each contributor but the root sends to it.
template <class Item, class Add>
std::pair<PeerSignatures::Words, PeerSignatures::Words> signature_words(
    const std::vector<Item>& items, int me, std::uint64_t common, Add add) {
  struct Link {
    int peer;
    std::uint32_t item;
    bool sends;  // this device sends the peer data in it
  };
  std::vector<Link> links;  // one sort, not a map: a 4 KiB reshard takes a few us
  for (std::size_t i = 0; i < items.size(); ++i) {
    const Item& x = items[i];
    const auto at = static_cast<std::uint32_t>(i);
    const bool peer = std::find(x.peers.begin(), x.peers.end(), me) != x.peers.end();
    if (x.kind == OpKind::Multicast) {
      if (x.root == me)
        for (int p : x.peers) links.push_back({p, at, true});
      else if (peer)
        links.push_back({x.root, at, false});
    } else if (x.kind == OpKind::Reduce) {
      if (x.root == me) {
        for (int c : x.peers)
          if (c != me) links.push_back({c, at, false});
      } else if (peer) {
        links.push_back({x.root, at, true});
      }
    }
  }
  std::sort(links.begin(), links.end(), [](const Link& a, const Link& b) {
    return std::tie(a.peer, a.item) < std::tie(b.peer, b.item);
  });
  PeerSignatures::Words to, from;
  for (std::size_t k = 0; k < links.size();) {
    const int peer = links[k].peer;
    Fnv f;
    bool sends = false, receives = false;
    for (; k < links.size() && links[k].peer == peer; ++k) {
      (links[k].sends ? sends : receives) = true;
      add(f, items[links[k].item]);
    }
    const std::uint64_t word = common | (f.h & 0xffffff);
    if (sends) to.emplace_back(peer, word);
    if (receives) from.emplace_back(peer, word);
  }
  return {std::move(to), std::move(from)};
}

// Sets a communicator's check while its waits block (Communicator::while_waiting_), for one
// scope; the one before is restored.
class WaitHook {
 public:
  WaitHook(Communicator& comm, std::function<void()> check)
      : comm_(comm), before_(std::exchange(comm.while_waiting_, std::move(check))) {}
  ~WaitHook() { comm_.while_waiting_ = std::move(before_); }
  WaitHook(const WaitHook&) = delete;
  WaitHook& operator=(const WaitHook&) = delete;

 private:
  Communicator& comm_;
  std::function<void()> before_;
};

}  // namespace meshcast::detail
