// Bootstrap's collectives over allgather, and TcpBootstrap: a star of TCP connections around
// rank 0. Every socket is non-blocking in effect (poll, then MSG_DONTWAIT), so that every wait
// has a deadline; every call is checked; sockets close with their owners.
//
// Wire format (integers little-endian): a peer opens with HELLO = magic, rank, size (u32 each).
// Each allgather round, a peer sends magic (u32), length (u64), bytes; rank 0 answers with
// magic (u32), rank count (u32), then per rank length (u64) and bytes.
#include "meshcast/bootstrap.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <utility>

#include "meshcast/error.h"

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

constexpr std::uint32_t kMagic = 0x3162636d;                 // "mcb1"
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 30;  // per rank and round

[[noreturn]] void fail(const std::string& cause) { throw CommError("bootstrap", cause); }

std::string errno_text(int err) { return std::strerror(err); }

std::string seconds_text(double s) {
  std::ostringstream o;
  o << s << " s";
  return o.str();
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

// Waits until `fd` is ready for `events` (or has an error the next call reports); false when
// the deadline passed first.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, INT_MAX)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) fail("poll: " + errno_text(errno));
  }
}

// One connection and whom it leads to, for messages; every transfer has a deadline.
struct Link {
  Socket sock;
  std::string peer;  // "rank 3"

  void send_all(const void* data, std::size_t n, Clock::time_point deadline,
                const std::string& timeout) const {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      if (!wait_ready(sock.get(), POLLOUT, deadline))
        fail("could not send to " + peer + " within " + timeout);
      const ssize_t k = ::send(sock.get(), p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        fail("sending to " + peer + ": " + errno_text(errno));
      }
      p += k;
      n -= static_cast<std::size_t>(k);
    }
  }

  void recv_all(void* data, std::size_t n, Clock::time_point deadline,
                const std::string& timeout) const {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      if (!wait_ready(sock.get(), POLLIN, deadline))
        fail("no message from " + peer + " within " + timeout);
      const ssize_t k = ::recv(sock.get(), p, n, MSG_DONTWAIT);
      if (k == 0) fail(peer + " closed the connection (it ended or failed)");
      if (k < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        fail("receiving from " + peer + ": " + errno_text(errno));
      }
      p += k;
      n -= static_cast<std::size_t>(k);
    }
  }

  void send_u32(std::uint32_t v, Clock::time_point d, const std::string& t) const {
    unsigned char b[4];
    for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    send_all(b, 4, d, t);
  }
  void send_u64(std::uint64_t v, Clock::time_point d, const std::string& t) const {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    send_all(b, 8, d, t);
  }
  std::uint32_t recv_u32(Clock::time_point d, const std::string& t) const {
    unsigned char b[4];
    recv_all(b, 4, d, t);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t{b[i]} << (8 * i);
    return v;
  }
  std::uint64_t recv_u64(Clock::time_point d, const std::string& t) const {
    unsigned char b[8];
    recv_all(b, 8, d, t);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{b[i]} << (8 * i);
    return v;
  }
  void expect_magic(Clock::time_point d, const std::string& t) const {
    if (recv_u32(d, t) != kMagic)
      fail(peer +
           " sent something that is not a meshcast bootstrap message (out of step, or "
           "not a meshcast process)");
  }
};

void set_nodelay(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    fail("setsockopt(TCP_NODELAY): " + errno_text(errno));
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

}  // namespace

struct TcpBootstrap::Impl {
  std::string where;    // "host:port", for messages
  std::string timeout;  // "60 s", for messages
  double seconds = 60;
  int rank = 0, size = 1;
  std::vector<Link> links;  // rank 0: index r leads to rank r (index 0 unused); others: {rank 0}

