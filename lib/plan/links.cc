#include "links.h"

#include <algorithm>

#include "lib/plan/multicast_tree.h"
#include "meshcast/error.h"

namespace meshcast::detail {

std::int64_t messages(std::int64_t bytes, std::int64_t chunk) {
  return std::max<std::int64_t>(1, bytes / chunk + (bytes % chunk != 0));
}

double stage_time(double message_bytes, bool network, const Topology& topology) {
  const double port = (network ? topology.network() : topology.intra()).overhead +
                      message_bytes / topology.intra().bandwidth;
  return network ? std::max(port, message_bytes / topology.nic_bandwidth()) : port;
}

OpTime chain_time(std::int64_t bytes, int net_hops, int intra_hops, const Topology& topology,
                  std::int64_t chunk) {
  if (net_hops + intra_hops == 0) return {};
  const std::int64_t m = messages(bytes, chunk);
  const double c = static_cast<double>(bytes) / static_cast<double>(m);
  const double net = stage_time(c, true, topology), intra = stage_time(c, false, topology);
  const double slowest = std::max(net_hops ? net : 0.0, intra_hops ? intra : 0.0);
  const bool chained = net_hops + intra_hops > 1;
  return {net_hops * topology.network().hop_latency(chained) +
              intra_hops * topology.intra().hop_latency(chained),
          net_hops * net + intra_hops * intra + static_cast<double>(m - 1) * slowest};
}

double send_weight(std::int64_t bytes, std::int64_t m, bool network, const Topology& topology) {
  if (bytes == 0) return 1;  // an empty flow moves nothing; its overhead waits with the latency
  const double o = (network ? topology.network() : topology.intra()).overhead;
  return 1 + static_cast<double>(m) * o * topology.intra().bandwidth / static_cast<double>(bytes);
}

void check_chunk(std::int64_t chunk) {
  if (chunk < 1)
    throw ValidationError("chunk_bytes", "must be >= 1 (got " + std::to_string(chunk) + ")");
}

std::vector<int> plan_hosts(const Topology& topology, const std::vector<int>& devices,
                            std::vector<int>& ids) {
  std::vector<int> host(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) host[i] = topology.host_of(devices[i]);
  ids = host;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int& h : host)
    h = static_cast<int>(std::lower_bound(ids.begin(), ids.end(), h) - ids.begin());
  return host;
}

Links::Links(const Topology& topology, std::vector<int> devices)
    : topology_(&topology), devices_(std::move(devices)) {
  nics_ = static_cast<std::size_t>(topology.nics_per_host());
  host_ = plan_hosts(topology, devices_, host_ids_);
  for (int d : devices_) nic_.push_back(topology.nic_of(d));
  bandwidth_.assign(2 * devices_.size(), topology.intra().bandwidth);
  bandwidth_.resize(bandwidth_.size() + 2 * host_ids_.size() * nics_, topology.nic_bandwidth());
  // A table where ids are not far beyond the device count (ids are >= 0): pricing and the
  // model look a device up per hop, and the binary search was most of their time.
  if (!devices_.empty() && static_cast<std::size_t>(devices_.back()) < 4 * devices_.size() + 4096) {
    dense_.assign(static_cast<std::size_t>(devices_.back()) + 1, kNone);
    for (std::size_t i = 0; i < devices_.size(); ++i)
      dense_[static_cast<std::size_t>(devices_[i])] = static_cast<std::uint32_t>(i);
  }
}

std::size_t Links::slot(int device) const {
  if (!dense_.empty()) {
    if (device >= 0 && static_cast<std::size_t>(device) < dense_.size() &&
        dense_[static_cast<std::size_t>(device)] != kNone)
      return dense_[static_cast<std::size_t>(device)];
    throw ValidationError("plan",
                          "device " + std::to_string(device) + " is in no mesh of the plan");
  }
  const auto it = std::lower_bound(devices_.begin(), devices_.end(), device);
  if (it == devices_.end() || *it != device)
    throw ValidationError("plan",
                          "device " + std::to_string(device) + " is in no mesh of the plan");
  return static_cast<std::size_t>(it - devices_.begin());
}

std::string Links::name(std::size_t link) const {
  if (!network(link))
    return "device " + std::to_string(devices_[link / 2]) + (link % 2 ? " recv" : " send");
  const std::size_t nic = (link - 2 * devices_.size()) / 2;
  const int host = host_ids_[nic / nics_];
  std::string h = topology_->host_name(host);
  if (h.empty()) h = std::to_string(host);
  if (nics_ > 1) h += " nic " + std::to_string(nic % nics_);
  return "host " + h + (link % 2 ? " in" : " out");
}

void Links::hop(int from, int to, std::int64_t m, Flow& f) const {
  const auto add = [&f](std::size_t link, double weight) {
    f.links.push_back(link);
    f.weights.push_back(weight);
  };
  add(recv(to), 1);
  if (from == to) return;
  const bool remote = host(from) != host(to);
  add(send(from), send_weight(f.bytes, m, remote, *topology_));
  if (remote) {
    add(out(from), 1);
    add(in(to), 1);
  }
}

