// Where devices live: hosts, and the link classes between them (fast intra-host links, one
// shared network link per host). Loaded from meshes/*.json; see docs/topology.md for the schema.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshcast {

// Per-message overheads that a topology file's link takes when it gives no `overhead_us`
// (docs/topology.md): what posting one message costs an MPI-like transport's sender.
inline constexpr double kDefaultIntraOverhead = 1e-6;
inline constexpr double kDefaultNetworkOverhead = 2e-6;

// A LogGP-like link class: a message of b bytes over it costs its sender `overhead` (the sender
// is busy: n messages from one device take n x overhead), then travels `latency` and streams at
// `bandwidth`.
struct LinkClass {
  // The bounds a topology's links are checked against (beyond them predictions lose their
  // meaning: infinite times, a simulator floor faster than a link).
  static constexpr double kMaxBandwidth = 1e15;  // bytes/s
  static constexpr double kMaxSeconds = 10;      // a latency or an overhead

  LinkClass() = default;
  LinkClass(std::string name_, double bandwidth_, double latency_,
            std::optional<double> chain_latency_ = {}, double overhead_ = 0)
      : name(std::move(name_)),
        bandwidth(bandwidth_),
        latency(latency_),
        chain_latency(chain_latency_),
        overhead(overhead_) {}

  std::string name;
  double bandwidth = 0;  // bytes per second
  double latency = 0;    // seconds, of one message
  // Seconds one hop of a pipelined chain adds, when it differs from `latency`: a chain moves
  // small chunks, which a transport may send without the handshake a large message waits for.
  std::optional<double> chain_latency;
  // Seconds of the sender's time per message it posts (a chain's hop posts one per chunk). Built
  // in C++ a class has none unless given; from a file it defaults as above.
  double overhead = 0;
  double hop_latency(bool chained) const {
    return chained && chain_latency ? *chain_latency : latency;
  }
};

class Topology {
 public:
  // Every device on one host (the default when no file is given).
  static Topology single_host();
  // `hosts` hosts of `devices_per_host` devices each: device d lives on host d / devices_per_host.
  // Names (here and in from_hosts) are non-empty, without ASCII control characters.
  static Topology uniform(std::string name, int hosts, int devices_per_host, LinkClass intra,
                          LinkClass network);
  // Reads a regular file of at most limits().input_file_bytes (meshcast/limits.h): IoError
  // ("topology") when missing or unreadable; ValidationError("topology") for a directory, FIFO
  // or device, or a larger file (refused before reading); then as from_json().
  static Topology load(const std::string& path);
  // Strict JSON (a key repeated in one object is a ParseError); throws ParseError /
  // ValidationError naming the JSON path ("topology.hosts[2].devices[1]").
  static Topology from_json(std::string_view text, const std::string& field = "topology");

  // A file path or a preset name. An existing file loads as load(); otherwise a bare name
  // ("dgx-a100" or "dgx-a100.json", no '/') is the file <name>.json of the first directory of
  // preset_dirs() that has it. Neither: ValidationError("topology", "unknown topology 'x': not
  // a file, and no preset of that name (presets: aws-p3.8xlarge, ...)"); a path with a '/' that
  // does not exist fails as load() does.
  //   Topology::resolve("dgx-a100")               // <prefix>/share/meshcast/meshes/dgx-a100.json
  //   Topology::resolve("meshes/dgx-a100.json")   // the file
  static Topology resolve(const std::string& text);
  // Where resolve() looks for presets, in order, the directories that exist: each directory of
  // MESHCAST_TOPOLOGY_PATH (colon-separated); for code in a shared library, the meshes/ beside
  // it (the Python package's presets); the installed data directory
  // (<prefix>/share/meshcast/meshes, found from where this code runs, so that an installed tree
  // can move); and, for a program running from the build tree, the source tree's meshes/.
  static std::vector<std::string> preset_dirs();
  // The preset names found there ("aws-p3.8xlarge", ...), sorted, each once.
  static std::vector<std::string> presets();

  // A host of from_hosts(): its name and its device ids.
  struct Host {
    std::string name;
    std::vector<int> devices;
  };
  // Explicit placement, as a file's "hosts": names non-empty and distinct, every id in
  // [0, 2^20) placed once, at least one host and one device per host; `network` is one host's
  // link with its bandwidth the total over `nics_per_host` NICs (as network() returns it).
  // Throws ValidationError naming the field ("topology.hosts[1].devices[0]", ...).
  static Topology from_hosts(std::string name, const std::vector<Host>& hosts, LinkClass intra,
                             LinkClass network, int nics_per_host = 1,
                             std::string description = {});
  std::string to_json() const;

  const std::string& name() const { return name_; }
  const std::string& description() const { return description_; }
  const LinkClass& intra() const { return intra_; }
  // The host's network link: bandwidth is the total over its nics_per_host() NICs.
  const LinkClass& network() const { return network_; }
  int nics_per_host() const { return nics_per_host_; }
  // One NIC's bandwidth: what a single transfer between hosts can reach (it leaves through one).
  double nic_bandwidth() const { return network_.bandwidth / nics_per_host_; }
  // The NIC (0 .. nics_per_host() - 1) that `device` sends and receives through: its rank among
  // its host's device ids, modulo the NICs (on a DGX, GPU i uses NIC i). Throws as host_of().
  int nic_of(int device) const;
  // Number of hosts; 1 for single_host().
  int hosts() const;
  // A host's name as the file gives it ("host" + index for uniform(), "" for single_host()).
  std::string host_name(int host) const;
  // Host of a device; throws ValidationError("topology") when the file does not place it.
  int host_of(int device) const;
  bool covers(int device) const;
  // Devices (ids) placed by the file; empty for single_host() (which places every id).
  std::int64_t device_count() const { return placed_; }

 private:
  std::string name_ = "single-host";
  std::string description_;
  LinkClass intra_{"intra", 12e9, 2e-6, {}, kDefaultIntraOverhead};
  LinkClass network_{"network", 12e9, 2e-6, {}, kDefaultIntraOverhead};
  bool all_on_one_ = true;
  int nics_per_host_ = 1;          // network_.bandwidth is the host's total over its NICs
  std::vector<int> host_of_;       // device id -> host, -1 where unplaced
  std::vector<int> rank_on_host_;  // device id -> rank of its id among its host's, -1 unplaced
  void rank_devices();             // fills rank_on_host_ from host_of_
  // Places the hosts' devices (checks as from_hosts() says, naming "PATH[h]..."); ranks them.
  void place(const std::vector<Host>& hosts, const std::string& path);
  std::int64_t placed_ = 0;  // entries of host_of_ that are not -1
  std::vector<std::string> host_names_;
};

}  // namespace meshcast
