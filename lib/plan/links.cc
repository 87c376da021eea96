#include "links.h"

#include <algorithm>

#include "meshcast/error.h"

namespace meshcast::detail {

OpTime chain_time(std::int64_t bytes, int net_hops, int intra_hops, const Topology& topology,
                  std::int64_t chunk) {
  if (net_hops + intra_hops == 0) return {};
  const LinkClass& net = topology.network();
  const LinkClass& intra = topology.intra();
  const double b = static_cast<double>(bytes);
  const double c = static_cast<double>(std::min(chunk, bytes));
  // A hop between hosts goes through one NIC of each.
  const double nic = topology.nic_bandwidth();
  double slowest = 0;  // the least bandwidth among the classes the chain uses
  if (net_hops) slowest = nic;
  if (intra_hops) slowest = slowest > 0 ? std::min(slowest, intra.bandwidth) : intra.bandwidth;
  // The first chunk crosses every hop; the rest streams at the slowest hop's rate.
  const double fill = net_hops * c / nic + intra_hops * c / intra.bandwidth;
  const bool chained = net_hops + intra_hops > 1;
  return {net_hops * net.hop_latency(chained) + intra_hops * intra.hop_latency(chained),
          fill + (b - c) / slowest};
}

void check_chunk(std::int64_t chunk) {
  if (chunk < 1)
    throw ValidationError("chunk_bytes", "must be >= 1 (got " + std::to_string(chunk) + ")");
}

Links::Links(const Topology& topology, std::vector<int> devices)
    : topology_(&topology), devices_(std::move(devices)) {
  int hosts = 0;
  nics_ = static_cast<std::size_t>(topology.nics_per_host());
  for (int d : devices_) {
    host_.push_back(topology.host_of(d));
    nic_.push_back(topology.nic_of(d));
    hosts = std::max(hosts, host_.back() + 1);
  }
  bandwidth_.assign(2 * devices_.size(), topology.intra().bandwidth);
  bandwidth_.resize(bandwidth_.size() + 2 * static_cast<std::size_t>(hosts) * nics_,
                    topology.nic_bandwidth());
}

std::size_t Links::slot(int device) const {
  const auto it = std::lower_bound(devices_.begin(), devices_.end(), device);
  if (it == devices_.end() || *it != device)
    throw ValidationError("plan",
                          "device " + std::to_string(device) + " is in no mesh of the plan");
  return static_cast<std::size_t>(it - devices_.begin());
}

std::string Links::name(std::size_t link) const {
  if (!network(link))
    return "device " + std::to_string(devices_[link / 2]) + (link % 2 ? " recv" : " send");
  const std::size_t nic = (link - 2 * devices_.size()) / 2, host = nic / nics_;
  std::string h = topology_->host_name(static_cast<int>(host));
  if (h.empty()) h = std::to_string(host);
  if (nics_ > 1) h += " nic " + std::to_string(nic % nics_);
  return "host " + h + (link % 2 ? " in" : " out");
}

void Links::hop(int from, int to, std::vector<std::size_t>& links) const {
  links.push_back(recv(to));
  if (from == to) return;
  links.push_back(send(from));
  if (host(from) != host(to)) {
    links.push_back(out(from));
    links.push_back(in(to));
  }
}

OpTime Links::flows(const Op& op, std::int64_t bytes, std::int64_t chunk,
                    std::vector<Flow>& out) const {
  const Topology& t = *topology_;
  switch (op.kind) {
    case OpKind::Zero:
      return {};
    case OpKind::Copy:
      out.push_back({{}, bytes});
      hop(op.root, op.root, out.back().links);
      return chain_time(bytes, 0, 1, t, chunk);
    case OpKind::Multicast: {
      Flow f{{}, bytes};
      int prev = op.root, net = 0;
      for (int p : op.peers) {
        hop(prev, p, f.links);
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
        out.push_back({{}, bytes});
        hop(c, op.root, out.back().links);
        const bool remote = host(c) != host(op.root);
        time.latency = std::max(time.latency, (remote ? t.network() : t.intra()).latency);
      }
      return time;  // occupancy: the simulator shares the links; predict() uses the schedule
    }
  }
  return {};
}

std::vector<LinkLoad> Links::loads(const Plan& plan) const {
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(plan.src().dtype()));
  std::vector<std::int64_t> bytes(size(), 0);
  std::vector<Flow> fs;
  for (const Op& op : plan.ops()) {
    fs.clear();
    flows(op, op.box.volume() * elem, kDefaultChunkBytes, fs);
    for (const Flow& f : fs)
      for (std::size_t l : f.links) bytes[l] += f.bytes;
  }
  std::vector<LinkLoad> out;
  for (std::size_t l = 0; l < size(); ++l)
    if (bytes[l] > 0)
      out.push_back({name(l), network(l), bytes[l], static_cast<double>(bytes[l]) / bandwidth(l)});
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
      for (std::size_t l : f.links) {
        load[p * size() + l] += static_cast<double>(f.bytes) / bandwidth(l);
        longest = std::max(longest, static_cast<double>(f.bytes) / bandwidth(l));
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