OpTime Links::flows(const Op& op, std::int64_t bytes, std::int64_t chunk,
                    std::vector<Flow>& out) const {
  const Topology& t = *topology_;
  switch (op.kind) {
    case OpKind::Zero:
      return {};
    case OpKind::Copy:  // a local copy: no message, no overhead
      out.push_back({{}, {}, bytes});
      hop(op.root, op.root, 0, out.back());
      return {t.intra().latency, static_cast<double>(bytes) / t.intra().bandwidth};
    case OpKind::Multicast: {
      Flow f{{}, {}, bytes};
      const std::int64_t m = messages(bytes, chunk);
      // A tree or fork: every edge's links in one flow (a leader's or forking root's port twice).
      if (op.group != 0 || op.fork != 0) {
        const auto n = static_cast<std::int64_t>(op.peers.size());
        MulticastTree tree;
        tree.reset(t, bytes, chunk);
        tree.add(host(op.root), Links::out(op.root));
        for (std::int64_t k = 0; k < n; ++k) {
          const int p = op.peers[static_cast<std::size_t>(k)];
          const std::int64_t from = multicast_parent(k, n, op.group, op.fork);
          hop(from < 0 ? op.root : op.peers[static_cast<std::size_t>(from)], p, m, f);
          tree.add(host(p), Links::out(p));
        }
        out.push_back(std::move(f));
        return tree.time(op.group, op.fork);
      }
      int prev = op.root, net = 0;
      for (int p : op.peers) {
        hop(prev, p, m, f);
        net += host(prev) != host(p);
        prev = p;
      }
      out.push_back(std::move(f));
      return chain_time(bytes, net, static_cast<int>(op.peers.size()) - net, t, chunk);
    }
    case OpKind::Reduce: {
      OpTime time;
      for (int c : op.peers) {
        if (c == op.root) continue;
        out.push_back({{}, {}, bytes});
        hop(c, op.root, 1, out.back());
        const bool remote = host(c) != host(op.root);
        time.latency = std::max(time.latency, (remote ? t.network() : t.intra()).latency);
      }
      return time;  // occupancy: the simulator shares the links; predict() uses the schedule
    }
  }
  return {};
}

std::vector<LinkLoad> Links::loads(const Plan& plan, std::int64_t chunk) const {
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(plan.src().dtype()));
  std::vector<std::int64_t> bytes(size(), 0);
  std::vector<double> seconds(size(), 0);
  std::vector<Flow> fs;
  for (const Op& op : plan.ops()) {
    fs.clear();
    flows(op, op.box.volume() * elem, chunk, fs);
    for (const Flow& f : fs)
      for (std::size_t k = 0; k < f.links.size(); ++k) {
        bytes[f.links[k]] += f.bytes;
        seconds[f.links[k]] += f.seconds(k, *this);
      }
  }
  std::vector<LinkLoad> out;
  for (std::size_t l = 0; l < size(); ++l)
    if (bytes[l] > 0) out.push_back({name(l), network(l), bytes[l], seconds[l]});
  std::stable_sort(out.begin(), out.end(),
                   [](const LinkLoad& a, const LinkLoad& b) { return a.seconds > b.seconds; });
  return out;
}

double Links::analytic_seconds(const std::vector<Op>& ops, std::int64_t elem_size,
                               std::int64_t chunk) const {
  int phases = 0;
  for (const Op& op : ops) phases = std::max(phases, op.phase + 1);
  std::vector<double> load(size() * static_cast<std::size_t>(phases), 0);
  std::vector<double> latency(static_cast<std::size_t>(phases), 0), alone(latency);
  std::vector<Flow> fs;
  for (const Op& op : ops) {
    const auto p = static_cast<std::size_t>(op.phase);
    fs.clear();
    const OpTime t = flows(op, op.box.volume() * elem_size, chunk, fs);
    double longest = 0;  // a reduce's occupancy: its busiest link's share of it
    for (const Flow& f : fs)
      for (std::size_t k = 0; k < f.links.size(); ++k) {
        load[p * size() + f.links[k]] += f.seconds(k, *this);
        longest = std::max(longest, f.seconds(k, *this));
      }
    latency[p] = std::max(latency[p], t.latency);
    alone[p] = std::max(alone[p], t.latency + (op.kind == OpKind::Reduce ? longest : t.occupancy));
  }
  double total = 0;
  for (std::size_t p = 0; p < static_cast<std::size_t>(phases); ++p) {
    double busiest = 0;
    for (std::size_t l = 0; l < size(); ++l) busiest = std::max(busiest, load[p * size() + l]);
    total += std::max(busiest + latency[p], alone[p]);
  }
  return total;
}

}  // namespace meshcast::detail
