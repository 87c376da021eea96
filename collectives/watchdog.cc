#include "watchdog.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "meshcast/error.h"

namespace meshcast::detail {

using Clock = std::chrono::steady_clock;

void Watchdog::watch() {
  while (auto m = ch_.poll()) {
    switch (m->kind) {
      case ControlChannel::Kind::Fail: {
        failed_ = true;
        const auto nl = m->payload.find('\n');
        throw CommError(m->payload.substr(0, nl),
                        nl == std::string::npos ? "failed" : m->payload.substr(nl + 1));
      }
      case ControlChannel::Kind::Ping:
        ch_.post(m->src, ControlChannel::Kind::Pong, "");
        break;
      case ControlChannel::Kind::Pong:
        if (static_cast<std::size_t>(m->src) < answered_.size())
          answered_[static_cast<std::size_t>(m->src)] = 1;
        break;
    }
  }
}

void Watchdog::diagnose(const std::vector<int>& peers) {
  answered_.assign(static_cast<std::size_t>(size_), 0);
  answered_[static_cast<std::size_t>(rank_)] = 1;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) ch_.post(p, ControlChannel::Kind::Ping, "");
  const auto until = Clock::now() + std::chrono::duration<double>(std::min(5.0, timeout_));
  while (Clock::now() < until &&
         std::find(answered_.begin(), answered_.end(), 0) != answered_.end()) {
    watch();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  failed_ = true;
  std::string dead, waited;
  for (int p = 0; p < size_; ++p)
    if (!answered_[static_cast<std::size_t>(p)])
      dead += (dead.empty() ? "" : ",") + std::to_string(p);
  for (int p : peers) waited += (waited.empty() ? "" : ",") + std::to_string(p);
  const std::string after = "no progress for " + std::to_string(timeout_) + " s";
  if (!dead.empty())
    throw CommError("device " + dead, "failed: " + after + " and no answer to a liveness check");
  throw CommError("device " + waited, after + " although every device is alive (plans disagree?)");
}

void Watchdog::abandon(const std::string& field, const std::string& cause) {
  failed_ = true;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) ch_.post(p, ControlChannel::Kind::Fail, field + "\n" + cause);
}

}  // namespace meshcast::detail
