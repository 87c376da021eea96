// Failure handling shared by the process backends: failure notices and liveness pings that
// travel beside the data on a backend's control channel. Internal to collectives/.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meshcast/error.h"

namespace meshcast::detail {

// Small messages on reserved tags; a backend supplies these two operations.
class ControlChannel {
 public:
  enum class Kind { Fail, Ping, Pong };
  struct Message {
    int src;
    Kind kind;
    std::string payload;
  };
  virtual ~ControlChannel() = default;
  // Sends without waiting; the channel keeps the payload until it left.
  virtual void post(int peer, Kind kind, const std::string& payload) = 0;
  // The next control message that arrived, if any.
  virtual std::optional<Message> poll() = 0;
};

// Who this process is, as far as a peer on the same machine can check it: a hash of the
// kernel's boot id, the inode of its PID namespace, its pid. Two processes with the same first
// two can see each other's pid (kill(pid, 0)), so a peer killed by a signal is noticed at once
// instead of after the timeout; peers elsewhere are left to the timeout and the transports'
// own errors (closed connections).
using ProcessId = std::array<std::uint64_t, 3>;
ProcessId this_process();

// After Watchdog::abandon(): keeps this process, and its transport through `drained` (which
// moves the notices on and says whether all left), alive for half a second, and up to a second
// more for notices still in flight. Peers then hear the notice before they can see this process
// end and take it for the device that failed.
void linger(const std::function<bool()>& drained);

class Watchdog {
 public:
  Watchdog(ControlChannel& channel, int rank, int size, double timeout_seconds)
      : ch_(channel), rank_(rank), size_(size), timeout_(timeout_seconds) {}

  // Every rank's this_process(), in rank order: the peers whose process this one can see are
  // then checked for life in watch() (a few times a second).
  void set_processes(const std::vector<ProcessId>& all);
  // Call while waiting: answers pings; throws the CommError another device abandoned with, or
  // one naming a peer whose process ended (told to the others first, as abandon() does).
  void watch();
  // watch() on every 256th call: for a transport's test() of a request not done, so that a loop
  // of test() alone (no wait) still learns of a peer that died.
  void watch_sometimes() {
    if ((++unwatched_ & 255) == 0) watch();
  }
  // The notices alone, at most once a millisecond (Transport::check_peers, as an operation
  // starts: six probes cost a 2-rank all-reduce of 8 bytes 1.7 -> 2.2 us): answers pings; throws
  // the CommError another device abandoned with.
  void check_notices();
  // Counts a request of this rank that completed: its progress, which its answers to liveness
  // checks carry.
  void progressed() { ++progress_; }
  // Call on every poll of a wait, with the time since which it has seen no progress of its own
  // (its start, or its last progress): it does nothing before half the timeout has passed since
  // then. From then on, every half timeout, every rank is asked for
  // its progress (N control messages a round): past the timeout a wait goes on while every rank
  // answers and one of them completed a request within the last timeout (half of it at the
  // first decision: the job moves, the device waited on is busy with other transfers first, or
  // a barrier waits for devices with more to do); else diagnose(peers). Such a wait has no upper
  // bound while the job moves: two devices stuck on each other are named once the rest stalls.
  void check_wait(std::chrono::steady_clock::time_point since, std::span<const int> peers);
  // Call when a wait saw no progress for the timeout: pings every rank and throws a CommError
  // naming the first that does not answer within a grace period (one of `peers`, the devices
  // waited on, where one of them is silent), the others in its cause (or, if all answer, the
  // first of `peers`).
  // `exchange`: the wait was a session's own exchange (MpiSession::sum, allgather) of
  // `waited` seconds, not a transfer's of timeout() seconds: it has no peers of its own.
  [[noreturn]] void diagnose(const std::vector<int>& peers, double waited = -1,
                             bool exchange = false);
  // Tells every other rank that this one gives up because of `why`: they throw a CommError
  // naming why.device() when it names one, else why.field(), with why.cause() (one line, cut
  // to kMaxCause bytes).
  void abandon(const Error& why);
  // A transfer with `peer` failed (the transport says so): a notice naming the device that
  // failed first, if one comes within a moment, wins (the peer may have left because of it);
  // else the others are told and CommError(peer, cause) is thrown.
  [[noreturn]] void peer_failed(int peer, const std::string& cause);
  static constexpr std::size_t kMaxCause = 900;
  // A failure was seen or announced: finalizing the transport may hang.
  bool failed() const { return failed_; }
  // The first failure this rank announced (abandon()), if any: for a session that outlives the
  // transport to tell peers of its own (UcxSession's bootstrap, Bootstrap::on_peer_failure).
  const std::optional<CommError>& announced() const { return announced_; }
  double timeout() const { return timeout_; }

 private:
  ControlChannel& ch_;
  int rank_, size_;
  double timeout_;
  bool failed_ = false;
  std::optional<CommError> announced_;
  unsigned unwatched_ = 0;           // watch_sometimes() calls
  std::vector<char> answered_;       // during a ping round: pongs received
  std::vector<std::int64_t> heard_;  // during a ping round: each rank's progress (-1)
  std::uint64_t round_ = 0;          // ping rounds: a pong answers the round it names
  std::int64_t progress_ = 0;        // requests of this rank completed
  // check_wait()'s: the wait it watches (its `since`), when it asks next, the progress heard in
  // its last two rounds (older first; -1 for a rank that did not answer).
  std::chrono::steady_clock::time_point wait_since_{}, next_ask_{};
  std::vector<std::vector<std::int64_t>> asked_;
  std::vector<std::pair<int, long>> visible_;  // (rank, pid) of peers on this machine
  std::chrono::steady_clock::time_point next_check_{};
  std::chrono::steady_clock::time_point next_notices_{};  // check_notices()
  void poll_notices();
  void check_processes();
  // Pings every rank and waits (at most 5 s, or `waited`) for their answers: answered_, heard_.
  void ping_all(double waited);
  // diagnose() from the last ping_all()'s answers.
  [[noreturn]] void named(const std::vector<int>& peers, double waited, bool exchange);
};

}  // namespace meshcast::detail
