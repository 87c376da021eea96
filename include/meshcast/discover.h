// The topology of a running job, found by the job itself: which devices share a host (by host
// name) and, unless a preset or file gives them, how fast the links are (a short ping-pong).
// Every device of the communicator calls discover_topology() together and gets the identical
// Topology (the same to_json() text), so that every rank plans on the same one.
#pragma once

#include <cstdint>
#include <string>

#include "meshcast/communicator.h"
#include "meshcast/topology.h"

namespace meshcast {

struct DiscoverOptions {
  // This device's host name; empty: MESHCAST_HOSTNAME when set and not empty, else
  // gethostname(). Printable ASCII, 1 to 255 characters.
  std::string host;
  // Take the link classes (intra, network and NICs per host) from this topology (a file or a
  // preset name: Topology::resolve) instead of measuring them. Its placement is not used.
  std::string preset;
  // Measure the links (when no preset is given); false: the link classes of
  // Topology::single_host() for both (placement only).
  bool probe = true;
  // The large message of the probe: bandwidth = its bytes over its one-way time less the
  // latency; 1 byte to 1 GiB.
  std::int64_t probe_bytes = std::int64_t{4} << 20;
};

// Collective over comm.world(): every device contributes its host name; hosts are numbered in
// the order of their first device (by id) and named by their host names; each holds its devices
// in increasing order. The topology is named "discovered".
//
// Link classes: from `o.preset` when given; else (o.probe) measured: ping-pongs between the
// first two devices of the first host that has two (intra) and between the first devices of
// hosts 0 and 1 (network), latency from a 64-byte message, bandwidth from o.probe_bytes, the
// fastest of 3 round trips each after one warm-up; the results are exchanged so that every
// device returns the same numbers. With one host the network class is the intra class; a class
// that cannot be measured (one device per host, or one device at all) is single_host()'s.
//
// Throws (on every device alike, after an agreement) ValidationError naming "host",
// "MESHCAST_HOSTNAME", "probe_bytes" or the preset's error, or when devices were given different
// options ("discover"); ValidationError("comm") on a transport with device memory (nccl).
//
//   LocalWorld world(4);
//   world.run([](Communicator& c) {
//     DiscoverOptions o;
//     o.host = c.rank() < 2 ? "a" : "b";
//     Topology t = discover_topology(c, o);  // hosts a: {0, 1}, b: {2, 3}
//   });
Topology discover_topology(Communicator& comm, const DiscoverOptions& o = {});

// The host name discover_topology() uses for `given` (DiscoverOptions::host): `given`, else
// MESHCAST_HOSTNAME, else gethostname(). Throws ValidationError naming the source when the name
// is empty, longer than 255 characters or not printable ASCII.
std::string discover_host_name(const std::string& given = "");

}  // namespace meshcast
