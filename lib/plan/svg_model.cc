// The model of plan_svg's pictures (lib/plan/svg_model.h): hops, boxes, flows, captions.
#include "lib/plan/svg_model.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <utility>

#include "lib/plan/svg.h"
#include "lib/support/text.h"
#include "meshcast/limits.h"
#include "meshcast/multicast_tree.h"
#include "meshcast/units.h"

namespace meshcast::svg {
namespace {

// A host is cut into runs of at least this many devices (aggregated view).
constexpr std::int64_t kMinChunk = 8;

// Every transfer of the plan as its hops, the way PlanStats counts them: f(from, from_dst, to,
// bytes), from_dst when the sender reads its destination buffer (a forwarding receiver).
template <class F>
void for_each_hop(const Plan& plan, F&& f) {
  const auto elem = static_cast<std::int64_t>(dtype_size(plan.dst().dtype()));
  for (const Op& op : plan.ops()) {
    const std::int64_t bytes = op.box.volume() * elem;
    switch (op.kind) {
      case OpKind::Copy:
        f(op.root, false, op.root, bytes);
        break;
      case OpKind::Multicast: {
        const auto n = static_cast<std::int64_t>(op.peers.size());
        for (std::int64_t k = 0; k < n; ++k) {
          const std::int64_t parent = multicast_parent(k, n, op.group, op.fork);
          const int to = op.peers[static_cast<std::size_t>(k)];
          if (parent < 0)
            f(op.root, op.from_dst, to, bytes);
          else
            f(op.peers[static_cast<std::size_t>(parent)], true, to, bytes);
        }
        break;
      }
      case OpKind::Reduce:
        for (int c : op.peers) f(c, false, op.root, bytes);
        break;
      case OpKind::Zero:
        break;
    }
  }
}

std::string tile_label(const Layout& l, std::int64_t index) {
  std::string s = l.tile_at(index).str();
  if (l.spec().is_partial()) s += " addend " + std::to_string(l.partial_group(index));
  return s;
}

// "devices 64-71" for consecutive ids, else "8 devices".
std::string devices_text(std::vector<int> ids) {
  std::sort(ids.begin(), ids.end());
  if (ids.size() == 1) return "device " + std::to_string(ids[0]);
  if (ids.back() - ids.front() + 1 == static_cast<int>(ids.size()))
    return "devices " + std::to_string(ids.front()) + "-" + std::to_string(ids.back());
  return std::to_string(ids.size()) + " devices";
}

// The mesh's indices grouped by host: hosts in order of first appearance, indices in mesh order.
std::vector<std::pair<int, std::vector<std::int64_t>>> by_host(const Mesh& m, const Hosts& h) {
  std::vector<std::pair<int, std::vector<std::int64_t>>> groups;
  std::map<int, std::size_t> slot;
  for (std::int64_t i = 0; i < m.size(); ++i) {
    const int host = h.of(m.device(i));
    const auto [it, fresh] = slot.emplace(host, groups.size());
    if (fresh) groups.emplace_back(host, std::vector<std::int64_t>{});
    groups[it->second].second.push_back(i);
  }
  return groups;
}

Panel device_panel(const Layout& l, const Hosts& hosts) {
  Panel p{&l, {}, {}, std::vector<std::size_t>(static_cast<std::size_t>(l.mesh().size())), {}};
  for (const auto& [host, indices] : by_host(l.mesh(), hosts)) {
    p.frames.push_back({hosts.name(host), indices.size()});
    for (const std::int64_t i : indices) {
      p.box_of_index[static_cast<std::size_t>(i)] = p.boxes.size();
      Box b{{l.mesh().device(i)}, host, "device " + std::to_string(l.mesh().device(i)), {}};
      if (l.mesh().ndim() > 1) {
        b.title += " (";
        for (const std::int64_t c : l.mesh().coord(i)) b.title += std::to_string(c) + ",";
        b.title.back() = ')';
      }
      b.detail = tile_label(l, i);
      p.boxes.push_back(std::move(b));
    }
  }
  return p;
}

// At most max_boxes boxes: one per host; runs of consecutive hosts when there are more; a host
// cut into runs of its devices when there are fewer and it holds many.
Panel host_panel(const Layout& l, const Hosts& hosts, std::int64_t max_boxes) {
  const Mesh& m = l.mesh();
  Panel p{&l, {}, {}, std::vector<std::size_t>(static_cast<std::size_t>(m.size())), {}};
  const auto groups = by_host(m, hosts);
  const auto n_hosts = static_cast<std::int64_t>(groups.size());
  const auto add = [&](std::string title, const char* kind, std::vector<std::int64_t> indices) {
    Box b{{}, hosts.of(m.device(indices[0])), std::move(title), {}, kind};
    for (const std::int64_t i : indices) {
      p.box_of_index[static_cast<std::size_t>(i)] = p.boxes.size();
      b.devices.push_back(m.device(i));
    }
    b.detail = devices_text(b.devices);
    p.boxes.push_back(std::move(b));
  };
  if (n_hosts > max_boxes) {
    const auto k = static_cast<std::size_t>((n_hosts + max_boxes - 1) / max_boxes);
    for (std::size_t g = 0; g < groups.size(); g += k) {
      const std::size_t last = std::min(g + k, groups.size()) - 1;
      std::vector<std::int64_t> indices;
      for (std::size_t h = g; h <= last; ++h)
        indices.insert(indices.end(), groups[h].second.begin(), groups[h].second.end());
      if (last == g)
        add(hosts.name(groups[g].first), "host", std::move(indices));
      else
        add(hosts.name(groups[g].first) + ".." + hosts.name(groups[last].first), "hosts",
            std::move(indices));
    }
    p.note = "A box stands for up to " + std::to_string(k) + " consecutive hosts.";
    return p;
  }
  // The smallest run length (at least kMinChunk) that fits: a binary search, the count of
  // boxes falling as the run grows; one run per host always fits.
  std::int64_t most = 1;
  for (const auto& g : groups) most = std::max(most, static_cast<std::int64_t>(g.second.size()));
  const auto boxes_for = [&](std::int64_t run) {
    std::int64_t n = 0;
    for (const auto& g : groups) n += (static_cast<std::int64_t>(g.second.size()) + run - 1) / run;
    return n;
  };
  std::int64_t lo = std::min(kMinChunk, most), hi = most;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (boxes_for(mid) <= max_boxes)
      hi = mid;
    else
      lo = mid + 1;
  }
  const auto run = static_cast<std::size_t>(lo);
  for (const auto& [host, indices] : groups) {
    const std::size_t n = indices.size(), parts = (n + run - 1) / run;
    for (std::size_t part = 0; part < parts; ++part) {
      const auto from = indices.begin() + static_cast<std::ptrdiff_t>(part * run);
      const auto to = indices.begin() + static_cast<std::ptrdiff_t>(std::min(n, (part + 1) * run));
      if (parts == 1)
        add(hosts.name(host), "host", {from, to});
      else
        add(hosts.name(host) + " (" + std::to_string(part + 1) + "/" + std::to_string(parts) + ")",
            "host-part", {from, to});
    }
  }
  if (run < static_cast<std::size_t>(most))
    p.note = "A box stands for up to " + std::to_string(run) +
             " consecutive devices of one host (in mesh order).";
  return p;
}

Flows flows_of(const Plan& plan, const Hosts& hosts, const Panel& src, const Panel& dst) {
  Flows f;
  f.received_from.resize(dst.boxes.size());
  f.in.assign(dst.boxes.size(), {});
  f.out.assign(src.boxes.size(), {});
  for_each_hop(plan, [&](int from, bool from_dst, int to, std::int64_t bytes) {
    const auto a = (from_dst ? dst : src).box(from);
    const auto b = dst.box(to);
    if (!a || !b) return;  // a hand-built plan naming a device outside its meshes
    const Link link = hosts.link(from, to);
    f.between[{from_dst, *a, *b, link}] += bytes;
    f.received_from[*b][from] += bytes;
    f.in[*b][link] += bytes;
    if (!from_dst) f.out[*a][link] += bytes;
  });
  for (const auto& [key, bytes] : f.between)
    if (!std::get<0>(key) || std::get<1>(key) != std::get<2>(key)) ++f.lines;
  return f;
}

}  // namespace

