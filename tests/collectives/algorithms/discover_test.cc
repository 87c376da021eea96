// discover_topology on the in-process backend: devices grouped by the host names they give, hosts
// in the order of their first device, the identical topology (the same JSON) on every device,
// measured links (bandwidth > 0), a preset's links, one host and one device; refusals agreed on
// by every device (a bad host name, options that differ).
#include "meshcast/discover.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "meshcast/error.h"
#include "meshcast/local.h"

namespace meshcast {
namespace {

constexpr std::int64_t kProbeBytes = 64 << 10;  // small: the test is about placement

// Every device's result (its JSON), or its error as "field: cause".
struct Outcome {
  std::vector<std::string> json, error;
};

Outcome discover_on(int n, const std::function<DiscoverOptions(int)>& options) {
  LocalWorld world(n);
  Outcome out{std::vector<std::string>(static_cast<std::size_t>(n)),
              std::vector<std::string>(static_cast<std::size_t>(n))};
  world.run([&](Communicator& c) {
    const auto i = static_cast<std::size_t>(c.rank());
    try {
      out.json[i] = discover_topology(c, options(c.rank())).to_json();
    } catch (const Error& e) {
      out.error[i] = e.field() + ": " + e.cause();
    }
  });
  return out;
}

// The topology all devices agree on (failing the test when they differ or fail).
Topology agreed(const Outcome& o) {
  for (std::size_t i = 0; i < o.json.size(); ++i) {
    EXPECT_EQ(o.error[i], "") << "device " << i;
    EXPECT_EQ(o.json[i], o.json[0]) << "device " << i;
  }
  return Topology::from_json(o.json[0]);
}

DiscoverOptions on_host(const std::string& host) {
  DiscoverOptions o;
  o.host = host;
  o.probe_bytes = kProbeBytes;
  return o;
}

TEST(Discover, GroupsDevicesByHostName) {
  const Topology t = agreed(discover_on(4, [](int r) { return on_host(r < 2 ? "a" : "b"); }));
  EXPECT_EQ(t.name(), "discovered");
  ASSERT_EQ(t.hosts(), 2);
  EXPECT_EQ(t.host_name(0), "a");
  EXPECT_EQ(t.host_name(1), "b");
  EXPECT_EQ(t.host_of(0), 0);
  EXPECT_EQ(t.host_of(1), 0);
  EXPECT_EQ(t.host_of(2), 1);
  EXPECT_EQ(t.host_of(3), 1);
  EXPECT_EQ(t.device_count(), 4);
  EXPECT_GT(t.intra().bandwidth, 0);
  EXPECT_GT(t.intra().latency, 0);
  EXPECT_GT(t.network().bandwidth, 0);
  EXPECT_EQ(t.nics_per_host(), 1);
  EXPECT_NE(t.description().find("2 hosts"), std::string::npos) << t.description();
}

TEST(Discover, HostsInOrderOfTheirFirstDevice) {
  const Topology t = agreed(discover_on(5, [](int r) { return on_host(r % 2 ? "odd" : "even"); }));
  ASSERT_EQ(t.hosts(), 2);
  EXPECT_EQ(t.host_name(0), "even");
  for (int d = 0; d < 5; ++d) EXPECT_EQ(t.host_of(d), d % 2) << d;
  EXPECT_EQ(t.nic_of(4), 0);
}

TEST(Discover, OneHostAndOneDevice) {
  const Topology one = agreed(discover_on(3, [](int) { return on_host("x"); }));
  EXPECT_EQ(one.hosts(), 1);
  EXPECT_EQ(one.network().bandwidth, one.intra().bandwidth);  // one host: network = intra
  EXPECT_EQ(one.network().latency, one.intra().latency);
  const Topology alone = agreed(discover_on(1, [](int) { return on_host("x"); }));
  EXPECT_EQ(alone.hosts(), 1);
  EXPECT_EQ(alone.intra().bandwidth, Topology::single_host().intra().bandwidth);
  // One device per host: the intra class cannot be measured (defaults), the network can.
  const Topology apart =
      agreed(discover_on(2, [](int r) { return on_host(r == 0 ? "h0" : "h1"); }));
  EXPECT_EQ(apart.hosts(), 2);
  EXPECT_EQ(apart.intra().bandwidth, Topology::single_host().intra().bandwidth);
  EXPECT_GT(apart.network().bandwidth, 0);
}

TEST(Discover, LinksFromAPreset) {
  const Topology dgx = Topology::load(std::string(MESHCAST_SOURCE_DIR) + "/meshes/dgx-a100.json");
  for (const std::string& preset :
       {std::string("dgx-a100"), std::string(MESHCAST_SOURCE_DIR) + "/meshes/dgx-a100.json"}) {
    const Topology t = agreed(discover_on(4, [&](int r) {
      DiscoverOptions o = on_host(r < 2 ? "a" : "b");
      o.preset = preset;
      return o;
    }));
    EXPECT_EQ(t.hosts(), 2);
    EXPECT_EQ(t.intra().bandwidth, dgx.intra().bandwidth);
    EXPECT_EQ(t.intra().latency, dgx.intra().latency);
    EXPECT_EQ(t.network().bandwidth, dgx.network().bandwidth);
    EXPECT_EQ(t.nics_per_host(), 8);
    EXPECT_NE(t.description().find("dgx-a100"), std::string::npos);
  }
  const Topology plain = agreed(discover_on(2, [](int) {
    DiscoverOptions o = on_host("x");
    o.probe = false;
    return o;
  }));
  EXPECT_EQ(plain.intra().bandwidth, Topology::single_host().intra().bandwidth);
}

// Any probe size in the documented range, those below the latency probe's 64 bytes included (they
// once shared a buffer of probe_bytes with it, and wrote past its end): links measured on both
// hosts' pairs.
TEST(Discover, ProbesOfEverySizeInItsRange) {
  for (const std::int64_t bytes : {1, 63, 64, 65}) {
    SCOPED_TRACE(bytes);
    const Topology t = agreed(discover_on(4, [bytes](int r) {
      DiscoverOptions d = on_host(r < 2 ? "a" : "b");
      d.probe_bytes = bytes;
      return d;
    }));
    EXPECT_GT(t.intra().bandwidth, 0);
    EXPECT_GT(t.network().bandwidth, 0);
  }
}

TEST(Discover, RefusalsAreAgreed) {
  // One device with a bad name: every device throws the same error.
  Outcome o = discover_on(3, [](int r) { return on_host(r == 1 ? std::string(300, 'h') : "a"); });
  for (const auto& e : o.error) EXPECT_EQ(e.rfind("host: 300 characters", 0), 0u) << e;
  o = discover_on(3, [](int r) { return on_host(r == 2 ? "tab\there" : "a"); });
  for (const auto& e : o.error) EXPECT_EQ(e.rfind("host: not printable", 0), 0u) << e;
  o = discover_on(2, [](int r) {
    DiscoverOptions d = on_host("a");
    if (r == 1) d.preset = "no-such-preset";
    return d;
  });
  for (const auto& e : o.error) EXPECT_EQ(e.rfind("topology: unknown topology", 0), 0u) << e;
  o = discover_on(2, [](int) {
    DiscoverOptions d = on_host("a");
    d.probe_bytes = 0;
    return d;
  });
  for (const auto& e : o.error) EXPECT_EQ(e.rfind("probe_bytes: ", 0), 0u) << e;
  // Options that differ: found in the exchanged table, so every device refuses alike.
  o = discover_on(4, [](int r) {
    DiscoverOptions d = on_host("a");
    if (r >= 2) d.probe_bytes = kProbeBytes * 2;
    return d;
  });
  for (const auto& e : o.error)
    EXPECT_EQ(e,
              "discover: devices 2,3 got other options than device 0 (probe, probe_bytes, "
              "preset): give every device the same");
}

TEST(Discover, HostNameSources) {
  const char* saved = std::getenv("MESHCAST_HOSTNAME");
  const std::optional<std::string> keep = saved ? std::optional<std::string>(saved) : std::nullopt;
  ::setenv("MESHCAST_HOSTNAME", "from-env", 1);
  EXPECT_EQ(discover_host_name(), "from-env");
  EXPECT_EQ(discover_host_name("given"), "given");
  ::setenv("MESHCAST_HOSTNAME", std::string(256, 'x').c_str(), 1);
  try {
    (void)discover_host_name();
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "MESHCAST_HOSTNAME");
  }
  ::unsetenv("MESHCAST_HOSTNAME");
  EXPECT_FALSE(discover_host_name().empty());  // gethostname()
  if (keep) ::setenv("MESHCAST_HOSTNAME", keep->c_str(), 1);
}

}  // namespace
}  // namespace meshcast
