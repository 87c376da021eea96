// Bootstrap's collectives over allgather, and TcpBootstrap: a star of TCP connections around
// rank 0 (its start from the environment, LaunchEnv, is launch_env.cc). Every socket is
// non-blocking in effect (poll, then MSG_DONTWAIT), so that every wait has a deadline; every call
// is checked; sockets close with their owners. Rank 0 serves its peers concurrently (one poll over
// all of them), in the rendezvous and in each round.
//
// Wire format (integers little-endian); every message opens with magic (u32) and kind (u32):
//   hello    (rank r -> 0)   rank u32, size u32, job key digest (16 bytes)
//   welcome  (0 -> rank r)   job key digest (16 bytes)
//   error    (0 -> rank r)   length u32 (<= 512), text: the hello was refused or the job failed
//   mine     (rank r -> 0)   length u64, bytes: one allgather contribution
//   table    (0 -> rank r)   rank count u32, then per rank length u64 and bytes
// Every length read is checked against its bound before anything is allocated, and buffers grow
// with the bytes that arrive, not with the length announced.
#include "meshcast/bootstrap.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <sstream>
#include <thread>
#include <utility>

#include "lib/support/text.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"

namespace meshcast {

long long Bootstrap::sum(long long value) {
  std::vector<unsigned char> mine(8);
  const auto u = static_cast<std::uint64_t>(value);
  for (int i = 0; i < 8; ++i)
    mine[static_cast<std::size_t>(i)] = static_cast<unsigned char>(u >> (8 * i));
  std::uint64_t total = 0;  // unsigned: wraps like a two's complement sum, without overflow UB
  for (const auto& b : allgather(mine)) {
    if (b.size() != 8)
      throw CommError("bootstrap", "sum: a rank contributed " + std::to_string(b.size()) +
                                       " bytes instead of 8 (ranks out of step?)");
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{b[static_cast<std::size_t>(i)]} << (8 * i);
    total += v;
  }
  return static_cast<long long>(total);
}

void Bootstrap::barrier() { (void)allgather({}); }

namespace {

using Clock = std::chrono::steady_clock;
using Digest = std::array<unsigned char, 16>;

constexpr std::uint32_t kMagic = 0x3262636d;  // "mcb2"
enum Kind : std::uint32_t { kHello = 1, kWelcome = 2, kError = 3, kMine = 4, kTable = 5 };
constexpr std::size_t kHelloBytes = 32;
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 30;       // one rank's bytes in a round
constexpr std::uint64_t kMaxTableBytes = std::uint64_t{4} << 30;  // all ranks' bytes in a round
constexpr std::uint32_t kMaxErrorText = 512;
constexpr std::size_t kMaxPending = 64;  // connections rank 0 holds before their hello...
constexpr double kHelloSeconds = 10;     // ...each for at most this long

[[noreturn]] void fail(const std::string& cause) { throw CommError("bootstrap", cause); }

std::string errno_text(int err) { return std::strerror(err); }

std::string seconds_text(double s) {
  std::ostringstream o;
  o << s << " s";
  return o.str();
}

// At most 8 rank ids, then how many more.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size() && i < 8; ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ranks[i]);
  }
  if (ranks.size() > 8) out += ",... (" + std::to_string(ranks.size() - 8) + " more)";
  return out;
}

// Text from the wire, fit for one line of a message.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, kMaxErrorText)) out += (c >= 32 && c < 127) ? c : '?';
  return out;
}