Hosts hosts_of(const Plan& plan, const Topology& t) {
  Hosts h;
  for (int d : plan.devices())
    if (!t.covers(d)) {
      h.unknown_why = "topology " + t.name() + " does not place device " + std::to_string(d);
      return h;
    }
  std::int64_t moved = 0, intra = 0, network = 0;
  for_each_hop(plan, [&](int from, bool, int to, std::int64_t bytes) {
    if (from == to) return;
    moved += bytes;
    (t.host_of(from) == t.host_of(to) ? intra : network) += bytes;
  });
  // A plan that accounts its bytes (not a hand-built one) tells which topology it was made for.
  const PlanStats& st = plan.stats();
  if (st.bytes_moved == moved && (st.bytes_intra_host != intra || st.bytes_network != network)) {
    h.unknown_why = "the plan's network bytes do not match topology " + t.name();
    return h;
  }
  h.topology = &t;
  return h;
}

std::optional<std::size_t> Panel::box(int device) const {
  const auto i = layout->mesh().index_of(device);
  if (!i) return std::nullopt;
  return box_of_index[static_cast<std::size_t>(*i)];
}

View view_of(const Plan& plan, const Hosts& hosts) {
  const std::int64_t ns = plan.src().mesh().size(), nd = plan.dst().mesh().size();
  std::string why;
  if (ns <= kSvgDeviceView && nd <= kSvgDeviceView) {
    View v{device_panel(plan.src(), hosts), device_panel(plan.dst(), hosts), {}, true, {}};
    v.flows = flows_of(plan, hosts, v.src, v.dst);
    // Elements: about 8 per box and its stripes, 3 per line (path, tooltip, label).
    const auto elements = static_cast<std::int64_t>(
        static_cast<std::size_t>(ns + nd) * (8 + kMaxStripes) + 3 * v.flows.lines + 100);
    if (v.flows.lines <= kSvgDeviceLines && elements <= limits().svg_elements) return v;
    why = std::to_string(v.flows.lines) + " device-to-device transfers, more than " +
          std::to_string(kSvgDeviceLines) + " to draw one by one";
  } else {
    why = std::to_string(ns) + " source and " + std::to_string(nd) +
          " destination devices, more than " + std::to_string(kSvgDeviceView) +
          " in a mesh to draw one by one";
  }
  // Elements: at most 3 per line, up to 3 lines (link classes) per pair of boxes.
  const std::int64_t max_boxes =
      std::clamp<std::int64_t>(limits().svg_elements / 200, 1, kSvgMaxBoxes);
  View v{host_panel(plan.src(), hosts, max_boxes),
         host_panel(plan.dst(), hosts, max_boxes),
         {},
         false,
         why};
  v.flows = flows_of(plan, hosts, v.src, v.dst);
  return v;
}

