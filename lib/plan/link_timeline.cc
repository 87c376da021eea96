#include "link_timeline.h"

#include <algorithm>

#include "lib/support/sort_runs.h"

namespace meshcast::detail {
namespace {

// A chain's order: (not on the root's host, host, rail, id), packed in 64 bits; hosts < 2^21,
// rails < 1024 (NICs per host), ids >= 0 ints. The rail of a device off the root's host is how
// many NICs its NIC comes after the root's: a host is entered through the NIC of the root's
// index (rail 0: on DGX-style hosts, GPU i talks to GPU i) where a receiver has one. chain_order
// sorts by it and the schedule's chain_last takes its maximum.
std::uint64_t chain_key(int device, int host, std::uint64_t rail, int root_host) {
  return (std::uint64_t{host != root_host} << 62) | (static_cast<std::uint64_t>(host) << 41) |
         (host != root_host ? rail << 31 : 0) | static_cast<std::uint64_t>(device);
}

}  // namespace

LinkTimeline::LinkTimeline(const Topology& topology, std::vector<int> devices,
                           std::size_t elem_size, std::int64_t chunk_bytes)
    : topology_(&topology),
      devices_(std::move(devices)),
      elem_size_(elem_size),
      chunk_(chunk_bytes) {
  check_chunk(chunk_bytes);
  const auto nics = nics_ = static_cast<std::size_t>(topology.nics_per_host());
  std::vector<int> ids;
  const std::vector<int> host = plan_hosts(topology, devices_, ids);
  dev_.resize(devices_.size());
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    dev_[i].host = host[i];
    dev_[i].rail = static_cast<std::size_t>(topology.nic_of(devices_[i]));
    dev_[i].nic = static_cast<std::size_t>(dev_[i].host) * nics + dev_[i].rail;
  }
  out_.assign(ids.size() * nics, 0);
  in_ = out_;
  // The lookup table, where the largest id is not far beyond the device count (ids are >= 0).
  if (!devices_.empty() && static_cast<std::size_t>(devices_.back()) < 4 * devices_.size() + 4096) {
    dense_.resize(static_cast<std::size_t>(devices_.back()) + 1);
    std::size_t i = 0;
    for (std::size_t id = 0; id < dense_.size(); ++id) {
      while (i < devices_.size() && static_cast<std::size_t>(devices_[i]) < id) ++i;
      dense_[id] = static_cast<std::uint32_t>(i);  // what lower_bound gives
    }
  }
  reset();
}

void LinkTimeline::reset() {
  for (Device& d : dev_) d = Device{0, 0, 0, 0, 0, d.host, d.nic, d.rail};
  std::fill(out_.begin(), out_.end(), 0);
  std::fill(in_.begin(), in_.end(), 0);
  makespan_ = total_end_ = 0;
}

void LinkTimeline::next_phase() {
  for (Device& d : dev_) d.prev = d.finish;
}

std::size_t LinkTimeline::sparse_index(int device) const {
  return static_cast<std::size_t>(std::lower_bound(devices_.begin(), devices_.end(), device) -
                                  devices_.begin());
}

OpTime LinkTimeline::link_time(std::int64_t bytes, bool remote) const {
  const LinkClass& l = remote ? topology_->network() : topology_->intra();
  return {l.latency,
          static_cast<double>(bytes) / (remote ? topology_->nic_bandwidth() : l.bandwidth)};
}

double LinkTimeline::overhead(bool remote) const {
  return (remote ? topology_->network() : topology_->intra()).overhead;
}