void put_le(std::vector<unsigned char>& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
std::uint64_t get_le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

// A 128-bit digest of the job key (two 64-bit FNV-1a variants, finished by splitmix64's mixer):
// enough to tell jobs apart; not a secret.
Digest digest_of(std::string_view key) {
  std::uint64_t a = 0xcbf29ce484222325ULL, b = 0x6a09e667f3bcc909ULL ^ key.size();
  for (unsigned char c : key) {
    a = (a ^ c) * 0x100000001b3ULL;
    b = (b ^ c) * 0x9e3779b97f4a7c15ULL;
  }
  const auto mix = [](std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  a = mix(a);
  b = mix(b ^ a);
  Digest d{};
  for (int i = 0; i < 8; ++i) {
    d[static_cast<std::size_t>(i)] = static_cast<unsigned char>(a >> (8 * i));
    d[static_cast<std::size_t>(8 + i)] = static_cast<unsigned char>(b >> (8 * i));
  }
  return d;
}

std::vector<unsigned char> error_frame(const std::string& text) {
  const std::string t = printable(text);
  std::vector<unsigned char> f;
  put_le(f, kMagic, 4);
  put_le(f, kError, 4);
  put_le(f, t.size(), 4);
  f.insert(f.end(), t.begin(), t.end());
  return f;
}

// A socket, closed by its destructor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Socket() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

int millis_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

// Waits until `fd` is ready for `events` (or has an error or end the next call reports); false
// when the deadline passed first. `revents` gets what poll reported.
bool wait_ready(int fd, short events, Clock::time_point deadline, short* revents = nullptr) {
  while (true) {
    const int left = millis_until(deadline);
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, left);
    if (rc > 0) {
      if (revents) *revents = p.revents;
      return true;
    }
    if (rc < 0 && errno != EINTR) fail("poll: " + errno_text(errno));
  }
}

// How a transfer ended.
enum class Io { ok, closed, reset, timeout };

std::string ended_text(Io st, const std::string& peer) {
  return peer + (st == Io::reset ? " reset" : " closed") + " the connection (it ended or failed)";
}

// Moves at most n > 0 bytes without waiting; `moved` is 0 when nothing could move yet.
Io recv_some(int fd, void* p, std::size_t n, std::size_t& moved, const std::string& peer) {
  moved = 0;
  while (true) {
    const ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      moved = static_cast<std::size_t>(k);
      return Io::ok;
    }
    if (k == 0) return Io::closed;
    const int e = errno;
    if (e == EINTR) continue;
    if (e == EAGAIN || e == EWOULDBLOCK) return Io::ok;
    if (e == ECONNRESET) return Io::reset;
    fail("receiving from " + peer + ": " + errno_text(e));
  }
}
Io send_some(int fd, const void* p, std::size_t n, std::size_t& moved, const std::string& peer) {
  moved = 0;
  while (true) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k >= 0) {
      moved = static_cast<std::size_t>(k);
      return Io::ok;
    }
    const int e = errno;
    if (e == EINTR) continue;
    if (e == EAGAIN || e == EWOULDBLOCK) return Io::ok;
    if (e == EPIPE) return Io::closed;
    if (e == ECONNRESET) return Io::reset;
    fail("sending to " + peer + ": " + errno_text(e));
  }
}

Io read_exact(int fd, void* data, std::size_t n, Clock::time_point deadline,
              const std::string& peer) {
  auto* p = static_cast<unsigned char*>(data);
  while (n > 0) {
    if (!wait_ready(fd, POLLIN, deadline)) return Io::timeout;
    std::size_t k = 0;
    if (const Io st = recv_some(fd, p, n, k, peer); st != Io::ok) return st;
    p += k;
    n -= k;
  }
  return Io::ok;
}

// Sends n bytes; with `watch`, stops early (setting *interrupted) when bytes arrive meanwhile.
Io write_exact(int fd, const void* data, std::size_t n, Clock::time_point deadline,
               const std::string& peer, bool* interrupted = nullptr) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    short ev = 0;
    if (!wait_ready(fd, interrupted ? POLLOUT | POLLIN : POLLOUT, deadline, &ev))
      return Io::timeout;
    if (interrupted && (ev & POLLIN)) {
      *interrupted = true;
      return Io::ok;
    }
    std::size_t k = 0;
    if (const Io st = send_some(fd, p, n, k, peer); st != Io::ok) return st;
    p += k;
    n -= k;
  }
  return Io::ok;
}

// Blocking transfers on one connection that throw CommError naming `peer`.
struct Conn {
  int fd;
  const std::string& peer;
  const std::string& timeout;

