// Topology::load reads only regular files of bounded size: a FIFO, /dev/zero, a directory or a
// huge file is refused at once, without reading it and without memory (peak resident size of a
// child process, from wait4's rusage); from_json refuses a key given twice in one object.
#include "meshcast/topology.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>

#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "support/temp_dir.h"
#include "support/testing.h"

namespace meshcast {
namespace {

using testing::TempDir;

// What a call ended with, run in a child process: the exception it threw, and how far it raised
// the peak resident size above the parent's current one. A call that does not end within 60 s
// (a read that blocks, a read of an endless file) is killed and reported as "hung".
struct Outcome {
  std::string result;  // "accepted", "ValidationError", "IoError", "ParseError", "other", "hung"
  std::int64_t growth = -1;
};

Outcome in_child(const std::function<void()>& f) {
  const std::int64_t before = testing::resident_bytes();
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    int code = 0;
    try {
      f();
    } catch (const ValidationError&) {
      code = 1;
    } catch (const IoError&) {
      code = 2;
    } catch (const ParseError&) {
      code = 3;
    } catch (...) {
      code = 4;
    }
    _exit(code);
  }
  int status = 0;
  rusage ru{};
  Outcome o;
  if (pid < 0 || wait4(pid, &status, 0, &ru) != pid) return {"fork failed", -1};
  o.growth = std::int64_t{ru.ru_maxrss} * 1024 - before;
  if (WIFSIGNALED(status)) {
    o.result = WTERMSIG(status) == SIGALRM ? "hung" : "signal " + std::to_string(WTERMSIG(status));
    return o;
  }
  const char* names[] = {"accepted", "ValidationError", "IoError", "ParseError", "other"};
  const int code = WEXITSTATUS(status);
  o.result = code >= 0 && code <= 4 ? names[code] : "exit " + std::to_string(code);
  return o;
}

constexpr std::int64_t kSmallGrowth = std::int64_t{32} << 20;

TEST(TopologyLoad, NonRegularFilesAreRefusedAtOnce) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string fifo = dir.path() + "/fifo.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);  // no writer: opening it would block forever
  for (const std::string& path : {fifo, std::string("/dev/zero"), dir.path()}) {
    SCOPED_TRACE(path);
    const Outcome o = in_child([&] { (void)Topology::load(path); });
    EXPECT_EQ(o.result, "ValidationError");
    EXPECT_NE(o.growth, -1);
    EXPECT_LT(o.growth, kSmallGrowth) << "peak memory grew by " << (o.growth >> 20) << " MiB";
    if (o.result != "ValidationError") continue;
    try {
      (void)Topology::load(path);  // here too, now that it is known to end
      ADD_FAILURE() << "accepted";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "topology");
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW((void)Topology::load(dir.path() + "/missing.json"), IoError);
}

TEST(TopologyLoad, LargeFilesAreRefusedBeforeReading) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // 1 GiB, sparse: it costs no disk, and reading it would cost 1 GiB of memory (2 in a string
  // stream).
  const std::string big = dir.path() + "/big.json";
  const int fd = open(big.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, std::int64_t{1} << 30), 0);
  close(fd);
  ASSERT_LE(limits().input_file_bytes, std::int64_t{1} << 29) << "set the bound below 1 GiB";
  const Outcome o = in_child([&] { (void)Topology::load(big); });
  EXPECT_EQ(o.result, "ValidationError");
  EXPECT_LT(o.growth, kSmallGrowth) << "peak memory grew by " << (o.growth >> 20) << " MiB";
  if (o.result == "ValidationError") {  // here too, now that it is known to end
    try {
      (void)Topology::load(big);
      ADD_FAILURE() << "accepted";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "topology size");
      EXPECT_NE(std::string(e.what()).find("exceeds the limit"), std::string::npos) << e.what();
    }
  }
  // The bound itself, given explicitly: a shipped topology is fine at its size, not below it.
  const std::string shipped = MESHCAST_SOURCE_DIR "/meshes/aws-p3.8xlarge.json";
  const std::string text = read_input_file(shipped, "topology", 1 << 20);
  EXPECT_NO_THROW((void)Topology::from_json(text));
  const auto size = static_cast<std::int64_t>(text.size());
  EXPECT_EQ(read_input_file(shipped, "topology", size), text);
  EXPECT_THROW((void)read_input_file(shipped, "topology", size - 1), ValidationError);
}

TEST(TopologyLoad, ShippedFilesStillLoad) {
  for (const char* f :
       {"single-host", "aws-p3.8xlarge", "dgx-a100", "emulated", "cluster-1024x8"}) {
    SCOPED_TRACE(f);
    const Topology t = Topology::load(std::string(MESHCAST_SOURCE_DIR "/meshes/") + f + ".json");
    EXPECT_EQ(t.name(), f);
  }
}

