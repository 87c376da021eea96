#include "watchdog.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "meshcast/error.h"

namespace meshcast::detail {

using Clock = std::chrono::steady_clock;

ProcessId this_process() {
  std::string boot;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot);
  struct stat ns {};
  const bool have_ns = ::stat("/proc/self/ns/pid", &ns) == 0;
  // Without both, no peer matches (a zero boot hash is taken as unknown).
  return {boot.empty() || !have_ns ? 0 : std::hash<std::string>{}(boot) | 1,
          have_ns ? static_cast<std::uint64_t>(ns.st_ino) : 0,
          static_cast<std::uint64_t>(::getpid())};
}

void Watchdog::set_processes(const std::vector<ProcessId>& all) {
  visible_.clear();
  if (static_cast<std::size_t>(rank_) >= all.size()) return;
  const ProcessId& me = all[static_cast<std::size_t>(rank_)];
  if (me[0] == 0) return;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (static_cast<int>(r) != rank_ && all[r][0] == me[0] && all[r][1] == me[1])
      visible_.emplace_back(static_cast<int>(r), static_cast<long>(all[r][2]));
}

// A peer process that no longer exists, or is a zombie (killed, not yet reaped by its launcher).
namespace {
// Whether a process no longer runs: gone, or a zombie (killed, not yet reaped by its launcher).
bool ended(long pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  std::string stat;
  std::getline(std::ifstream("/proc/" + std::to_string(pid) + "/stat"), stat);
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

// "3,5,8" naming at most 8 ranks, then how many more.
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size() && i < 8; ++i)
    s += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += " and " + std::to_string(ranks.size() - 8) + " more";
  return s;
}
}  // namespace

void Watchdog::check_processes() {
  const auto now = Clock::now();
  if (visible_.empty() || now < next_check_) return;
  next_check_ = now + std::chrono::milliseconds(250);
  for (const auto& [rank, pid] : visible_) {
    if (!ended(pid)) continue;
    // A peer that gave up first told us before it ended: a notice still on its way names the
    // device that failed first (poll_notices throws it), and wins over this exit.
    const auto until = Clock::now() + std::chrono::milliseconds(300);
    while (Clock::now() < until) {
      poll_notices();
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    failed_ = true;
    throw CommError("device " + std::to_string(rank),
                    "failed: its process (pid " + std::to_string(pid) + ") ended");
  }
}

void linger(const std::function<bool()>& drained) {
  const auto start = Clock::now();
  const auto least = start + std::chrono::milliseconds(500), most = start + std::chrono::seconds(1);
  while (true) {
    const bool done = drained();
    const auto now = Clock::now();
    if ((done && now >= least) || now >= most) return;
    std::this_thread::sleep_for(std::chrono::microseconds(done ? 1000 : 100));
  }
}

void Watchdog::watch() {
  // Notices first: a peer that gave up (and named the device that failed first) announced it
  // before its process ended, so its exit must not be taken for the failure.
  poll_notices();
  check_processes();
  poll_notices();
}

void Watchdog::poll_notices() {
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
  // Notices only: a peer that ends meanwhile (it gave up on the same silent device) must not
  // be named for it.
  while (Clock::now() < until &&
         std::find(answered_.begin(), answered_.end(), 0) != answered_.end()) {
    poll_notices();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  failed_ = true;
  // Silent peers: those still running (stopped, stuck) are the cause; those whose process
  // ended are named only when no running one is silent.
  std::vector<int> silent, gone;
  for (int p = 0; p < size_; ++p) {
    if (answered_[static_cast<std::size_t>(p)]) continue;
    const auto v = std::find_if(visible_.begin(), visible_.end(),
                                [p](const auto& rp) { return rp.first == p; });
    (v != visible_.end() && ended(v->second) ? gone : silent).push_back(p);
  }
  if (silent.empty()) silent = gone;
  const std::string after = "no progress for " + std::to_string(timeout_) + " s";
  if (!silent.empty())
    throw CommError("device " + rank_list(silent),
                    "failed: " + after + " and no answer to a liveness check");
  throw CommError("device " + rank_list(peers),
                  after + " although every device is alive (plans disagree?)");
}

void Watchdog::abandon(const std::string& field, const std::string& cause) {
  failed_ = true;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) ch_.post(p, ControlChannel::Kind::Fail, field + "\n" + cause);
}

}  // namespace meshcast::detail