  void check(Io st, bool reading) const {
    if (st == Io::ok) return;
    if (st == Io::timeout)
      fail((reading ? "no message from " : "could not send to ") + peer + " within " + timeout);
    fail(ended_text(st, peer));
  }
  void recv(void* p, std::size_t n, Clock::time_point d) const {
    check(read_exact(fd, p, n, d, peer), true);
  }
  // Appends n bytes to `out`, which grows with the bytes that arrive.
  void recv_growing(std::vector<unsigned char>& out, std::uint64_t n, Clock::time_point d) const {
    std::uint64_t have = 0;
    while (have < n) {
      const auto step = std::min<std::uint64_t>(n - have, std::max<std::uint64_t>(have, 1 << 16));
      out.resize(static_cast<std::size_t>(have + step));
      recv(out.data() + have, static_cast<std::size_t>(step), d);
      have += step;
    }
  }
  // The text of an error message whose header was read.
  std::string error_text(Clock::time_point d) const {
    unsigned char b[4];
    recv(b, 4, d);
    const auto n = static_cast<std::uint32_t>(get_le(b, 4));
    if (n > kMaxErrorText) fail(peer + " sent an error message of " + std::to_string(n) + " bytes");
    std::string text(n, '\0');
    recv(text.data(), n, d);
    return printable(text);
  }
};

// Small messages and slow peers: no Nagle delay; idle connections probed (keepalive), so that a
// vanished host shows as an error within about 2 + 3 * 2 s.
void tune(int fd) {
  const auto set = [fd](int level, int name, int value, const char* what) {
    if (::setsockopt(fd, level, name, &value, sizeof value) != 0)
      fail(std::string("setsockopt(") + what + "): " + errno_text(errno));
  };
  set(IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
  set(SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE");
  set(IPPROTO_TCP, TCP_KEEPIDLE, 2, "TCP_KEEPIDLE");
  set(IPPROTO_TCP, TCP_KEEPINTVL, 2, "TCP_KEEPINTVL");
  set(IPPROTO_TCP, TCP_KEEPCNT, 3, "TCP_KEEPCNT");
}

struct AddrInfoFree {
  void operator()(addrinfo* a) const { ::freeaddrinfo(a); }
};
using AddrList = std::unique_ptr<addrinfo, AddrInfoFree>;

// Host names are letters, digits, '.', '-', '_'; IPv6 literals add ':' and '%' (a scope).
bool plausible_host(const std::string& h) {
  if (h.empty() || h.size() > 253) return false;
  for (char c : h)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' &&
        c != ':' && c != '%')
      return false;
  return true;
}

AddrList resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res)
    throw ValidationError("host", "cannot resolve '" + host + "': " +
                                      (rc == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(rc)));
  return AddrList(res);
}

void reuse_address(int fd) {
  const int one = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    fail("setsockopt(SO_REUSEADDR): " + errno_text(errno));
}

// True if a loopback connect met itself (TCP simultaneous open when the ephemeral source port
// happens to equal the target port while nobody listens).
bool self_connected(int fd) {
  sockaddr_storage a{}, b{};
  socklen_t la = sizeof a, lb = sizeof b;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &la) != 0)
    fail("getsockname: " + errno_text(errno));
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&b), &lb) != 0) return false;
  return la == lb && std::memcmp(&a, &b, la) == 0;
}

// One connection attempt to `a`, waiting at most a second (so that a lost SYN is retried);
// invalid with the reason in `why` when it failed.
Socket connect_once(const addrinfo* a, Clock::time_point until, std::string& why) {
  // Past the deadline no attempt is made: `why` keeps the last real reason (an attempt given no
  // time said "timed out" where every one had been refused).
  if (Clock::now() >= until) return {};
  Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
  if (!s.valid()) fail("socket: " + errno_text(errno));
  // Should this socket meet itself on rank 0's port, SO_REUSEADDR keeps it from blocking rank
  // 0's bind (Linux refuses a bind beside a socket of the port that lacks it).
  reuse_address(s.get());
  int rc = ::connect(s.get(), a->ai_addr, a->ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    if (!wait_ready(s.get(), POLLOUT, std::min(until, Clock::now() + std::chrono::seconds(1)))) {
      why = errno_text(ETIMEDOUT);
      return {};
    }
    socklen_t len = sizeof rc;
    if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &rc, &len) != 0)
      fail("getsockopt(SO_ERROR): " + errno_text(errno));
  } else if (rc != 0) {
    rc = errno;
  }
  if (rc == 0 && self_connected(s.get())) {
    // Closed abortively: a graceful close would hold rank 0's port in TIME_WAIT for a minute.
    const linger abort{1, 0};
    (void)::setsockopt(s.get(), SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
    rc = ECONNREFUSED;
  }
  if (rc != 0) {
    why = errno_text(rc);
    return {};
  }
  return s;
}

