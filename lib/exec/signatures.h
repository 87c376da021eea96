// What two devices of a transfer must agree on, as a word each sender passes to its receivers:
// a device that runs another plan than its peer (another dtype, layout or op) fails by name,
// where it would otherwise leave wrong data (messages of the same sizes, which the transports'
// length checks cannot tell) or wait for a message the peer never sends until the timeout.
// Words travel on the transfer's first tag, posted after the first phase's data (ahead of it
// they cost a 64 KiB reshard 40% more); a receiver checks each as it arrives, also while a wait
// for data blocks (WaitHook), and waits for the rest at the end. Not on a transport of device
// memory (NCCL), whose buffers cannot take host words. Internal to lib/exec/.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "meshcast/communicator.h"

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
  void cancel(Communicator& comm);

 private:
  void check(std::size_t i, const Differ& differ);

  Words to_, from_;
  std::vector<std::uint64_t> arrived_;  // per from_ entry
  std::vector<char> checked_;           // per from_ entry
  std::vector<Request> sends_, recvs_;
};

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
