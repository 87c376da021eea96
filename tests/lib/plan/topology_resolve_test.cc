// Topology::resolve: a file path loads as load(); a bare name ("dgx-a100", "dgx-a100.json") is a
// preset of MESHCAST_TOPOLOGY_PATH (first), the installed data directory, or, for programs of the
// build tree (this test), the source tree's meshes/; anything else is one line naming the field
// and listing the presets. Topology::from_hosts: explicit placement checked like a file's.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "meshcast/error.h"
#include "meshcast/topology.h"
#include "support/temp_dir.h"

namespace meshcast {
namespace {

const std::string kMeshes = std::string(MESHCAST_SOURCE_DIR) + "/meshes";

// Sets (or unsets, with null) MESHCAST_TOPOLOGY_PATH for one scope.
class TopologyPath {
 public:
  explicit TopologyPath(const char* value) {
    if (const char* v = std::getenv("MESHCAST_TOPOLOGY_PATH")) saved_ = v;
    value ? ::setenv("MESHCAST_TOPOLOGY_PATH", value, 1) : ::unsetenv("MESHCAST_TOPOLOGY_PATH");
  }
  ~TopologyPath() {
    saved_ ? ::setenv("MESHCAST_TOPOLOGY_PATH", saved_->c_str(), 1)
           : ::unsetenv("MESHCAST_TOPOLOGY_PATH");
  }

 private:
  std::optional<std::string> saved_;
};

using testing::TempDir;

std::string one_host(const std::string& name) {
  return R"({"name": ")" + name +
         R"(", "links": {"intra": {"bandwidth_gbyte_s": 1, "latency_us": 1}}, "single_host": true})";
}

TEST(TopologyResolve, FilesAndPresets) {
  const TopologyPath unset(nullptr);
  const std::string file = kMeshes + "/dgx-a100.json";
  const std::string expected = Topology::load(file).to_json();
  EXPECT_EQ(Topology::resolve(file).to_json(), expected);
  EXPECT_EQ(Topology::resolve("dgx-a100").to_json(), expected);
  EXPECT_EQ(Topology::resolve("dgx-a100.json").to_json(), expected);
  EXPECT_EQ(Topology::resolve("aws-p3.8xlarge").name(), "aws-p3.8xlarge");
  // The build tree's programs see the source tree's presets.
  const auto dirs = Topology::preset_dirs();
  EXPECT_NE(std::find(dirs.begin(), dirs.end(), kMeshes), dirs.end());
  const auto names = Topology::presets();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const char* n : {"aws-p3.8xlarge", "dgx-a100", "single-host", "cluster-1024x8"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

TEST(TopologyResolve, TopologyPathComesFirst) {
  TempDir a, b;
  a.write("dgx-a100.json", one_host("mine"));
  b.write("dgx-a100.json", one_host("second"));
  b.write("extra.json", one_host("extra"));
  b.write("notes.txt", "not a preset");
  const std::string path = ":" + a.path() + "::" + b.path() + ":/nonexistent";
  const TopologyPath set(path.c_str());
  EXPECT_EQ(Topology::resolve("dgx-a100").name(), "mine");
  EXPECT_EQ(Topology::resolve("extra").name(), "extra");
  EXPECT_EQ(Topology::preset_dirs().front(), a.path());
  const auto names = Topology::presets();
  EXPECT_EQ(std::count(names.begin(), names.end(), "dgx-a100"), 1);
  EXPECT_NE(std::find(names.begin(), names.end(), "extra"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "notes"), names.end());
  // A broken preset fails as its file does, naming it.
  a.write("broken.json", "{");
  try {
    (void)Topology::resolve("broken");
    ADD_FAILURE() << "accepted";
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("broken.json"), std::string::npos) << e.what();
  }
}

TEST(TopologyResolve, UnknownNamesAreOneLine) {
  const TopologyPath unset(nullptr);
  try {
    (void)Topology::resolve("dgx-a1000");
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.field(), "topology");
    EXPECT_EQ(w.rfind("topology: unknown topology 'dgx-a1000': not a file, and no preset of that "
                      "name (presets: aws-p3.8xlarge, cluster-1024x8, ",
                      0),
              0u)
        << w;
    EXPECT_EQ(w.find('\n'), std::string::npos);
  }
  // A path names no preset: load() says why it cannot be read.
  EXPECT_THROW((void)Topology::resolve("no/such/dgx-a100.json"), IoError);
  for (const std::string bad : {"", ".json", "..", "auto"}) {
    try {
      (void)Topology::resolve(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "topology") << e.what();
    }
  }
}

TEST(TopologyFromHosts, PlacesAndChecks) {
  const LinkClass intra{"x", 100e9, 2e-6}, net{"y", 25e9, 5e-6};
  const Topology t = Topology::from_hosts("t", {{"a", {3, 1}}, {"b", {0, 2}}}, intra, net, 2, "d");
  EXPECT_EQ(t.name(), "t");
  EXPECT_EQ(t.description(), "d");
  EXPECT_EQ(t.hosts(), 2);
  EXPECT_EQ(t.host_of(1), 0);
  EXPECT_EQ(t.host_of(0), 1);
  EXPECT_EQ(t.host_name(1), "b");
  EXPECT_EQ(t.nics_per_host(), 2);
  EXPECT_EQ(t.nic_of(3), 1);  // second id of host a
  EXPECT_EQ(t.intra().name, "intra");
  EXPECT_EQ(Topology::from_json(t.to_json()).to_json(), t.to_json());
  const auto field = [&](const std::vector<Topology::Host>& hosts, int nics = 1,
                         const std::string& name = "t") -> std::string {
    try {
      (void)Topology::from_hosts(name, hosts, intra, net, nics);
    } catch (const ValidationError& e) {
      return e.field();
    }
    return "accepted";
  };
  EXPECT_EQ(field({}), "topology.hosts");
  EXPECT_EQ(field({{"a", {0}}}, 1, ""), "topology.name");
  EXPECT_EQ(field({{"a", {0}}, {"a", {1}}}), "topology.hosts[1].name");
  EXPECT_EQ(field({{"", {0}}}), "topology.hosts[0].name");
  EXPECT_EQ(field({{"a", {}}}), "topology.hosts[0].devices");
  EXPECT_EQ(field({{"a", {0}}, {"b", {1, 0}}}), "topology.hosts[1].devices[1]");
  EXPECT_EQ(field({{"a", {-1}}}), "topology.hosts[0].devices[0]");
  EXPECT_EQ(field({{"a", {1 << 20}}}), "topology.hosts[0].devices[0]");
  EXPECT_EQ(field({{"a", {0}}}, 0), "topology.links.network.nics_per_host");
  EXPECT_THROW((void)Topology::from_hosts("t", {{"a", {0}}}, LinkClass{"i", 0, 0}, net),
               ValidationError);
}

}  // namespace
}  // namespace meshcast
