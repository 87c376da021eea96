// Failure handling shared by the process backends: failure notices and liveness pings that
// travel beside the data on a backend's control channel. Internal to collectives/.
#pragma once

#include <optional>
#include <string>
#include <vector>

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

class Watchdog {
 public:
  Watchdog(ControlChannel& channel, int rank, int size, double timeout_seconds)
      : ch_(channel), rank_(rank), size_(size), timeout_(timeout_seconds) {}

  // Call while waiting: answers pings; throws the CommError another device abandoned with.
  void watch();
  // Call when a wait saw no progress for the timeout: pings every rank and throws a CommError
  // naming those that do not answer within a grace period (or, if all answer, `peers`).
  [[noreturn]] void diagnose(const std::vector<int>& peers);
  // Tells every other rank that this one gives up with `field: cause`.
  void abandon(const std::string& field, const std::string& cause);
  // A failure was seen or announced: finalizing the transport may hang.
  bool failed() const { return failed_; }
  double timeout() const { return timeout_; }

 private:
  ControlChannel& ch_;
  int rank_, size_;
  double timeout_;
  bool failed_ = false;
  std::vector<char> answered_;  // during diagnose(): pongs received
};

}  // namespace meshcast::detail
