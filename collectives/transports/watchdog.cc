#include "watchdog.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <fstream>
#include <functional>
#include <iomanip>
#include <span>
#include <sstream>
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
std::string rank_list(std::span<const int> ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size() && i < 8; ++i)
    s += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += " and " + std::to_string(ranks.size() - 8) + " more";
  return s;
}

// Text for one line of a notice: line breaks become spaces, at most `most` bytes.
std::string one_line(const std::string& text, std::size_t most) {
  std::string s = text.substr(0, most);
  std::replace_if(
      s.begin(), s.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  if (text.size() > most) s += "...";
  return s;
}

// Parses a notice's "device\nfield\ncause" (see Watchdog::abandon) into the error it announces.
CommError notice_error(const std::string& payload) {
  const auto a = payload.find('\n');
  const auto b = a == std::string::npos ? a : payload.find('\n', a + 1);
  if (b == std::string::npos) return CommError("peer", "failed (a malformed failure notice)");
  int device = -1;
  const auto [end, ec] = std::from_chars(payload.data(), payload.data() + a, device);
  if (ec != std::errc() || end != payload.data() + a) device = -1;
  const std::string cause = one_line(payload.substr(b + 1), Watchdog::kMaxCause);
  if (device >= 0) return CommError(device, cause);
  return CommError(payload.substr(a + 1, b - a - 1), cause);
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
    // Told to the others, as peer_failed() does: this process may end next (a survivor that
    // learned of the failure and is done), and a peer that then finds it gone before the
    // failed one would name it instead (a ucx exit conformance run under load did).
    const CommError e(rank, "failed: its process (pid " + std::to_string(pid) + ") ended");
    abandon(e);
    throw e;
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

void Watchdog::check_notices() {
  const auto now = Clock::now();
  if (now < next_notices_) return;
  next_notices_ = now + std::chrono::milliseconds(1);
  poll_notices();
}

void Watchdog::poll_notices() {
  while (auto m = ch_.poll()) {
    switch (m->kind) {
      case ControlChannel::Kind::Fail:
        failed_ = true;
        throw notice_error(m->payload);
      case ControlChannel::Kind::Ping:  // "round": answered "round progress"
        ch_.post(m->src, ControlChannel::Kind::Pong, m->payload + ' ' + std::to_string(progress_));
        break;
      case ControlChannel::Kind::Pong: {
        const auto src = static_cast<std::size_t>(m->src);
        const char* const end = m->payload.data() + m->payload.size();
        std::uint64_t round = 0;
        std::int64_t count = -1;  // a malformed answer: no progress heard
        const auto r = std::from_chars(m->payload.data(), end, round);
        if (r.ec != std::errc() || r.ptr == end || round != round_ || src >= answered_.size())
          break;  // an earlier round's answer, late: not this round's
        std::from_chars(r.ptr + 1, end, count);
        answered_[src] = 1;
        heard_[src] = count;
        break;
      }
    }
  }
}

void Watchdog::ping_all(double waited) {
  answered_.assign(static_cast<std::size_t>(size_), 0);
  heard_.assign(static_cast<std::size_t>(size_), -1);
  answered_[static_cast<std::size_t>(rank_)] = 1;
  heard_[static_cast<std::size_t>(rank_)] = progress_;
  const std::string round = std::to_string(++round_);
  for (int p = 0; p < size_; ++p)
    if (p != rank_) ch_.post(p, ControlChannel::Kind::Ping, round);
  const auto until = Clock::now() + std::chrono::duration<double>(std::min(5.0, waited));
  // Notices only: a peer that ends meanwhile (it gave up on the same silent device) must not
  // be named for it.
  while (Clock::now() < until &&
         std::find(answered_.begin(), answered_.end(), 0) != answered_.end()) {
    poll_notices();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void Watchdog::check_wait(Clock::time_point since, std::span<const int> peers) {
  const auto half =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_ / 2));
  if (since != wait_since_) {  // another wait, or this one progressed: asked afresh
    wait_since_ = since;
    next_ask_ = since + half;
    asked_.clear();
  }
  const auto now = Clock::now();
  if (now < next_ask_) return;
  // Past the timeout a round decides, with diagnose()'s grace; the first (half the timeout in)
  // only takes a baseline, and a peer that does not answer it at once (busy outside meshcast a
  // moment) leaves none of its own: a silent peer is named at the timeout plus the grace.
  const bool due = now - since >= 2 * half;
  ping_all(due ? timeout_ : std::min(1.0, timeout_ / 4));
  const bool all = std::find(answered_.begin(), answered_.end(), 0) == answered_.end();
  // Progress within the last timeout: against the round before the last (the last, at the
  // first decision), on the ranks that answered both.
  bool moved = false;
  if (!asked_.empty())
    for (std::size_t r = 0; r < heard_.size(); ++r)
      moved |= asked_.front()[r] >= 0 && heard_[r] >= 0 && heard_[r] != asked_.front()[r];
  asked_.push_back(heard_);
  if (asked_.size() > 2) asked_.erase(asked_.begin());
  next_ask_ = due ? Clock::now() + half : since + 2 * half;
  if (!due || (all && moved)) return;
  // This round's answers; the wait's own length (it may have gone on while the job moved).
  named(std::vector<int>(peers.begin(), peers.end()),
        std::chrono::duration<double>(now - since).count(), false);
}

void Watchdog::diagnose(const std::vector<int>& peers, double waited, bool exchange) {
  if (waited < 0) waited = timeout_;
  ping_all(waited);
  named(peers, waited, exchange);
}

void Watchdog::named(const std::vector<int>& peers, double waited, bool exchange) {
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
  // The devices waited on first: a silent device that takes no part in this transfer (busy
  // elsewhere in its program) is not its cause.
  std::stable_partition(silent.begin(), silent.end(), [&](int p) {
    return std::find(peers.begin(), peers.end(), p) != peers.end();
  });
  // "3", "0.5", "12.3", "0.02": to a tenth (a wait measured as 2.00001 s reads "2"; a hundredth
  // below a second), never to_string's "3.000000" nor "1e+06".
  std::ostringstream out;
  out << std::fixed << std::setprecision(waited < 1 ? 2 : 1) << waited;
  std::string seconds = out.str();
  seconds.erase(seconds.find_last_not_of('0') + 1);
  if (seconds.back() == '.') seconds.pop_back();
  const std::string after = "no progress for " + seconds + " s";
  // The first device is the one named; the others follow in the cause.
  const auto also = [](std::span<const int> rest, const char* what) {
    return rest.empty() ? std::string() : std::string(what) + rank_list(rest) + ")";
  };
  if (!silent.empty())
    throw CommError(silent[0], after +
                                   " and no answer to a liveness check (stopped, stuck, or "
                                   "busy outside meshcast)" +
                                   also(std::span(silent).subspan(1), " (also silent: devices "));
  if (exchange)
    throw CommError("exchange", after +
                                    " in an exchange of the job's session (its startup checks, "
                                    "a report, the verification totals) although every rank "
                                    "answers: one is still busy elsewhere (a long plan or "
                                    "prediction: raise MESHCAST_RENDEZVOUS_TIMEOUT) or runs "
                                    "another command");
  // Every peer answers, so the one waited on runs but not this transfer: it skipped or failed the
  // call before starting it (a bad argument), or it runs another plan.
  const std::string alive =
      after +
      " although every device is alive: the device waited on is not in this transfer "
      "(it failed or skipped the call before starting it, or runs another plan)";
  if (peers.empty()) throw CommError("wait", alive);
  throw CommError(peers[0],
                  alive + also(std::span(peers).subspan(1), " (also waited on: devices "));
}

void Watchdog::abandon(const Error& why) {
  failed_ = true;
  if (!announced_)
    announced_ = why.device() >= 0 ? CommError(why.device(), why.cause(), why.field())
                                   : CommError(why.field(), why.cause());
  // "device\nfield\ncause": each part one line, so that the notice splits unambiguously.
  const std::string notice = std::to_string(why.device()) + "\n" + one_line(why.field(), 100) +
                             "\n" + one_line(why.cause(), kMaxCause);
  for (int p = 0; p < size_; ++p)
    if (p != rank_) ch_.post(p, ControlChannel::Kind::Fail, notice);
}

void Watchdog::peer_failed(int peer, const std::string& cause) {
  const auto grace = Clock::now() + std::chrono::milliseconds(500);
  while (Clock::now() < grace) {
    watch();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const CommError e(peer, cause);
  abandon(e);
  throw e;
}

}  // namespace meshcast::detail