void LinkTimeline::entry_nics(const std::vector<int>& peers, int root_host, std::size_t root_nic,
                              std::vector<std::size_t>& nics) const {
  std::vector<std::uint64_t> keys;  // the chain keys of the peers off the root's host
  for (int p : peers) {
    const std::size_t i = index(p);
    if (dev_[i].host != root_host)
      keys.push_back(chain_key(p, dev_[i].host, rail(i, root_nic), root_host));
  }
  std::sort(keys.begin(), keys.end());
  for (std::size_t k = 0; k < keys.size(); ++k)
    if (k == 0 || keys[k] >> 41 != keys[k - 1] >> 41)  // a host's first: its entry
      nics.push_back(dev_[index(static_cast<int>(keys[k] & ((std::uint64_t{1} << 31) - 1)))].nic);
}

OpTime LinkTimeline::multicast_time(std::int64_t bytes, int net_hops, std::size_t peers) const {
  // The chain enters every receiving host once (chain_order): one network hop per host.
  // Consecutive ops mostly repeat the last one's (a task's transfers): kept.
  Timed& t = timed_;
  if (bytes != t.bytes || net_hops != t.net || peers != t.peers)
    t = {bytes, net_hops, peers,
         chain_time(bytes, net_hops, static_cast<int>(peers) - net_hops, *topology_, chunk_)};
  return t.time;
}

int LinkTimeline::best_root(const Op& op, std::span<const int> candidates) const {
  // What does not depend on the root: the receivers' readiness, and (with one NIC per host) the
  // two busiest distinct receiver hosts' inbound links (the root's own host is excluded, so keep
  // a runner-up). Forwarders are taken as for a root on no receiver's host (the last hop can
  // differ by one). With several NICs the entry NICs depend on the root's: computed per root.
  double ready = 0;
  thread_local std::vector<int> hosts;  // scratch: asked once per transfer of a greedy plan
  thread_local std::vector<std::size_t> entries;
  hosts.clear();
  const int last = chain_last(op.peers, -1, 0);
  for (int r : op.peers) {
    const std::size_t i = index(r);
    ready = std::max({ready, dev_[i].prev, dev_[i].recv, r != last ? dev_[i].send : 0.0});
    hosts.push_back(dev_[i].host);
  }
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  // entries: per receiving host (in `hosts` order), its entry NIC.
  int top_host = -1;
  double top = 0, second = 0;
  auto inbound = [&](std::size_t root_nic) {
    entries.clear();
    if (nics_ == 1)  // hosts' links
      entries.assign(hosts.begin(), hosts.end());
    else
      entry_nics(op.peers, -1, root_nic, entries);
    top_host = -1;
    top = second = 0;
    for (std::size_t k = 0; k < hosts.size(); ++k) {
      const double v = in_[entries[k]];
      if (top_host < 0 || v > top) {
        second = top_host < 0 ? 0 : top;
        top = v;
        top_host = hosts[k];
      } else {
        second = std::max(second, v);
      }
    }
  };
  if (nics_ == 1) inbound(0);
  const std::int64_t bytes = op.box.volume() * static_cast<std::int64_t>(elem_size_);
  int best = candidates.front();
  std::pair<double, std::int64_t> best_key{0, 0};
  // The op's time alone takes two values (the root on a receiving host or not): each computed
  // once, not per candidate.
  double alone[2] = {-1, -1};
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    const std::size_t s = index(candidates[k]);
    const int hs = dev_[s].host;
    if (nics_ > 1) inbound(dev_[s].nic);
    const bool among = std::binary_search(hosts.begin(), hosts.end(), hs);
    const int net = static_cast<int>(hosts.size()) - (among ? 1 : 0);
    double start = std::max({ready, dev_[s].prev, dev_[s].send});
    if (net) start = std::max({start, out_[dev_[s].nic], top_host != hs ? top : second});
    if (alone[among] < 0) alone[among] = multicast_time(bytes, net, op.peers.size()).total();
    const std::pair<double, std::int64_t> key{start + alone[among], dev_[s].sent_bytes};
    if (k == 0 || key < best_key) {
      best_key = key;
      best = candidates[k];
    }
  }
  return best;
}

