// What plan_svg draws (lib/plan/svg.cc): where the devices live, the boxes of each mesh, and
// the bytes between boxes, hop by hop, by link class. No geometry here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "meshcast/plan.h"
#include "meshcast/topology.h"

namespace meshcast::svg {

// Senders drawn as stripes of a destination device; the others merged into one.
inline constexpr std::size_t kMaxStripes = 8;

// The link a hop takes: between hosts, inside one, inside one device (a copy, or a reduce's own
// addend); kUnknown when the hosts are not known.
enum Link { kNetwork, kIntra, kLocal, kUnknown };

// Where the plan's devices live, as far as the picture knows.
struct Hosts {
  const Topology* topology = nullptr;  // null: unknown (unknown_why says why)
  std::string unknown_why;
  int of(int device) const { return topology ? topology->host_of(device) : 0; }
  std::string name(int host) const {
    if (!topology) return "hosts unknown";
    const std::string n = topology->host_name(host);
    return n.empty() ? "host" : n;
  }
  Link link(int from, int to) const {
    if (from == to) return kLocal;
    if (!topology) return kUnknown;
    return of(from) == of(to) ? kIntra : kNetwork;
  }
};

// The hosts of `t`, or unknown (with the reason) when `t` does not place every device of the
// plan or the plan's statistics split its bytes otherwise than `t` would.
Hosts hosts_of(const Plan& plan, const Topology& t);

struct Box {
  std::vector<int> devices;  // in mesh order
  int host = 0;              // of its first device
  std::string title, detail;
  const char* kind = "device";  // or "host", "hosts" (a run of them), "host-part"
};
struct Frame {  // device view: one host's devices of a mesh, the next `count` boxes
  std::string name;
  std::size_t count = 0;
};

// One mesh drawn as a row of boxes.
struct Panel {
  const Layout* layout = nullptr;
  std::vector<Box> boxes;
  std::vector<Frame> frames;              // device view only
  std::vector<std::size_t> box_of_index;  // mesh index -> box
  std::string note;                       // aggregated: what a box stands for, when not a host
  std::optional<std::size_t> box(int device) const;  // of a device of the mesh
};

// Bytes between two boxes over one link class. The sender is a source box, or a destination
// box forwarding what it received (from_dst).
using FlowKey = std::tuple<bool, std::size_t, std::size_t, Link>;  // from_dst, from, to, link

struct Flows {
  std::map<FlowKey, std::int64_t> between;
  std::vector<std::map<int, std::int64_t>> received_from;  // dst box -> sending device -> bytes
  std::vector<std::array<std::int64_t, 4>> in, out;        // dst / src box -> link -> bytes
  std::size_t lines = 0;                                   // flows drawn as a line
};

struct View {
  Panel src, dst;
  Flows flows;
  bool devices = true;  // the device view, else aggregated
  std::string why;      // aggregated: why
};

// The device view when it fits (lib/plan/svg.h), else the aggregated view.
View view_of(const Plan& plan, const Hosts& hosts);

// The picture's text outside the boxes.
struct Captions {
  std::string title;
  std::string subtitle;             // aggregated: what and why
  std::string src, dst;             // the meshes' labels
  std::vector<std::string> footer;  // statistics, then notes on reading the picture
};
Captions captions_of(const Plan& plan, const Hosts& hosts, const View& v);

}  // namespace meshcast::svg