Captions captions_of(const Plan& plan, const Hosts& hosts, const View& v) {
  const Layout& src = plan.src();
  const Layout& dst = plan.dst();
  Captions c;
  c.title = "meshcast plan: " + shape_str(src.shape()) + " " + to_string(src.dtype()) + " \u00b7 " +
            src.str() + " \u2192 " + dst.str();
  if (!v.devices) {
    const auto any = [&](const char* kind) {
      for (const Panel* p : {&v.src, &v.dst})
        for (const Box& b : p->boxes)
          if (b.kind == std::string(kind)) return true;
      return false;
    };
    c.subtitle = "Aggregated view (" + v.why + "): one box per " +
                 (any("hosts")       ? "run of hosts (see below)"
                  : any("host-part") ? "host or part of one (see below)"
                                     : "host") +
                 ", the bytes between boxes on the lines.";
  }
  const auto mesh_text = [&](const char* what, const Layout& l) {
    const std::int64_t n = l.mesh().size();
    std::string s = std::string(what) + " " + l.str() + " \u00b7 " + std::to_string(n) +
                    (n == 1 ? " device" : " devices");
    if (hosts.topology) {
      std::set<int> on;
      for (const int d : l.mesh().devices()) on.insert(hosts.of(d));
      s += " on " + std::to_string(on.size()) + (on.size() == 1 ? " host" : " hosts");
    }
    return s;
  };
  c.src = mesh_text("source", src);
  c.dst = mesh_text("destination", dst);

  const PlanStats& st = plan.stats();
  c.footer.push_back("strategy " + to_string(plan.strategy()) + " \u00b7 balance " +
                     to_string(plan.balance()) + " \u00b7 topology " + plan.topology() +
                     " \u00b7 " +
                     detail::counted(static_cast<std::int64_t>(plan.ops().size()), "op") + " in " +
                     detail::counted(plan.phases(), "phase"));
  char pred[64];
  std::snprintf(pred, sizeof pred, "%.3g s", st.predicted_seconds);
  c.footer.push_back(
      "tensor " + human_bytes(src.bytes()) + " \u00b7 bytes moved " + human_bytes(st.bytes_moved) +
      " (intra-host " + human_bytes(st.bytes_intra_host) + ", network " +
      human_bytes(st.bytes_network) + ") \u00b7 local copies " + human_bytes(st.bytes_local) +
      " \u00b7 predicted " + pred + (st.search_truncated ? " (search truncated)" : ""));
  c.footer.push_back(
      "Transfers are drawn hop by hop: a multicast along its chain (or tree of chains), a "
      "receiver forwarding from its destination buffer as an arc above the destination row.");
  if (v.devices) {
    c.footer.push_back(
        "Each device has its own colour; a destination device is striped by the devices it "
        "receives from (width \u221d bytes; beyond " +
        std::to_string(kMaxStripes - 1) + " senders the smaller ones in grey).");
  } else {
    c.footer.push_back(
        "Each box lists the bytes its devices send (source) or receive (destination) by link, "
        "those that stay inside it included.");
    for (const std::string& note : {v.src.note, v.dst.note})
      if (!note.empty() && std::find(c.footer.begin(), c.footer.end(), note) == c.footer.end())
        c.footer.push_back(note);
  }
  if (!hosts.topology)
    c.footer.push_back("Hosts unknown (" + hosts.unknown_why +
                       "): transfers are not told apart by link.");
  return c;
}

}  // namespace meshcast::svg