int LinkTimeline::best_contributor(std::span<const int> candidates, int root) const {
  int best = candidates.front();
  std::pair<double, std::int64_t> best_key{0, 0};
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    const std::size_t c = index(candidates[k]);
    if (candidates[k] == root) return root;  // holding an addend at the root costs nothing
    double ready = std::max(dev_[c].prev, dev_[c].send);
    if (dev_[c].host != host(root)) ready = std::max(ready, out_[dev_[c].nic]);
    const std::pair<double, std::int64_t> key{ready, dev_[c].sent_bytes};
    if (k == 0 || key < best_key) {
      best_key = key;
      best = candidates[k];
    }
  }
  return best;
}

int LinkTimeline::chain_last(const std::vector<int>& peers, int root_host,
                             std::size_t root_nic) const {
  if (peers.size() == 1) return peers[0];  // a send: asked per transfer of a sendrecv plan
  int last = -1;
  std::uint64_t best = 0;
  for (int p : peers) {
    const std::size_t i = index(p);
    const std::uint64_t key = chain_key(p, dev_[i].host, rail(i, root_nic), root_host);
    if (last < 0 || key > best) {
      best = key;
      last = p;
    }
  }
  return last;
}

double LinkTimeline::place(const Op& op, std::int64_t bytes) {
  const std::size_t root = index(op.root);
  const int hr = dev_[root].host;
  std::vector<std::size_t>& nics_in = touched_in_;
  std::vector<std::size_t>& nics_out = touched_out_;
  nics_in.clear();
  nics_out.clear();
  double start = dev_[root].prev;
  OpTime time;
  int last = -1;  // a multicast's last chain member: the one that forwards nothing
  switch (op.kind) {
    case OpKind::Copy:
    case OpKind::Zero:
      start = std::max(start, dev_[root].recv);
      if (op.kind == OpKind::Copy) time = link_time(bytes, false);
      break;
    case OpKind::Multicast: {
      start = std::max(start, dev_[root].send);
      last = chain_last(op.peers, hr, dev_[root].nic);
      for (int r : op.peers) {
        const std::size_t i = index(r);
        start = std::max({start, dev_[i].prev, dev_[i].recv});
        if (r != last) start = std::max(start, dev_[i].send);  // it forwards the chunks
        if (nics_ == 1 && dev_[i].host != hr) nics_in.push_back(dev_[i].nic);  // its host's link
      }
      if (nics_ == 1) {
        std::sort(nics_in.begin(), nics_in.end());
        nics_in.erase(std::unique(nics_in.begin(), nics_in.end()), nics_in.end());
      } else {
        entry_nics(op.peers, hr, dev_[root].nic, nics_in);
      }
      for (std::size_t n : nics_in) start = std::max(start, in_[n]);
      if (!nics_in.empty()) {
        // The chain leaves the root's host from its last member there (chain_order: the root's
        // host first, by id), the root itself when it has no receiver there. (Later hops leave
        // their hosts from other NICs; the list schedule does not place those.)
        std::size_t leaves = root;
        bool local = false;
        for (int r : op.peers)
          if (const std::size_t i = index(r); dev_[i].host == hr && (!local || i > leaves)) {
            leaves = i;  // slots are in id order
            local = true;
          }
        nics_out.push_back(dev_[leaves].nic);
        start = std::max(start, out_[dev_[leaves].nic]);
      }
      time = multicast_time(bytes, static_cast<int>(nics_in.size()), op.peers.size());
      break;
    }
    case OpKind::Reduce: {
      std::int64_t local = 0, remote = 0;
      start = std::max(start, dev_[root].recv);
      for (int c : op.peers) {
        if (c == op.root) continue;
        const std::size_t i = index(c);
        start = std::max({start, dev_[i].prev, dev_[i].send});
        if (dev_[i].host != hr) {
          ++remote;
          nics_out.push_back(dev_[i].nic);
          start = std::max(start, out_[dev_[i].nic]);
        } else {
          ++local;
        }
      }
      if (remote) {
        nics_in.push_back(dev_[root].nic);
        start = std::max(start, in_[dev_[root].nic]);
      }
      // Contributions share the root's receive port and, from other hosts, its host's link;
      // each contributor posts one message (its overhead, in parallel with the others').
      for (const auto& [n, r] : {std::pair{local, false}, std::pair{remote, true}})
        if (n) {
          const OpTime t = link_time(n * bytes, r);
          time = {std::max(time.latency, t.latency),
                  std::max(time.occupancy, t.occupancy + overhead(r))};
        }
      break;
    }
  }
  // Links are busy for the occupancy; the data has arrived a latency later.
  const double end = start + time.total(), busy = start + time.occupancy;
  // A device port carries k transfers of the box at its own (intra-host) rate, and a sender's
  // port also posts its messages (the overhead of each; a chain sends one per chunk): a chain
  // paced by the network keeps the network links busy for its whole occupancy, the ports only
  // for that.
  const double unit = static_cast<double>(bytes) / topology_->intra().bandwidth;
  auto port = [&](double k, double posting = 0) {
    return start + std::min(time.occupancy, k * unit + posting);
  };
  const double chunks = static_cast<double>(messages(bytes, chunk_));
  // A chain member's messages go to the next in op.peers: between hosts or inside one.
  auto posting = [&](int from, std::size_t next) {
    return chunks * overhead(next < op.peers.size() && host(op.peers[next]) != host(from));
  };
  auto finish = [&](std::size_t i) { dev_[i].finish = std::max(dev_[i].finish, end); };
  switch (op.kind) {
    case OpKind::Copy:
    case OpKind::Zero:
      dev_[root].recv = busy;
      break;
    case OpKind::Multicast:
      dev_[root].send = port(1, posting(op.root, 0));
      dev_[root].sent_bytes += bytes;
      for (std::size_t k = 0; k < op.peers.size(); ++k) {
        const int r = op.peers[k];
        Device& d = dev_[index(r)];
        d.recv = port(1);
        if (r != last) {  // chain members forward what they receive, all but the last
          d.send = port(1, posting(r, k + 1));
          d.sent_bytes += bytes;
        }
        finish(index(r));
      }
      break;
    case OpKind::Reduce:
      dev_[root].recv =
          port(static_cast<double>(op.peers.size()) -
               static_cast<double>(std::count(op.peers.begin(), op.peers.end(), op.root)));
      for (int c : op.peers) {
        if (c == op.root) continue;
        dev_[index(c)].send = port(1, overhead(host(c) != hr));
        dev_[index(c)].sent_bytes += bytes;
        finish(index(c));
      }
      break;
  }
  finish(root);
  for (auto h : nics_in) in_[h] = busy;
  for (auto h : nics_out) out_[h] = busy;
  makespan_ = std::max(makespan_, end);
  total_end_ += end;
  return end;
}

void chain_order(std::vector<int>& peers, int root, const LinkTimeline& s) {
  // Sorts by chain_key, computed once per peer rather than per comparison.
  const int hr = s.host(root);
  const std::size_t root_nic = s.nic(root);
  thread_local std::vector<std::uint64_t> keys, rest;  // scratch: a plan orders a chain per task
  keys.clear();
  rest.clear();
  for (int p : peers) {  // the root's host's first (their keys are the least), else in turn
    const int h = s.host(p);
    (h == hr ? keys : rest).push_back(chain_key(p, h, s.rail(s.slot(p), root_nic), hr));
  }
  keys.insert(keys.end(), rest.begin(), rest.end());
  if (std::is_sorted(keys.begin(), keys.end())) {
    if (rest.empty() || rest.size() == keys.size()) return;  // peers are in that order
  } else {
    sort_runs(keys, 41);  // by host (chain_key)
  }
  for (std::size_t i = 0; i < peers.size(); ++i)
    peers[i] = static_cast<int>(keys[i] & ((std::uint64_t{1} << 31) - 1));
}

}  // namespace meshcast::detail