  Clock::time_point deadline() const {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
  void listen_and_accept(const AddrList& addrs);
  void connect_to_root(const AddrList& addrs);
};

void TcpBootstrap::Impl::listen_and_accept(const AddrList& addrs) {
  Socket lsock;
  int err = 0;
  for (const addrinfo* a = addrs.get(); a && !lsock.valid(); a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      err = errno;
      continue;
    }
    const int one = 1;
    if (::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
      fail("setsockopt(SO_REUSEADDR): " + errno_text(errno));
    if (::bind(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      continue;
    }
    if (::listen(s.get(), size) != 0) fail("listen on " + where + ": " + errno_text(errno));
    lsock = std::move(s);
  }
  if (!lsock.valid())
    fail("rank 0 cannot listen on " + where + ": " + errno_text(err) +
         (err == EADDRINUSE ? " (another job on this port?)" : ""));

  const auto until = deadline();
  int joined = 0;
  while (joined < size - 1) {
    if (!wait_ready(lsock.get(), POLLIN, until)) {
      std::string missing;
      for (int r = 1; r < size; ++r)
        if (!links[static_cast<std::size_t>(r)].sock.valid())
          missing += (missing.empty() ? "" : ",") + std::to_string(r);
      fail("only " + std::to_string(joined) + " of " + std::to_string(size - 1) +
           " ranks connected to " + where + " within " + timeout + " (missing: rank " + missing +
           ")");
    }
    const int fd = ::accept4(lsock.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      if (e == EINTR || e == EAGAIN || e == EWOULDBLOCK || e == ECONNABORTED || e == EPROTO)
        continue;
      fail("accept on " + where + ": " + errno_text(e));
    }
    Link in{Socket(fd), "a connecting process"};
    std::uint32_t hello[3];
    try {
      for (auto& h : hello) h = in.recv_u32(until, timeout);
    } catch (const CommError&) {
      continue;  // a stray connection that closed: not one of ours (a timeout shows next round)
    }
    if (hello[0] != kMagic) continue;  // not a meshcast process: ignore it
    const auto r = static_cast<int>(hello[1]), n = static_cast<int>(hello[2]);
    if (n != size)
      fail("a process connected as rank " + std::to_string(r) + " of " + std::to_string(n) +
           " ranks, but rank 0 was started with " + std::to_string(size) +
           " (MESHCAST_SIZE differs?)");
    if (r <= 0 || r >= size) fail("a process connected with rank " + std::to_string(r));
    Link& slot = links[static_cast<std::size_t>(r)];
    if (slot.sock.valid()) fail("two processes connected as rank " + std::to_string(r));
    set_nodelay(in.sock.get());
    slot.sock = std::move(in.sock);
    ++joined;
  }
}  // the listening socket closes here: the port is free again

void TcpBootstrap::Impl::connect_to_root(const AddrList& addrs) {
  const auto until = deadline();
  auto pause = std::chrono::milliseconds(10);
  int err = ECONNREFUSED;
  Link& root = links[0];
  while (!root.sock.valid()) {
    for (const addrinfo* a = addrs.get(); a && !root.sock.valid(); a = a->ai_next) {
      Socket s(
          ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
      if (!s.valid()) fail("socket: " + errno_text(errno));
      int rc = ::connect(s.get(), a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        // One attempt waits at most a second, so that a lost SYN is retried.
        const auto give_up = std::min(until, Clock::now() + std::chrono::seconds(1));
        if (!wait_ready(s.get(), POLLOUT, give_up)) {
          err = ETIMEDOUT;
          continue;
        }
        socklen_t len = sizeof rc;
        if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &rc, &len) != 0)
          fail("getsockopt(SO_ERROR): " + errno_text(errno));
        if (rc != 0) {
          err = rc;
          continue;
        }
      } else if (rc != 0) {
        err = errno;
        continue;
      }
      if (self_connected(s.get())) {
        err = ECONNREFUSED;
        continue;
      }
      root.sock = std::move(s);
    }
    if (root.sock.valid()) break;
    const auto now = Clock::now();
    if (now >= until)
      fail("rank " + std::to_string(rank) + " could not connect to rank 0 at " + where +
           " within " + timeout + ": " + errno_text(err));
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, until - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  set_nodelay(root.sock.get());
  const auto d = deadline();
  root.send_u32(kMagic, d, timeout);
  root.send_u32(static_cast<std::uint32_t>(rank), d, timeout);
  root.send_u32(static_cast<std::uint32_t>(size), d, timeout);
}

TcpBootstrap::TcpBootstrap(std::string host, int port, int rank, int size, double timeout_seconds)
    : impl_(std::make_unique<Impl>()) {
  if (!plausible_host(host))
    throw ValidationError("host", "'" + host + "' is not a host name or IP address");
  if (port < 1 || port > 65535)
    throw ValidationError("port", std::to_string(port) + " is not a TCP port (1-65535)");
  if (size < 1) throw ValidationError("size", std::to_string(size) + " ranks: need at least 1");
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
  if (size == 1) return;  // nobody to meet
  const AddrList addrs = resolve(host, port);
  if (rank == 0) {
    m.links.resize(static_cast<std::size_t>(size));
    for (int r = 1; r < size; ++r)
      m.links[static_cast<std::size_t>(r)].peer = "rank " + std::to_string(r);
    m.listen_and_accept(addrs);
  } else {
    m.links.resize(1);
    m.links[0].peer = "rank 0 (" + m.where + ")";
    m.connect_to_root(addrs);
  }
}

TcpBootstrap::~TcpBootstrap() = default;

int TcpBootstrap::rank() const { return impl_->rank; }
int TcpBootstrap::size() const { return impl_->size; }

std::vector<std::vector<unsigned char>> TcpBootstrap::allgather(
    const std::vector<unsigned char>& mine) {
  Impl& m = *impl_;
  if (mine.size() > kMaxBytes) throw ValidationError("bootstrap", "allgather of more than 1 GiB");
  std::vector<std::vector<unsigned char>> all(static_cast<std::size_t>(m.size));
  if (m.size == 1) {
    all[0] = mine;
    return all;
  }
  const auto d = m.deadline();
  const std::string& t = m.timeout;
  if (m.rank != 0) {
    const Link& root = m.links[0];
    root.send_u32(kMagic, d, t);
    root.send_u64(mine.size(), d, t);
    root.send_all(mine.data(), mine.size(), d, t);
    root.expect_magic(d, t);
    if (root.recv_u32(d, t) != static_cast<std::uint32_t>(m.size))
      fail("rank 0 answered with a table of another size");
    for (auto& bytes : all) {
      const std::uint64_t n = root.recv_u64(d, t);
      if (n > kMaxBytes) fail("rank 0 announced " + std::to_string(n) + " bytes for one rank");
      bytes.resize(static_cast<std::size_t>(n));
      root.recv_all(bytes.data(), bytes.size(), d, t);
    }
    return all;
  }
  all[0] = mine;
  for (int r = 1; r < m.size; ++r) {
    const Link& in = m.links[static_cast<std::size_t>(r)];
    in.expect_magic(d, t);
    const std::uint64_t n = in.recv_u64(d, t);
    if (n > kMaxBytes) fail(in.peer + " announced " + std::to_string(n) + " bytes");
    auto& bytes = all[static_cast<std::size_t>(r)];
    bytes.resize(static_cast<std::size_t>(n));
    in.recv_all(bytes.data(), bytes.size(), d, t);
  }
  for (int r = 1; r < m.size; ++r) {
    const Link& out = m.links[static_cast<std::size_t>(r)];
    out.send_u32(kMagic, d, t);
    out.send_u32(static_cast<std::uint32_t>(m.size), d, t);
    for (const auto& bytes : all) {
      out.send_u64(bytes.size(), d, t);
      out.send_all(bytes.data(), bytes.size(), d, t);
    }
  }
  return all;
}

namespace {

int env_int(const char* name) {
  const char* text = std::getenv(name);
  if (!text)
    throw ValidationError(name, "not set (MESHCAST_RENDEZVOUS is: every process needs it)");
  const std::string s(text);
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size())
    throw ValidationError(name, "'" + s + "' is not an integer");
  return v;
}

}  // namespace

std::unique_ptr<TcpBootstrap> TcpBootstrap::from_env() {
  const char* rendezvous = std::getenv("MESHCAST_RENDEZVOUS");
  if (!rendezvous) return nullptr;
  constexpr const char* kRendezvous = "MESHCAST_RENDEZVOUS";
  const std::string rv(rendezvous);
  const std::string form = "'" + rv + "' is not HOST:PORT (e.g. 127.0.0.1:29500 or [::1]:29500)";
  std::string host, port_text;
  if (!rv.empty() && rv[0] == '[') {
    const auto close = rv.find(']');
    if (close == std::string::npos || close + 1 >= rv.size() || rv[close + 1] != ':')
      throw ValidationError(kRendezvous, form);
    host = rv.substr(1, close - 1);
    port_text = rv.substr(close + 2);
  } else {
    const auto colon = rv.rfind(':');
    if (colon == std::string::npos) throw ValidationError(kRendezvous, form);
    host = rv.substr(0, colon);
    port_text = rv.substr(colon + 1);
  }
  int port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size())
    throw ValidationError(kRendezvous, form);
  const int size = env_int("MESHCAST_SIZE");
  const int rank = env_int("MESHCAST_RANK");
  if (size < 1) throw ValidationError("MESHCAST_SIZE", std::to_string(size) + ": need at least 1");
  if (rank < 0 || rank >= size)
    throw ValidationError("MESHCAST_RANK", std::to_string(rank) + " is not in [0, MESHCAST_SIZE=" +
                                               std::to_string(size) + ")");
  double timeout = 60;
  if (const char* t = std::getenv("MESHCAST_RENDEZVOUS_TIMEOUT")) {
    const std::string s(t);
    char* stop = nullptr;
    errno = 0;
    timeout = std::strtod(s.c_str(), &stop);
    if (s.empty() || errno != 0 || *stop != '\0' || !(timeout > 0) || !std::isfinite(timeout) ||
        timeout > 1e7)
      throw ValidationError("MESHCAST_RENDEZVOUS_TIMEOUT",
                            "'" + s + "' is not a positive number of seconds");
  }
  try {
    return std::make_unique<TcpBootstrap>(host, port, rank, size, timeout);
  } catch (const ValidationError& e) {  // a bad host or port: name the variable that gave it
    const std::string& f = e.field();
    if (f != "host" && f != "port") throw;
    throw ValidationError(kRendezvous, std::string(e.what()).substr(f.size() + 2));
  }
}

}  // namespace meshcast
