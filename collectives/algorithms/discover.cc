// discover_topology: host names all-gathered over the world, devices grouped by them, and the
// link classes from a preset or from two short ping-pongs whose results are all-gathered too, so
// that every device builds its Topology from the same bytes and returns the identical one.
#include "meshcast/discover.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lib/support/agreed.h"
#include "lib/support/fnv.h"
#include "meshcast/collectives.h"
#include "meshcast/error.h"

namespace meshcast {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxHostName = 255;
constexpr std::int64_t kMaxProbeBytes = std::int64_t{1} << 30;
constexpr std::size_t kSmallBytes = 64;  // the latency probe's message
constexpr int kRoundTrips = 3;           // timed, after one warm-up; the fastest counts
constexpr std::size_t kFingerprintBytes = 8;

std::string checked_name(const std::string& name, const char* field) {
  if (name.empty()) throw ValidationError(field, "empty: a host name has 1 to 255 characters");
  if (name.size() > kMaxHostName)
    throw ValidationError(field,
                          std::to_string(name.size()) + " characters: a host name has at most 255");
  for (char c : name)
    if (c < 32 || c > 126)
      throw ValidationError(field, "not printable ASCII: a host name is one line of text");
  return name;
}

// One round trip of `bytes` with `peer`: the initiator sends first, then receives. A failed wait
// (a peer's, an interrupt) cancels the leg in flight (a receive still posted would write into
// `buf` after the unwinding freed it, when the peer comes late) and gives the communicator up.
double round_trip(Communicator& c, void* buf, std::size_t bytes, int peer, int tag,
                  bool initiator) {
  const Region r = Region::contiguous(buf, bytes);
  const auto t0 = Clock::now();
  for (int leg = 0; leg < 2; ++leg) {
    Request q = (leg == 0) == initiator ? c.isend(r, peer, tag) : c.irecv(r, peer, tag);
    try {
      c.wait_all_or_cancel({&q, 1});
    } catch (const std::exception& e) {
      c.abandon_for(e);
      throw;
    }
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Measured {
  double latency = 0, bandwidth = 0;  // seconds, bytes per second
};

// Ping-pongs with `peer` (both sides call it; only the initiator's numbers mean anything):
// latency is half the fastest small round trip; bandwidth the large message's bytes over half
// its fastest round trip less that latency.
Measured ping_pong(Communicator& c, void* buf, std::size_t bytes, int peer, int tag,
                   bool initiator) {
  double small = 1e300, large = 1e300;
  for (int i = 0; i <= kRoundTrips; ++i) {  // i == 0 warms up
    const double s = round_trip(c, buf, kSmallBytes, peer, tag, initiator);
    const double l = round_trip(c, buf, bytes, peer, tag, initiator);
    if (i > 0) {
      small = std::min(small, s);
      large = std::min(large, l);
    }
  }
  Measured m;
  m.latency = small / 2;
  const double stream = large / 2 - m.latency;
  // A large message no slower than a small one (noise): its whole one-way time, at least 1 ns.
  m.bandwidth = static_cast<double>(bytes) / std::max(stream > 0 ? stream : large / 2, 1e-9);
  // Within what a topology takes: noise must not make a discovered topology invalid.
  m.bandwidth = std::clamp(m.bandwidth, 1.0, LinkClass::kMaxBandwidth);
  m.latency = std::min(m.latency, LinkClass::kMaxSeconds);
  return m;
}

// The record each device contributes: a fingerprint of the options that must agree, then its
// host name.
std::vector<char> record_of(const std::string& host, const std::string& options) {
  const std::uint64_t f = detail::Fnv{}.add(options).h;
  std::vector<char> r(kFingerprintBytes);
  for (std::size_t i = 0; i < kFingerprintBytes; ++i) r[i] = static_cast<char>(f >> (8 * i));
  r.insert(r.end(), host.begin(), host.end());
  return r;
}

std::string device_list(const std::vector<int>& ds) {
  std::string s;
  for (std::size_t i = 0; i < ds.size() && i < 8; ++i) s += (i ? "," : "") + std::to_string(ds[i]);
  if (ds.size() > 8) s += " and " + std::to_string(ds.size() - 8) + " more";
  return s;
}

}  // namespace

std::string discover_host_name(const std::string& given) {
  if (!given.empty()) return checked_name(given, "host");
  if (const char* env = std::getenv("MESHCAST_HOSTNAME"); env && *env)
    return checked_name(env, "MESHCAST_HOSTNAME");
  char buf[kMaxHostName + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0)
    throw IoError("host", std::string("gethostname: ") + std::strerror(errno));
  return checked_name(buf, "host");
}

Topology discover_topology(Communicator& comm, const DiscoverOptions& o) {
  // The same on every device: all refuse alike, before any message.
  if (comm.caps().device_memory)
    throw ValidationError("comm", "discovery exchanges host memory; the " + comm.backend() +
                                      " transport works on device memory (use mpi, ucx or local)");
  const Group& world = comm.world();
  const int n = world.size();
  // This device's inputs; a failure is agreed on, so that every device throws the same error
  // instead of waiting on one that left.
  std::string host;
  std::optional<Topology> preset;
  try {
    if (o.probe_bytes < 1 || o.probe_bytes > kMaxProbeBytes)
      throw ValidationError("probe_bytes", "must be in [1, " + std::to_string(kMaxProbeBytes) +
                                               "] (got " + std::to_string(o.probe_bytes) + ")");
    host = discover_host_name(o.host);
    if (!o.preset.empty()) preset = Topology::resolve(o.preset);
  } catch (const Error& e) {
    comm.agree(world, &e);  // throws
    throw;
  }
  comm.agree(world, nullptr);

  // Every device's record (options fingerprint, host name), in device order.
  const std::string options = std::string(o.probe ? "probe " : "no-probe ") +
                              std::to_string(o.probe_bytes) + " " +
                              (preset ? preset->to_json() : std::string("-"));
  const std::vector<char> mine = record_of(host, options);
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(n));
  const std::int64_t my_length = static_cast<std::int64_t>(mine.size());
  all_gather(world, &my_length, lengths.data(), n, DType::i64);
  std::int64_t total = 0;
  for (const std::int64_t l : lengths) {
    if (l < static_cast<std::int64_t>(kFingerprintBytes) + 1 ||
        l > static_cast<std::int64_t>(kFingerprintBytes + kMaxHostName))
      throw InternalError("discover", "a device sent a host record of " + std::to_string(l) +
                                          " bytes (out of step?)");
    total += l;
  }
  std::vector<char> table(static_cast<std::size_t>(total));
  all_gatherv(world, mine.data(), table.data(), lengths, DType::i8);

  // Hosts in the order of their first device; every device checks the same table, so a
  // disagreement fails every device alike.
  std::vector<Topology::Host> hosts;
  std::map<std::string, std::size_t> index;
  std::vector<int> odd;
  std::size_t at = 0;
  for (int r = 0; r < n; ++r) {
    const auto len = static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)]);
    if (std::memcmp(table.data() + at, table.data(), kFingerprintBytes) != 0) odd.push_back(r);
    const std::string name(table.data() + at + kFingerprintBytes, len - kFingerprintBytes);
    at += len;
    const auto [it, fresh] = index.emplace(name, hosts.size());
    if (fresh) hosts.push_back({name, {}});
    hosts[it->second].devices.push_back(world.devices()[static_cast<std::size_t>(r)]);
  }
  if (!odd.empty())  // every device read the same table
    detail::throw_agreed(ValidationError(
        "discover", std::string(odd.size() > 1 ? "devices " : "device ") + device_list(odd) +
                        " got other options than device " +
                        std::to_string(world.devices().front()) +
                        " (probe, probe_bytes, preset): give every device the same"));

  const LinkClass fallback = Topology::single_host().intra();
  LinkClass intra = fallback, network = fallback;
  int nics = 1;
  std::string how;
  if (preset) {
    intra = preset->intra();
    network = preset->network();
    nics = preset->nics_per_host();
    how = "link classes of " + preset->name();
  } else if (!o.probe) {
    how = "default link classes (not measured)";
  } else {
    // Intra: the first two devices of the first host with two; network: the first devices of
    // hosts 0 and 1. Each device runs its part in that order, so the two never overlap on one.
    const auto two = std::find_if(hosts.begin(), hosts.end(),
                                  [](const Topology::Host& h) { return h.devices.size() >= 2; });
    const TagBlock tags = world.reserve(2);
    const int me = comm.rank();
    const int intra_from = two != hosts.end() ? two->devices[0] : -1;
    const int intra_to = two != hosts.end() ? two->devices[1] : -1;
    const int network_from = hosts.size() >= 2 ? hosts[0].devices[0] : -1;
    const int network_to = hosts.size() >= 2 ? hosts[1].devices[0] : -1;
    // Only the (at most 4) devices that probe hold the probe's buffer: probe_bytes may be 1 GiB.
    const auto bytes = static_cast<std::size_t>(o.probe_bytes);
    const std::size_t capacity = std::max(bytes, kSmallBytes);  // the latency probe's too
    std::shared_ptr<void> buffer;
    if (me == intra_from || me == intra_to || me == network_from || me == network_to) {
      buffer = comm.scratch(capacity);
      std::memset(buffer.get(), 0, capacity);
    }
    std::vector<double> found(4, 0.0);  // intra latency, bandwidth; network latency, bandwidth
    const auto probe = [&](int a, int b, int tag, std::size_t slot) {
      if (me != a && me != b) return;
      const Measured m = ping_pong(comm, buffer.get(), bytes, me == a ? b : a, tag, me == a);
      if (me == a) {
        found[slot] = m.latency;
        found[slot + 1] = m.bandwidth;
      }
    };
    if (intra_from >= 0) probe(intra_from, intra_to, tags.tag(0), 0);
    if (network_from >= 0) probe(network_from, network_to, tags.tag(1), 2);
    std::vector<double> all(static_cast<std::size_t>(4 * n));
    all_gather(world, found.data(), all.data(), 4 * std::int64_t{n}, DType::f64);
    const auto slot_of = [&](int device) {
      return static_cast<std::size_t>(4 * world.index_of(device));
    };
    if (intra_from >= 0) {
      const std::size_t s = slot_of(intra_from);
      intra = LinkClass{"intra", all[s + 1], all[s], {}, kDefaultIntraOverhead};
    }
    if (network_from >= 0) {
      const std::size_t s = slot_of(network_from) + 2;
      network = LinkClass{"network", all[s + 1], all[s], {}, kDefaultNetworkOverhead};
    } else {
      network = intra;
    }
    how = "links measured by ping-pong of " + std::to_string(kSmallBytes) + " and " +
          std::to_string(o.probe_bytes) + " bytes";
  }
  const std::string description = "Discovered by the job: " + std::to_string(hosts.size()) +
                                  (hosts.size() == 1 ? " host" : " hosts") + " by host name, " +
                                  how + ".";
  return Topology::from_hosts("discovered", hosts, intra, network, nics, description);
}

}  // namespace meshcast
