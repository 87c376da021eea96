// TcpBootstrap: ranks as threads of this process on 127.0.0.1. All-gather rounds of any size,
// sum and barrier; argument and environment validation naming the field; and failures (nobody
// listening, a missing rank, a rank that leaves, disagreeing sizes) that end in
// CommError("bootstrap") within the timeout instead of a hang.
#include "meshcast/bootstrap.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meshcast/error.h"

namespace meshcast {
namespace {

using Clock = std::chrono::steady_clock;

// A port on 127.0.0.1 that nobody listened on a moment ago.
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(s, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  EXPECT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(s);
  return ntohs(a.sin_port);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
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
    TcpBootstrap b("127.0.0.1", port, r, 3, 1);
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
    TcpBootstrap b("127.0.0.1", port, r, r == 0 ? 2 : 3, 5);
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
    TcpBootstrap b("127.0.0.1", port, r == 0 ? 0 : 1, 3, 2);
    b.barrier();
  });
  EXPECT_NE(errors[0].find("bootstrap: two processes connected as rank 1"), std::string::npos)
      << errors[0];
}

// Sets environment variables for one scope and restores them after.
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name :
         {"MESHCAST_RENDEZVOUS", "MESHCAST_RANK", "MESHCAST_SIZE", "MESHCAST_RENDEZVOUS_TIMEOUT"}) {
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

}  // namespace
}  // namespace meshcast