// Rank 0's listening socket on the first address that takes it. SO_REUSEADDR lets a new job
// bind while an old one's connections linger in TIME_WAIT; Linux still refuses a second
// listener on the port, and an address in use ends the search (rather than listening on the
// next address of the name, where this job's peers might not look first).
Socket listen_on(const AddrList& addrs, const std::string& where) {
  int err = EADDRNOTAVAIL;
  for (const addrinfo* a = addrs.get(); a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      err = errno;
      continue;
    }
    reuse_address(s.get());
    if (::bind(s.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(s.get(), SOMAXCONN) != 0) {
      err = errno;
      if (err == EADDRINUSE) break;
      continue;
    }
    return s;
  }
  fail("rank 0 cannot listen on " + where + ": " + errno_text(err) +
       (err == EADDRINUSE ? " (another job's rank 0 listens there? give each job its own port)"
                          : ""));
}

// A contribution rank 0 is receiving: the header, then the bytes.
struct Inbound {
  unsigned char head[16] = {};
  std::size_t have = 0;  // header bytes so far
  std::uint64_t len = 0, got = 0;
  bool done() const { return have == sizeof head && got == len; }
};

// Reads what has arrived of one contribution without waiting; true once it is complete.
// `total` adds up the lengths announced in this round, bounded by kMaxTableBytes.
bool pull(int fd, Inbound& in, std::vector<unsigned char>& out, const std::string& peer,
          std::uint64_t& total) {
  while (in.have < sizeof in.head) {
    std::size_t k = 0;
    const Io st = recv_some(fd, in.head + in.have, sizeof in.head - in.have, k, peer);
    if (st != Io::ok) fail(ended_text(st, peer));
    if (k == 0) return false;
    in.have += k;
    if (in.have < sizeof in.head) continue;
    if (get_le(in.head, 4) != kMagic || get_le(in.head + 4, 4) != kMine)
      fail(peer +
           " sent something that is not a meshcast bootstrap message (out of step, or not a "
           "meshcast process)");
    in.len = get_le(in.head + 8, 8);
    if (in.len > kMaxBytes)
      fail(peer + " announced " + std::to_string(in.len) + " bytes (at most 1 GiB per rank)");
    total += in.len;
    if (total > kMaxTableBytes)
      fail(peer + " announced " + std::to_string(in.len) +
           " bytes: the round's table would exceed 4 GiB");
  }
  while (in.got < in.len) {
    if (in.got == out.size())  // grow with what arrives: double, at least 64 KiB
      out.resize(static_cast<std::size_t>(
          std::min<std::uint64_t>(in.len, std::max<std::uint64_t>(2 * in.got, 1 << 16))));
    std::size_t k = 0;
    const Io st = recv_some(fd, out.data() + in.got, out.size() - in.got, k, peer);
    if (st != Io::ok) fail(ended_text(st, peer));
    if (k == 0) return false;
    in.got += k;
  }
  return true;
}

}  // namespace

struct TcpBootstrap::Impl {
  std::string where;    // "host:port", for messages
  std::string timeout;  // "60 s", for messages
  double seconds = 60;
  int rank = 0, size = 1;
  Digest key{};
  std::vector<Socket> links;  // rank 0: index r leads to rank r (index 0 unused); others: {rank 0}
  std::string broken;         // the failure that ended this bootstrap; empty while it works

  ~Impl() {
    if (broken.empty()) return;
    // Unread bytes would make close() reset the connection, which could overtake the error
    // message a peer has not read yet: read what is there first.
    unsigned char sink[65536];
    for (auto& s : links)
      for (int i = 0; s.valid() && i < 256 && ::recv(s.get(), sink, sizeof sink, MSG_DONTWAIT) > 0;)
        ++i;
  }

