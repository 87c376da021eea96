// TcpBootstrap: ranks as threads (and forked processes) of this process on 127.0.0.1. All-gather
// rounds of any size, sum and barrier; argument and environment validation naming the field,
// bounded in size and memory; failures (nobody listening, a missing rank, a rank that leaves or
// is killed, disagreeing sizes) that end in CommError("bootstrap") naming the rank, instead of a
// hang; and a rendezvous that strangers cannot jam or join: idle and garbage connections, another
// job's ranks on the same port, a second rank 0, lengths on the wire beyond their bounds.
#include "meshcast/bootstrap.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meshcast/error.h"
#include "support/free_port.h"

namespace meshcast {
namespace {

using Clock = std::chrono::steady_clock;
using testing::free_port;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  return a;
}

// A plain socket connected to 127.0.0.1:port, retried for up to 20 s (rank 0 may not listen
// yet); -1 if it never connected.
int connect_raw(int port) {
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < until) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const sockaddr_in a = loopback(port);
    if (::connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return s;
    ::close(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// A plain socket listening on 127.0.0.1:port.
int listen_raw(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  EXPECT_EQ(::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), 0);
  const sockaddr_in a = loopback(port);
  EXPECT_EQ(::bind(s, reinterpret_cast<const sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::listen(s, 8), 0);
  return s;
}

// Up to n bytes from fd: fewer when it closed or 20 s passed (n = SIZE_MAX: until it closes).
std::string read_raw(int fd, std::size_t n = SIZE_MAX) {
  std::string out;
  char buf[4096];
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (out.size() < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t k = ::recv(fd, buf, std::min(sizeof buf, n - out.size()), 0);
    if (k <= 0) break;
    out.append(buf, static_cast<std::size_t>(k));
  }
  return out;
}

void write_raw(int fd, const std::string& bytes) {
  EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// Little-endian integers, as on the wire (the format is described in collectives/bootstrap.cc).
std::string le(std::uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out += static_cast<char>(v >> (8 * i));
  return out;
}
const std::string kMagic = "mcb2";
enum Kind { kHello = 1, kWelcome = 2, kError = 3, kMine = 4, kTable = 5 };

// The largest resident set this process has had, in KiB.
long max_rss_kib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// Runs body(rank) on `size` threads; returns each rank's error message ("" if none).
std::vector<std::string> run_ranks(int size, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// The field of the ValidationError that f throws ("" if it throws none).
std::string validation_field(const std::function<void()>& f) {
  try {
    f();
  } catch (const ValidationError& e) {
    return e.field();
  }
  return "";
}

TEST(TcpBootstrap, AllgatherSumBarrier) {
  const int n = 4, port = free_port();
  const auto errors = run_ranks(n, [&](int r) {
    TcpBootstrap b("127.0.0.1", port, r, n, 20);
    EXPECT_EQ(b.rank(), r);
    EXPECT_EQ(b.size(), n);
    // Rounds of different sizes: empty, a few bytes, more than a socket buffer.
    for (std::size_t len : {std::size_t{0}, std::size_t{3}, std::size_t{3} << 20}) {
      std::vector<unsigned char> mine(len * static_cast<std::size_t>(r + 1) % (len + 7));
      for (std::size_t i = 0; i < mine.size(); ++i)
        mine[i] = static_cast<unsigned char>(i * 31 + r);
      const auto all = b.allgather(mine);
      ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
      for (int q = 0; q < n; ++q) {
        const auto& got = all[static_cast<std::size_t>(q)];
        ASSERT_EQ(got.size(), len * static_cast<std::size_t>(q + 1) % (len + 7));
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], static_cast<unsigned char>(i * 31 + q));
      }
    }
    EXPECT_EQ(b.sum(r == 2 ? -5'000'000'000LL : r), 0 + 1 + 3 - 5'000'000'000LL);
    b.barrier();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TcpBootstrap, PeersWaitForALateRankZero) {
  const int port = free_port();
  const auto errors = run_ranks(3, [&](int r) {
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    TcpBootstrap b("127.0.0.1", port, r, 3, 20);
    EXPECT_EQ(b.sum(1), 3);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TcpBootstrap, OneRankNeedsNoSocket) {
  TcpBootstrap b("127.0.0.1", 1, 0, 1);
  const auto all = b.allgather({1, 2, 3});
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], (std::vector<unsigned char>{1, 2, 3}));
  EXPECT_EQ(b.sum(42), 42);
}

TEST(TcpBootstrap, BadArgumentsNameTheField) {
  auto make = [](std::string host, int port, int rank, int size, double t) {
    return [=] { TcpBootstrap b(host, port, rank, size, t); };
  };
  EXPECT_EQ(validation_field(make("", 29500, 0, 2, 1)), "host");
  EXPECT_EQ(validation_field(make("bad host!", 29500, 0, 2, 1)), "host");
  EXPECT_EQ(validation_field(make("127.0.0.1", 0, 0, 2, 1)), "port");
  EXPECT_EQ(validation_field(make("127.0.0.1", 65536, 0, 2, 1)), "port");
  EXPECT_EQ(validation_field(make("127.0.0.1", 29500, 0, 0, 1)), "size");
  EXPECT_EQ(validation_field(make("127.0.0.1", 29500, -1, 2, 1)), "rank");
  EXPECT_EQ(validation_field(make("127.0.0.1", 29500, 2, 2, 1)), "rank");
  EXPECT_EQ(validation_field(make("127.0.0.1", 29500, 0, 2, 0)), "timeout");
  EXPECT_EQ(validation_field(make("127.0.0.1", 29500, 0, 2, std::nan(""))), "timeout");
}

TEST(TcpBootstrap, NobodyListeningTimesOut) {
  const auto t0 = Clock::now();
  try {
    TcpBootstrap b("127.0.0.1", free_port(), 1, 2, 0.5);
    FAIL() << "connected to nobody";
  } catch (const CommError& e) {
    EXPECT_EQ(e.field(), "bootstrap");
    EXPECT_NE(std::string(e.what()).find("could not connect to rank 0"), std::string::npos)
        << e.what();
  }
  const double took = seconds_since(t0);
  EXPECT_GE(took, 0.45);
  EXPECT_LT(took, 5);
}

TEST(TcpBootstrap, RankZeroNamesTheMissingRanks) {
  const int port = free_port();
  const auto errors = run_ranks(3, [&](int r) {
    if (r == 2) return;  // never shows up
    // 3 s: rank 1's thread, started late on a busy machine, still connects within rank 0's wait.
    TcpBootstrap b("127.0.0.1", port, r, 3, 3);
    b.barrier();
  });
  EXPECT_NE(errors[0].find("bootstrap: only 1 of 2 ranks connected"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("missing: rank 2"), std::string::npos) << errors[0];
  // Rank 1 connected, then lost rank 0.
  EXPECT_NE(errors[1].find("rank 0 (127.0.0.1:"), std::string::npos) << errors[1];
}

TEST(TcpBootstrap, ARankThatLeavesFailsTheRound) {
  const int port = free_port();
  const auto t0 = Clock::now();
  const auto errors = run_ranks(2, [&](int r) {
    TcpBootstrap b("127.0.0.1", port, r, 2, 30);
    b.barrier();
    if (r == 1) return;  // closes its connection
    b.barrier();
  });
  EXPECT_NE(errors[0].find("bootstrap: rank 1 closed the connection"), std::string::npos)
      << errors[0];
  EXPECT_EQ(errors[1], "");
  EXPECT_LT(seconds_since(t0), 10);  // at once, not after the timeout
}

TEST(TcpBootstrap, DisagreeingSizesAreRefused) {
  const int port = free_port();
  const auto errors = run_ranks(2, [&](int r) {
    TcpBootstrap b("127.0.0.1", port, r, r == 0 ? 2 : 3, 20);  // refused at once
    b.barrier();
  });
  EXPECT_NE(errors[0].find("bootstrap: a process connected as rank 1 of 3 ranks"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("bootstrap: "), std::string::npos) << errors[1];
}

TEST(TcpBootstrap, TwoProcessesWithOneRank) {
  const int port = free_port();
  const auto errors = run_ranks(3, [&](int r) {
    TcpBootstrap b("127.0.0.1", port, r == 0 ? 0 : 1, 3, 20);  // refused at once
    b.barrier();
  });
  EXPECT_NE(errors[0].find("bootstrap: two processes connected as rank 1"), std::string::npos)
      << errors[0];
  // Both rank 1s learn why: the one refused, and the one that had joined.
  for (int r : {1, 2})
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("two processes connected as rank 1"),
              std::string::npos)
        << errors[static_cast<std::size_t>(r)];
}

// Sets environment variables for one scope and restores them after.
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name :
         {"MESHCAST_RENDEZVOUS", "MESHCAST_RANK", "MESHCAST_SIZE", "MESHCAST_RENDEZVOUS_TIMEOUT",
          "MESHCAST_JOB_KEY", "SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID",
          "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID",
          // LaunchEnv's launchers (launch_env_test.cc): a test run under one must not see it
          "MESHCAST_LAUNCHER", "MESHCAST_LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK",
          "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
          "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "OMPI_COMM_WORLD_RANK",
          "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"}) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name);
    }
    for (auto [name, value] : vars) ::setenv(name, value, 1);
  }
  ~Env() {
    for (auto& [name, value] : saved_) value ? ::setenv(name, value->c_str(), 1) : ::unsetenv(name);
  }

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

std::string env_field(std::initializer_list<std::pair<const char*, const char*>> vars) {
  Env env(vars);
  return validation_field([] { (void)TcpBootstrap::from_env(); });
}

TEST(TcpBootstrap, FromEnvironment) {
  {
    Env env({});
    EXPECT_EQ(TcpBootstrap::from_env(), nullptr);
  }
  {
    Env env(
        {{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"}, {"MESHCAST_RANK", "0"}, {"MESHCAST_SIZE", "1"}});
    auto b = TcpBootstrap::from_env();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->rank(), 0);
    EXPECT_EQ(b->size(), 1);
  }
  {  // the timeout variable reaches the constructor: rank 1 gives up after it
    const std::string rv = "127.0.0.1:" + std::to_string(free_port());
    Env env({{"MESHCAST_RENDEZVOUS", rv.c_str()},
             {"MESHCAST_RANK", "1"},
             {"MESHCAST_SIZE", "2"},
             {"MESHCAST_RENDEZVOUS_TIMEOUT", "0.3"}});
    const auto t0 = Clock::now();
    EXPECT_THROW((void)TcpBootstrap::from_env(), CommError);
    EXPECT_LT(seconds_since(t0), 5);
  }
  EXPECT_EQ(
      env_field(
          {{"MESHCAST_RENDEZVOUS", "127.0.0.1"}, {"MESHCAST_RANK", "0"}, {"MESHCAST_SIZE", "2"}}),
      "MESHCAST_RENDEZVOUS");
  EXPECT_EQ(env_field({{"MESHCAST_RENDEZVOUS", "127.0.0.1:port"},
                       {"MESHCAST_RANK", "0"},
                       {"MESHCAST_SIZE", "2"}}),
            "MESHCAST_RENDEZVOUS");
  EXPECT_EQ(
      env_field(
          {{"MESHCAST_RENDEZVOUS", "127.0.0.1:0"}, {"MESHCAST_RANK", "0"}, {"MESHCAST_SIZE", "2"}}),
      "MESHCAST_RENDEZVOUS");
  EXPECT_EQ(
      env_field({{"MESHCAST_RENDEZVOUS", "[::1"}, {"MESHCAST_RANK", "0"}, {"MESHCAST_SIZE", "2"}}),
      "MESHCAST_RENDEZVOUS");
  EXPECT_EQ(
      env_field(
          {{"MESHCAST_RENDEZVOUS", ":29500"}, {"MESHCAST_RANK", "0"}, {"MESHCAST_SIZE", "2"}}),
      "MESHCAST_RENDEZVOUS");
  EXPECT_EQ(env_field({{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"}, {"MESHCAST_SIZE", "2"}}),
            "MESHCAST_RANK");
  EXPECT_EQ(
      env_field(
          {{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"}, {"MESHCAST_RANK", "5"}, {"MESHCAST_SIZE", "4"}}),
      "MESHCAST_RANK");
  EXPECT_EQ(env_field({{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"},
                       {"MESHCAST_RANK", "-1"},
                       {"MESHCAST_SIZE", "4"}}),
            "MESHCAST_RANK");
  EXPECT_EQ(env_field({{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"}, {"MESHCAST_RANK", "0"}}),
            "MESHCAST_SIZE");
  EXPECT_EQ(env_field({{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"},
                       {"MESHCAST_RANK", "0"},
                       {"MESHCAST_SIZE", "4x"}}),
            "MESHCAST_SIZE");
  EXPECT_EQ(
      env_field(
          {{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"}, {"MESHCAST_RANK", "0"}, {"MESHCAST_SIZE", "0"}}),
      "MESHCAST_SIZE");
  EXPECT_EQ(env_field({{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"},
                       {"MESHCAST_RANK", "0"},
                       {"MESHCAST_SIZE", "2"},
                       {"MESHCAST_RENDEZVOUS_TIMEOUT", "-3"}}),
            "MESHCAST_RENDEZVOUS_TIMEOUT");
}

TEST(TcpBootstrap, AnIdleConnectionDoesNotBlockTheRendezvous) {
  const int port = free_port();
  std::atomic<int> idle{-1};
  std::atomic<bool> ready{false};
  const auto errors = run_ranks(3, [&](int r) {
    if (r == 1) {  // an idle connection (nc 127.0.0.1 PORT) reaches rank 0 first
      idle = connect_raw(port);
      ready = true;
    }
    if (r == 2)
      while (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    TcpBootstrap b("127.0.0.1", port, r, 3, 20);
    EXPECT_EQ(b.sum(r), 3);
  });
  EXPECT_GE(idle.load(), 0);
  for (const auto& e : errors) EXPECT_EQ(e, "");
  ::close(idle);
}

TEST(TcpBootstrap, AGarbageConnectionIsRefusedAndTheOthersJoin) {
  const int port = free_port();
  std::string reply;
  std::atomic<bool> ready{false};
  const auto errors = run_ranks(3, [&](int r) {
    if (r == 1) {
      const int fd = connect_raw(port);
      write_raw(fd, "GET / HTTP/1.0\r\n\r\n");
      reply = read_raw(fd);  // until rank 0 closes it
      ::close(fd);
      ready = true;
    }
    if (r == 2)
      while (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    TcpBootstrap b("127.0.0.1", port, r, 3, 20);
    EXPECT_EQ(b.sum(r), 3);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_NE(reply.find("that was not a meshcast bootstrap hello"), std::string::npos) << reply;
}

TEST(TcpBootstrap, TwoJobsOnOnePortAreNeverMerged) {
  // Job A's rank 0 listens; then job B (another key) starts on the same port; A's other ranks
  // join once B is done. B's rank 0 cannot listen, B's others are refused and take no slot.
  const int port = free_port();
  std::atomic<bool> listening{false};
  std::atomic<int> b_done{0};
  const auto errors = run_ranks(6, [&](int i) {
    const int job = i / 3, r = i % 3;  // A0 A1 A2 B0 B1 B2
    struct Count {
      std::atomic<int>* n;
      ~Count() {
        if (n) ++*n;
      }
    } count{job == 1 ? &b_done : nullptr};
    if (i == 1) {
      ::close(connect_raw(port));  // returns once A0 listens
      listening = true;
    }
    if (i != 0)
      while (!listening) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (job == 0 && r != 0)
      while (b_done < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    TcpBootstrap b("127.0.0.1", port, r, 3, job == 0 ? 20 : 5, job == 0 ? "job A" : "job B");
    for (const auto& bytes : b.allgather({static_cast<unsigned char>(job)}))
      EXPECT_EQ(bytes, std::vector<unsigned char>{static_cast<unsigned char>(job)})
          << "job " << job << " rank " << r << " met a rank of the other job";
  });
  for (int i = 0; i < 3; ++i) EXPECT_EQ(errors[static_cast<std::size_t>(i)], "") << "A" << i;
  EXPECT_NE(errors[3].find("bootstrap: rank 0 cannot listen on 127.0.0.1:"), std::string::npos)
      << errors[3];
  EXPECT_NE(errors[3].find("Address already in use"), std::string::npos) << errors[3];
  for (int i = 4; i < 6; ++i)
    EXPECT_NE(errors[static_cast<std::size_t>(i)].find("belongs to another job"), std::string::npos)
        << errors[static_cast<std::size_t>(i)];
}

TEST(TcpBootstrap, ASecondRankZeroCannotListen) {
  const int port = free_port();
  std::string second;
  const auto errors = run_ranks(2, [&](int r) {
    if (r == 1) {
      ::close(connect_raw(port));  // returns once rank 0 listens
      try {
        TcpBootstrap b("127.0.0.1", port, 0, 2, 1);
        second = "it listened too";
      } catch (const CommError& e) {
        second = e.what();
      }
    }
    TcpBootstrap b("127.0.0.1", port, r, 2, 20);
    b.barrier();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_NE(second.find("bootstrap: rank 0 cannot listen on 127.0.0.1:"), std::string::npos)
      << second;
  EXPECT_NE(second.find("Address already in use"), std::string::npos) << second;
}

TEST(TcpBootstrap, ARankChecksWhomItReached) {
  // A listener that welcomes with another job's key, and one that answers like a web server.
  for (const std::string& answer : {kMagic + le(kWelcome, 4) + std::string(16, 'x'),
                                    std::string("HTTP/1.0 400 Bad Request\r\n\r\n")}) {
    const int port = free_port(), ls = listen_raw(port);
    std::string error;
    std::thread peer([&] {
      try {
        TcpBootstrap b("127.0.0.1", port, 1, 2, 20, "k");
        error = "it joined";
      } catch (const CommError& e) {
        error = e.what();
      }
    });
    const int fd = ::accept(ls, nullptr, nullptr);
    EXPECT_EQ(read_raw(fd, 32).size(), 32u);  // its hello
    write_raw(fd, answer);
    peer.join();
    ::close(fd);
    ::close(ls);
    EXPECT_NE(error.find(answer[0] == 'm' ? "belongs to another job" : "is not a meshcast rank 0"),
              std::string::npos)
        << error;
  }
}

TEST(TcpBootstrap, LengthsOnTheWireAreBoundedBeforeAllocating) {
  const long before = max_rss_kib();
  // A fake rank 0 welcomes rank 1 (echoing its job key), then announces 1 TiB for one rank.
  std::string hello, error;
  {
    const int port = free_port(), ls = listen_raw(port);
    std::thread peer([&] {
      try {
        TcpBootstrap b("127.0.0.1", port, 1, 2, 20, "k");
        (void)b.allgather({1, 2, 3});
      } catch (const CommError& e) {
        error = e.what();
      }
    });
    const int fd = ::accept(ls, nullptr, nullptr);
    hello = read_raw(fd, 32);
    write_raw(fd, kMagic + le(kWelcome, 4) + hello.substr(std::min<std::size_t>(16, hello.size())));
    EXPECT_EQ(read_raw(fd, 16 + 3).size(), 19u);  // its bytes
    write_raw(fd, kMagic + le(kTable, 4) + le(2, 4) + le(std::uint64_t{1} << 40, 8));
    peer.join();
    ::close(fd);
    ::close(ls);
    EXPECT_NE(error.find("announced 1099511627776 bytes for one rank"), std::string::npos) << error;
  }
  ASSERT_EQ(hello.size(), 32u);
  // A fake rank 1 (that hello again) announces 1 TiB to a real rank 0, then 512 MiB that never
  // come: refused, and waited for without reserving them.
  for (const std::uint64_t n : {std::uint64_t{1} << 40, std::uint64_t{512} << 20}) {
    const int port = free_port();
    std::thread root([&] {
      try {
        TcpBootstrap b("127.0.0.1", port, 0, 2, 1, "k");
        b.barrier();
        error = "no error";
      } catch (const CommError& e) {
        error = e.what();
      }
    });
    const int fd = connect_raw(port);
    write_raw(fd, hello);
    EXPECT_EQ(read_raw(fd, 24).substr(0, 8), kMagic + le(kWelcome, 4));
    write_raw(fd, kMagic + le(kMine, 4) + le(n, 8) + "abc");
    const std::string told = read_raw(fd);  // what rank 0 tells rank 1 before it closes
    root.join();
    ::close(fd);
    const std::string want = n > (1 << 30) ? "rank 1 announced 1099511627776 bytes"
                                           : "no message from rank 1 within 1 s";
    EXPECT_NE(error.find("bootstrap: " + want), std::string::npos) << error;
    EXPECT_NE(told.find(want), std::string::npos) << told;
  }
  EXPECT_LT(max_rss_kib() - before, 64 * 1024);
}

TEST(TcpBootstrap, AKilledRankIsNamedByEverySurvivor) {
  const int port = free_port();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 2: joins, then dies without a word
    try {
      TcpBootstrap b("127.0.0.1", port, 2, 3, 60);
      ::raise(SIGKILL);
    } catch (...) {
    }
    ::_exit(1);
  }
  // Rank 1 enters the round only after rank 0 has named rank 2 (or after 20 s): rank 0 must not
  // wait for rank 1 before it notices rank 2. The timeout (60 s) is not what ends the round.
  std::atomic<bool> root_failed{false};
  bool rank1_waited_in_vain = false;
  const auto t0 = Clock::now();
  const auto errors = run_ranks(2, [&](int r) {
    TcpBootstrap b("127.0.0.1", port, r, 3, 60);
    if (r == 1) {
      const auto until = Clock::now() + std::chrono::seconds(20);
      while (!root_failed && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      rank1_waited_in_vain = !root_failed;
      b.barrier();
      return;
    }
    try {
      b.barrier();
    } catch (const CommError&) {
      root_failed = true;
      throw;
    }
  });
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_FALSE(rank1_waited_in_vain) << "rank 0 did not notice rank 2's end by itself";
  EXPECT_NE(errors[0].find("bootstrap: rank 2 "), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find(" the connection (it ended or failed)"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("reports: rank 2 "), std::string::npos) << errors[1];
  EXPECT_LT(seconds_since(t0), 50);  // well before the 60 s timeout
}

TEST(TcpBootstrap, AKilledRankZeroIsNamedByEverySurvivor) {
  const int port = free_port();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 0: meets the others, then dies
    try {
      TcpBootstrap b("127.0.0.1", port, 0, 3, 60);
      ::raise(SIGKILL);
    } catch (...) {
    }
    ::_exit(1);
  }
  const auto errors = run_ranks(2, [&](int i) {
    TcpBootstrap b("127.0.0.1", port, i + 1, 3, 60);
    b.barrier();
  });
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  for (const auto& e : errors)
    EXPECT_NE(e.find("bootstrap: rank 0 (127.0.0.1:" + std::to_string(port) + ") "),
              std::string::npos)
        << e;
}

TEST(TcpBootstrap, AJobSizeAboveTheLimitIsRefusedCheaply) {
  const long before = max_rss_kib();
  const auto refused = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const ValidationError& e) {
      const std::string w = e.what();
      EXPECT_LT(w.size(), 300u) << w.substr(0, 300);
      EXPECT_EQ(w.find('\n'), std::string::npos);
      return e.field();
    }
    return "accepted";
  };
  const auto from_env = [] { (void)TcpBootstrap::from_env(); };
  const std::string huge(1 << 20, '7');
  {
    Env env({{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"},
             {"MESHCAST_RANK", "0"},
             {"MESHCAST_SIZE", "100000000"},
             {"MESHCAST_RENDEZVOUS_TIMEOUT", "0.2"}});
    EXPECT_EQ(refused(from_env), "MESHCAST_SIZE");
    try {
      from_env();
    } catch (const ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find("100000000 exceeds the limit of"), std::string::npos)
          << e.what();
    }
  }
  {
    Env env({{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"},
             {"MESHCAST_RANK", "99999999"},
             {"MESHCAST_SIZE", "4"}});
    EXPECT_EQ(refused(from_env), "MESHCAST_RANK");
  }
  EXPECT_EQ(refused([] { TcpBootstrap b("127.0.0.1", 1, 0, 100000000, 0.2); }), "size");
  // A variable of any length is quoted briefly.
  const std::string long_host = std::string(1 << 20, 'h') + ":1";
  const std::string long_port = "127.0.0.1:" + huge;
  for (const auto& [name, value] : std::vector<std::pair<const char*, const char*>>{
           {"MESHCAST_SIZE", huge.c_str()},
           {"MESHCAST_RANK", huge.c_str()},
           {"MESHCAST_RENDEZVOUS", long_host.c_str()},
           {"MESHCAST_RENDEZVOUS", long_port.c_str()},
           {"MESHCAST_RENDEZVOUS_TIMEOUT", huge.c_str()}}) {
    Env env({{"MESHCAST_RENDEZVOUS", "127.0.0.1:1"},
             {"MESHCAST_RANK", "0"},
             {"MESHCAST_SIZE", "2"},
             {name, value}});
    EXPECT_EQ(refused(from_env), name);
  }
  EXPECT_LT(max_rss_kib() - before, 64 * 1024);
}

TEST(TcpBootstrap, JobKeyFromEnvironment) {
  using Vars = std::initializer_list<std::pair<const char*, const char*>>;
  const auto key = [](Vars vars, const std::string& rv = "127.0.0.1:29500", int size = 4) {
    Env env(vars);
    return TcpBootstrap::job_key_from_env(rv, size);
  };
  EXPECT_EQ(key({{"MESHCAST_JOB_KEY", "abc"}, {"SLURM_JOB_ID", "7"}}), "MESHCAST_JOB_KEY=abc");
  EXPECT_NE(key({{"SLURM_JOB_ID", "7"}}), key({{"SLURM_JOB_ID", "8"}}));
  EXPECT_NE(key({{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "0"}}),
            key({{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "1"}}));
  EXPECT_NE(key({{"TORCHELASTIC_RUN_ID", "run-1"}}), key({}));
  EXPECT_EQ(key({{"TORCHELASTIC_RUN_ID", "none"}}), key({}));  // torchrun's default tells nothing
  const std::string cmd = key({});
  EXPECT_EQ(cmd.rfind("command:", 0), 0u) << cmd;
  EXPECT_NE(cmd.find(program_invocation_short_name), std::string::npos) << cmd;  // by its name
  EXPECT_EQ(cmd, key({}));
  EXPECT_NE(cmd, key({}, "127.0.0.1:29501"));
  EXPECT_NE(cmd, key({}, "127.0.0.1:29500", 5));
}

}  // namespace
}  // namespace meshcast