TEST(TopologyJson, DuplicateKeysAreRefused) {
  const std::string good = R"({"name": "t", "links": {"intra": {"bandwidth_gbyte_s": 1,
      "latency_us": 1}}, "single_host": true})";
  EXPECT_NO_THROW((void)Topology::from_json(good));
  for (const std::string& bad :
       {std::string(R"({"name": "t", "name": "u", "links": {"intra": {"bandwidth_gbyte_s": 1,
           "latency_us": 1}}, "single_host": true})"),
        std::string(R"({"name": "t", "links": {"intra": {"bandwidth_gbyte_s": 1,
           "bandwidth_gbyte_s": 100, "latency_us": 1}}, "single_host": true})"),
        std::string(R"({"name": "t", "links": {"intra": {"bandwidth_gbyte_s": 1, "latency_us": 1},
           "network": {"bandwidth_gbit_s": 1, "latency_us": 1}}, "hosts": [
           {"name": "a", "devices": [0], "devices": [1]}]})")}) {
    try {
      (void)Topology::from_json(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const ParseError& e) {
      EXPECT_EQ(e.field(), "topology");
      EXPECT_NE(std::string(e.what()).find("appears twice"), std::string::npos) << e.what();
    }
  }
  try {
    (void)Topology::from_json("{\"name\": \"" + std::string(100000, 'x') + "\x01\"}");
    ADD_FAILURE();
  } catch (const ParseError& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u) << "a long token quoted whole";
  }
  try {
    (void)Topology::from_json("{\"name\": ");
    ADD_FAILURE();
  } catch (const ParseError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("topology: not valid JSON: parse error", 0), 0u) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }  // nlohmann stops at a NUL byte: what follows it must not be ignored.
  for (const std::string& tail : {std::string(1, '\0'), std::string("\0garbage{{", 10)}) {
    try {
      (void)Topology::from_json(good + tail);
      ADD_FAILURE() << "accepted text after a NUL byte";
    } catch (const ParseError& e) {
      EXPECT_EQ(std::string(e.what()),
                "topology: not valid JSON: a NUL byte at byte " + std::to_string(good.size()));
    }
  }
}

// Names print on one line in reports: a control character in one is refused, naming its key.
TEST(TopologyJson, NamesHoldNoControlCharacters) {
  const auto topology = [](const std::string& name, const std::string& host) {
    return R"({"name": ")" + name +
           R"(", "links": {"intra": {"bandwidth_gbyte_s": 1, "latency_us": 1}, "network":
           {"bandwidth_gbit_s": 1, "latency_us": 1}}, "hosts": [{"name": ")" +
           host + R"(", "devices": [0]}]})";
  };
  EXPECT_EQ(Topology::from_json(topology("t \u00e9", "h 1")).name(), "t \xc3\xa9");
  for (const auto& [text, field] :
       {std::pair{topology("a\\nb", "h"), std::string("topology.name")},
        std::pair{topology("t", "evil\\u0001host"), std::string("topology.hosts[0].name")},
        std::pair{topology("t", "del\\u007f"), std::string("topology.hosts[0].name")}}) {
    try {
      (void)Topology::from_json(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), field);
      EXPECT_NE(std::string(e.what()).find("control character"), std::string::npos) << e.what();
    }
  }
}

// ... wherever a topology is made, so that what to_json() writes loads again.
TEST(TopologyJson, NamesAreCheckedByEveryMaker) {
  const LinkClass intra("intra", 1e9, 1e-6), network("network", 1e8, 1e-5);
  EXPECT_THROW((void)Topology::uniform("a\nb", 2, 2, intra, network), ValidationError);
  EXPECT_THROW((void)Topology::uniform("", 2, 2, intra, network), ValidationError);
  EXPECT_THROW((void)Topology::from_hosts("a\tb", {{"h", {0}}}, intra, network), ValidationError);
  try {
    (void)Topology::from_hosts("t", {{"h", {0}}, {"evil\rhost", {1}}}, intra, network);
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "topology.hosts[1].name");
  }
  const Topology t = Topology::from_hosts("t", {{"h 0", {0}}, {"h\xc3\xa9", {1}}}, intra, network);
  EXPECT_EQ(Topology::from_json(t.to_json()).host_name(1), "h\xc3\xa9");
}