  Clock::time_point after(double s) const {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  Clock::time_point deadline() const { return after(seconds); }
  std::string peer(int r) const {
    return rank == 0 ? "rank " + std::to_string(r) : "rank 0 (" + where + ")";
  }

  void listen_and_accept(const AddrList& addrs);
  void connect_to_root(const AddrList& addrs);
  bool handshake(int fd, Clock::time_point until, std::string& why) const;
  std::vector<std::vector<unsigned char>> gather_as_root(const std::vector<unsigned char>& mine);
  std::vector<std::vector<unsigned char>> gather_as_peer(const std::vector<unsigned char>& mine);
  [[noreturn]] void abort_job(const std::string& cause);
};

// Rank 0: tells every connected rank why the job ends (best effort, for at most 2 s), then
// throws. The ranks read it at their next receive, even one that is sending.
void TcpBootstrap::Impl::abort_job(const std::string& cause) {
  broken = cause;
  const auto frame = error_frame(cause);
  const auto until = Clock::now() + std::chrono::seconds(2);
  for (std::size_t r = 1; r < links.size(); ++r) {
    if (!links[r].valid()) continue;
    try {
      (void)write_exact(links[r].get(), frame.data(), frame.size(), until, peer(int(r)));
    } catch (const CommError&) {  // that one failed too: it learns from the closed connection
    }
  }
  fail(cause);
}

void TcpBootstrap::Impl::listen_and_accept(const AddrList& addrs) {
  Socket lsock = listen_on(addrs, where);
  struct Pending {
    Socket sock;
    Clock::time_point until;  // its hello is due
    std::array<unsigned char, kHelloBytes> hello{};
    std::size_t have = 0;
  };
  std::vector<Pending> pending;
  std::vector<pollfd> fds;
  const auto until = deadline();
  const double hello_seconds = std::min(seconds, kHelloSeconds);
  int joined = 0, other_job = 0, stranger = 0, idle = 0;
  // Refuses one connection, telling it why (best effort).
  const auto refuse = [&](const Socket& s, const std::string& why) {
    const auto f = error_frame(why);
    try {
      (void)write_exact(s.get(), f.data(), f.size(), after(std::min(1.0, hello_seconds)), "");
    } catch (const CommError&) {
    }
  };
  while (joined < size - 1) {
    const auto now = Clock::now();
    std::erase_if(pending, [&](const Pending& p) { return p.until <= now && ++idle; });
    if (now >= until) {
      std::vector<int> missing;
      for (int r = 1; r < size; ++r)
        if (!links[static_cast<std::size_t>(r)].valid()) missing.push_back(r);
      std::string refused;
      if (other_job + stranger + idle > 0)
        refused = "; refused " + std::to_string(other_job) + " connection(s) of another job, " +
                  std::to_string(stranger) + " not from meshcast, " + std::to_string(idle) +
                  " idle";
      abort_job("only " + std::to_string(joined) + " of " + std::to_string(size - 1) +
                " ranks connected to " + where + " within " + timeout + " (missing: rank " +
                rank_list(missing) + refused + ")");
    }
    auto wake = until;
    fds.assign(1, pollfd{lsock.get(), POLLIN, 0});
    for (const auto& p : pending) {
      fds.push_back(pollfd{p.sock.get(), POLLIN, 0});
      wake = std::min(wake, p.until);
    }
    if (::poll(fds.data(), fds.size(), millis_until(wake)) < 0 && errno != EINTR)
      fail("poll: " + errno_text(errno));
    // Hellos first (fds[i + 1] is pending[i]); then new connections.
    std::vector<bool> done(pending.size());
    for (std::size_t i = 0; i < pending.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      Pending& p = pending[i];
      std::size_t k = 0;
      Io st = Io::closed;
      try {
        st = recv_some(p.sock.get(), p.hello.data() + p.have, kHelloBytes - p.have, k, "");
      } catch (const CommError&) {
      }
      p.have += k;
      if (st != Io::ok) {
        done[i] = true;  // it left before its hello: not one of ours
        continue;
      }
      const unsigned char* h = p.hello.data();
      if (p.have >= 8 && (get_le(h, 4) != kMagic || get_le(h + 4, 4) != kHello)) {
        refuse(p.sock, "this port is a meshcast rendezvous (" + where +
                           "); that was not a meshcast bootstrap hello");
        ++stranger;
        done[i] = true;
        continue;
      }
      if (p.have < kHelloBytes) continue;
      done[i] = true;  // it joins, or is refused
      const auto r = get_le(h + 8, 4), n = get_le(h + 12, 4);
      if (!std::equal(key.begin(), key.end(), h + 16)) {
        refuse(p.sock, "the rank 0 at " + where +
                           " belongs to another job (the job keys differ: give "
                           "every rank of a job the same MESHCAST_JOB_KEY, or the same command)");
        ++other_job;
        continue;
      }
      std::string wrong;
      if (n != static_cast<std::uint64_t>(size))
        wrong = "a process connected as rank " + std::to_string(r) + " of " + std::to_string(n) +
                " ranks, but rank 0 was started with " + std::to_string(size) +
                " (the variable that gives the job's size differs: MESHCAST_SIZE, WORLD_SIZE, "
                "SLURM_NTASKS or OMPI_COMM_WORLD_SIZE)";
      else if (r == 0 || r >= n)
        wrong =
            "a process connected with rank " + std::to_string(r) + " of " + std::to_string(size);
      else if (links[r].valid())
        wrong = "two processes connected as rank " + std::to_string(r) +
                " (two jobs with one job key on this port? give each its own MESHCAST_JOB_KEY)";
      if (!wrong.empty()) {
        refuse(p.sock, wrong);
        abort_job(wrong);
      }
      tune(p.sock.get());
      std::vector<unsigned char> welcome;
      put_le(welcome, kMagic, 4);
      put_le(welcome, kWelcome, 4);
      welcome.insert(welcome.end(), key.begin(), key.end());
      if (write_exact(p.sock.get(), welcome.data(), welcome.size(), std::min(until, p.until),
                      peer(int(r))) != Io::ok)
        continue;  // it left: the slot stays free
      links[r] = std::move(p.sock);
      ++joined;
    }
    for (std::size_t i = pending.size(); i-- > 0;)
      if (done[i]) pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    if (!(fds[0].revents & POLLIN)) continue;
    while (true) {
      const int fd = ::accept4(lsock.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        const int e = errno;
        if (e == EINTR || e == ECONNABORTED || e == EPROTO) continue;
        if (e == EAGAIN || e == EWOULDBLOCK) break;
        if ((e == EMFILE || e == ENFILE) && !pending.empty()) {  // make room: drop the oldest
          pending.erase(pending.begin());
          ++idle;
          break;
        }
        fail("accept on " + where + ": " + errno_text(e));
      }
      if (pending.size() >= kMaxPending) {
        pending.erase(pending.begin());
        ++idle;
      }
      pending.push_back(Pending{Socket(fd), after(hello_seconds)});
    }
  }
}  // the listening socket closes here: the port is free again

// Sends this rank's hello and reads rank 0's answer: true when welcomed by this job's rank 0;
// false (with the reason in `why`) when the connection closed first, worth another try.
bool TcpBootstrap::Impl::handshake(int fd, Clock::time_point until, std::string& why) const {
  const std::string who = "rank 0 at " + where;
  std::vector<unsigned char> hello;
  put_le(hello, kMagic, 4);
  put_le(hello, kHello, 4);
  put_le(hello, static_cast<std::uint32_t>(rank), 4);
  put_le(hello, static_cast<std::uint32_t>(size), 4);
  hello.insert(hello.end(), key.begin(), key.end());
  unsigned char head[8];
  Io st = write_exact(fd, hello.data(), hello.size(), until, who);
  if (st == Io::ok) st = read_exact(fd, head, sizeof head, until, who);
  if (st == Io::closed || st == Io::reset) {
    why = "the process listening there closed the connection before answering";
    return false;
  }
  if (st == Io::timeout)
    fail("the process listening at " + where + " took rank " + std::to_string(rank) +
         "'s connection but did not answer within " + timeout);
  const std::string alien = "the process listening at " + where +
                            " is not a meshcast rank 0 (it answered with something else)";
  if (get_le(head, 4) != kMagic) fail(alien);
  const Conn c{fd, who, timeout};
  const auto kind = get_le(head + 4, 4);
  if (kind == kError)
    fail(who + " refused rank " + std::to_string(rank) + ": " + c.error_text(until));
  Digest theirs{};
  if (kind != kWelcome) fail(alien);
  c.recv(theirs.data(), theirs.size(), until);
  if (theirs != key)
    fail("the rank 0 at " + where +
         " belongs to another job (the job keys differ: give every rank of a job the same "
         "MESHCAST_JOB_KEY, or the same command)");
  return true;
}

void TcpBootstrap::Impl::connect_to_root(const AddrList& addrs) {
  const auto until = deadline();
  auto pause = std::chrono::milliseconds(10);
  std::string why = errno_text(ECONNREFUSED);
  while (true) {
    for (const addrinfo* a = addrs.get(); a; a = a->ai_next) {
      Socket s = connect_once(a, until, why);
      if (!s.valid()) continue;
      tune(s.get());
      if (!handshake(s.get(), until, why)) continue;
      links[0] = std::move(s);
      return;
    }
    const auto now = Clock::now();
    if (now >= until)
      fail("rank " + std::to_string(rank) + " could not connect to rank 0 at " + where +
           " within " + timeout + ": " + why);
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, until - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

std::vector<std::vector<unsigned char>> TcpBootstrap::Impl::gather_as_root(
    const std::vector<unsigned char>& mine) {
  const auto d = deadline();
  std::vector<std::vector<unsigned char>> all(static_cast<std::size_t>(size));
  all[0] = mine;
  // Every rank's bytes, from whichever is ready: a rank that failed is seen at once.
  std::vector<Inbound> in(static_cast<std::size_t>(size));
  std::vector<pollfd> fds;
  for (int r = 1; r < size; ++r)
    fds.push_back(pollfd{links[static_cast<std::size_t>(r)].get(), POLLIN, 0});
  std::uint64_t total = mine.size();
  for (int left = size - 1; left > 0;) {
    const int ms = millis_until(d);
    if (ms <= 0) {
      std::vector<int> late;
      for (int r = 1; r < size; ++r)
        if (!in[static_cast<std::size_t>(r)].done()) late.push_back(r);
      abort_job("no message from rank " + rank_list(late) + " within " + timeout);
    }
    if (::poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR)
      fail("poll: " + errno_text(errno));
    for (int r = 1; r < size; ++r) {
      pollfd& p = fds[static_cast<std::size_t>(r - 1)];
      if (p.fd < 0 || p.revents == 0) continue;
      const auto i = static_cast<std::size_t>(r);
      try {
        if (!pull(p.fd, in[i], all[i], peer(r), total)) continue;
      } catch (const CommError& e) {
        abort_job(e.cause());
      }
      p.fd = -1;  // done: poll skips it
      --left;
    }
  }
  // The table, once, then to every rank.
  std::vector<unsigned char> table;
  put_le(table, kMagic, 4);
  put_le(table, kTable, 4);
  put_le(table, static_cast<std::uint32_t>(size), 4);
  for (const auto& bytes : all) {
    put_le(table, bytes.size(), 8);
    table.insert(table.end(), bytes.begin(), bytes.end());
  }
  for (int r = 1; r < size; ++r) {
    const Io st = write_exact(links[static_cast<std::size_t>(r)].get(), table.data(), table.size(),
                              d, peer(r));
    if (st == Io::timeout) abort_job("could not send to " + peer(r) + " within " + timeout);
    if (st != Io::ok) abort_job(ended_text(st, peer(r)));
  }
  return all;
}

std::vector<std::vector<unsigned char>> TcpBootstrap::Impl::gather_as_peer(
    const std::vector<unsigned char>& mine) {
  const auto d = deadline();
  const std::string who = peer(0);
  const Conn c{links[0].get(), who, timeout};
  std::vector<unsigned char> head;
  put_le(head, kMagic, 4);
  put_le(head, kMine, 4);
  put_le(head, mine.size(), 8);
  // While sending, watch for an answer: rank 0 only answers early to end the job.
  bool early = false;
  c.check(write_exact(c.fd, head.data(), head.size(), d, who, &early), false);
  if (!early) c.check(write_exact(c.fd, mine.data(), mine.size(), d, who, &early), false);
  // Rank 0 answers once every rank's part arrived, or names the silent rank at its own
  // deadline, which may come after this one's (it may have started later): waiting as long
  // blamed rank 0, healthy, for another rank's silence.
  const auto answer = after(2 * seconds);
  unsigned char h[12];
  c.recv(h, 8, answer);
  if (get_le(h, 4) != kMagic)
    fail(who + " sent something that is not a meshcast bootstrap message (out of step?)");
  if (get_le(h + 4, 4) == kError) fail(who + " reports: " + c.error_text(answer));
  if (get_le(h + 4, 4) != kTable || early) fail(who + " answered out of step");
  c.recv(h + 8, 4, answer);
  if (get_le(h + 8, 4) != static_cast<std::uint64_t>(size))
    fail(who + " answered with a table of another size");
  std::vector<std::vector<unsigned char>> all(static_cast<std::size_t>(size));
  std::uint64_t total = 0;
  for (auto& bytes : all) {
    unsigned char b[8];
    c.recv(b, 8, answer);
    const std::uint64_t n = get_le(b, 8);
    total += n;
    if (n > kMaxBytes || total > kMaxTableBytes)
      fail(who + " announced " + std::to_string(n) + " bytes for one rank (at most 1 GiB, 4 GiB " +
           "for all)");
    c.recv_growing(bytes, n, answer);
  }
  return all;
}

TcpBootstrap::TcpBootstrap(std::string host, int port, int rank, int size, double timeout_seconds,
                           const std::string& job_key)
    : impl_(std::make_unique<Impl>()) {
  if (!plausible_host(host))
    throw ValidationError("host", detail::quote(host) + " is not a host name or IP address");
  if (port < 1 || port > 65535)
    throw ValidationError("port", std::to_string(port) + " is not a TCP port (1-65535)");
  if (size < 1) throw ValidationError("size", std::to_string(size) + " ranks: need at least 1");
  check_limit("size", size, limits().devices, "DEVICES");
  if (rank < 0 || rank >= size)
    throw ValidationError("rank",
                          std::to_string(rank) + " is not in [0, " + std::to_string(size) + ")");
  if (!(timeout_seconds > 0) || !std::isfinite(timeout_seconds) || timeout_seconds > 1e7)
    throw ValidationError("timeout",
                          seconds_text(timeout_seconds) + ": need a positive number of seconds");
  Impl& m = *impl_;
  m.where =
      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  m.timeout = seconds_text(timeout_seconds);
  m.seconds = timeout_seconds;
  m.rank = rank;
  m.size = size;
  m.key = digest_of(job_key);
  if (size == 1) return;  // nobody to meet
  const AddrList addrs = resolve(host, port);
  m.links.resize(rank == 0 ? static_cast<std::size_t>(size) : 1);
  if (rank == 0)
    m.listen_and_accept(addrs);
  else
    m.connect_to_root(addrs);
}

TcpBootstrap::~TcpBootstrap() = default;

int TcpBootstrap::rank() const { return impl_->rank; }
int TcpBootstrap::size() const { return impl_->size; }

std::vector<std::vector<unsigned char>> TcpBootstrap::allgather(
    const std::vector<unsigned char>& mine) {
  Impl& m = *impl_;
  if (mine.size() > kMaxBytes) throw ValidationError("bootstrap", "allgather of more than 1 GiB");
  if (!m.broken.empty()) fail("unusable after an earlier failure: " + m.broken);
  if (m.size == 1) return {mine};
  try {
    return m.rank == 0 ? m.gather_as_root(mine) : m.gather_as_peer(mine);
  } catch (const CommError& e) {
    if (m.broken.empty()) m.broken = e.cause();
    throw;
  }
}

}  // namespace meshcast