// The largest topology the schema allows, 2^20 devices on as many named hosts, is within the
// values the reader builds (it was refused as "more than 4194304 JSON values").
TEST(TopologyJson, TheLargestNamedTopologyLoads) {
  if (testing::test_scale() < 1)  // the sanitizer presets: 75 s under ASan
    GTEST_SKIP() << "a size test, run at MESHCAST_TEST_SCALE >= 1 (Release)";
  const int hosts = 1 << 20;
  std::string text = R"({"name": "wide", "links": {"intra": {"bandwidth_gbyte_s": 1,
      "latency_us": 1}, "network": {"bandwidth_gbit_s": 1, "latency_us": 1}}, "hosts": [)";
  for (int h = 0; h < hosts; ++h)
    text += (h ? ",{\"name\":\"h" : "{\"name\":\"h") + std::to_string(h) + "\",\"devices\":[" +
            std::to_string(h) + "]}";
  text += "]}";
  const Topology t = Topology::from_json(text);
  EXPECT_EQ(t.host_of(hosts - 1), hosts - 1);
}

// The per-message overhead: optional, defaulting by class; kept bit for bit through to_json();
// a negative one refused naming its field.
TEST(TopologyJson, OverheadDefaultsByClassAndRoundTrips) {
  const auto doc = [](const std::string& intra, const std::string& net) {
    return R"({"name": "o", "links": {"intra": {"bandwidth_gbyte_s": 10, "latency_us": 1)" + intra +
           R"(}, "network": {"bandwidth_gbit_s": 100, "latency_us": 5)" + net +
           R"(}}, "uniform": {"hosts": 2, "devices_per_host": 2}})";
  };
  const Topology plain = Topology::from_json(doc("", ""));
  EXPECT_EQ(plain.intra().overhead, kDefaultIntraOverhead);
  EXPECT_EQ(plain.network().overhead, kDefaultNetworkOverhead);
  EXPECT_EQ(plain.to_json().find("overhead_us"), std::string::npos);
  testing::Rng rng(0x0e4d);
  for (int i = 0; i < 50; ++i) {
    const double oi = static_cast<double>(rng.below(100000)) / 1000,
                 on = static_cast<double>(rng.below(100000)) / 7;
    const Topology t = Topology::from_json(doc(", \"overhead_us\": " + std::to_string(oi),
                                               ", \"overhead_us\": " + std::to_string(on)));
    EXPECT_NEAR(t.intra().overhead, std::stod(std::to_string(oi)) * 1e-6, 1e-15);
    const Topology again = Topology::from_json(t.to_json());
    EXPECT_EQ(again.intra().overhead, t.intra().overhead);
    EXPECT_EQ(again.network().overhead, t.network().overhead);
  }
  // Built in C++ a class has no overhead unless given; to_json() says so.
  const Topology u = Topology::uniform("u", 2, 2, LinkClass{"intra", 1e9, 1e-6},
                                       LinkClass{"network", 1e8, 1e-5, {}, 3e-6});
  const Topology back = Topology::from_json(u.to_json());
  EXPECT_EQ(back.intra().overhead, 0);
  EXPECT_EQ(back.network().overhead, 3e-6);
  try {
    (void)Topology::from_json(doc("", ", \"overhead_us\": -2"));
    ADD_FAILURE() << "a negative overhead was accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "topology.links.network.overhead_us");
  }
  EXPECT_EQ(Topology::single_host().intra().overhead, kDefaultIntraOverhead);
}

// Every refusal of a link names a field the file has: a host's total (its NICs times the
// per-NIC rate) past the bound names the bandwidth key and the NIC count, not the total.
TEST(TopologyJson, ALinksErrorNamesTheFileKey) {
  const auto refused = [](const std::string& net) {
    try {
      (void)Topology::from_json(R"({"name": "n", "links": {"intra": {"bandwidth_gbyte_s": 10, )"
                                R"("latency_us": 1}, "network": {"latency_us": 1, )" +
                                net + R"(}}, "uniform": {"hosts": 2, "devices_per_host": 1}})");
    } catch (const ValidationError& e) {
      return e.field() + ": " + e.cause();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused(R"("bandwidth_gbyte_s": 1e6, "nics_per_host": 1024)"),
            "topology.links.network.bandwidth_gbyte_s: times nics_per_host (1024) is too large "
            "(above 1e15 bytes/s per host)");
  EXPECT_EQ(refused(R"("bandwidth_gbit_s": 1e6, "nics_per_host": 1024)"),
            "topology.links.network.bandwidth_gbit_s: times nics_per_host (1024) is too large "
            "(above 1e15 bytes/s per host)");
  EXPECT_EQ(refused(R"("bandwidth_gbyte_s": 1e3, "nics_per_host": 1000)"), "accepted");
  EXPECT_NE(refused(R"("bandwidth_gbyte_s": 1e3, "nics_per_host": 1001)"), "accepted");
  EXPECT_EQ(refused(R"("bandwidth_gbyte_s": 2e6)").substr(0, 40),
            "topology.links.network.bandwidth_gbyte_s");
}

}  // namespace
}  // namespace meshcast
