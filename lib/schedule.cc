#include "schedule.h"

#include <algorithm>

namespace meshcast::detail {

Schedule::Schedule(const Topology& topology, std::vector<int> devices, std::size_t elem_size)
    : topology_(&topology), devices_(std::move(devices)), elem_size_(elem_size) {
  int hosts = 0;
  host_.reserve(devices_.size());
  for (int d : devices_) {
    host_.push_back(topology.host_of(d));
    hosts = std::max(hosts, host_.back() + 1);
  }
  out_.assign(static_cast<std::size_t>(hosts), 0);
  in_ = out_;
  reset();
}

void Schedule::reset() {
  const std::size_t n = devices_.size();
  send_.assign(n, 0);
  recv_.assign(n, 0);
  finish_.assign(n, 0);
  prev_.assign(n, 0);
  sent_bytes_.assign(n, 0);
  std::fill(out_.begin(), out_.end(), 0);
  std::fill(in_.begin(), in_.end(), 0);
  makespan_ = total_end_ = 0;
}

void Schedule::next_phase() { prev_ = finish_; }

std::size_t Schedule::index(int device) const {
  return static_cast<std::size_t>(std::lower_bound(devices_.begin(), devices_.end(), device) -
                                  devices_.begin());
}

double Schedule::duration(std::int64_t bytes, bool remote) const {
  const LinkClass& l = remote ? topology_->network() : topology_->intra();
  return l.latency + static_cast<double>(bytes) / l.bandwidth;
}

int Schedule::best_root(const Op& op, std::span<const int> candidates) const {
  // What does not depend on the root: the receivers' readiness, and the two busiest distinct
  // receiver hosts' inbound links (the root's own host is excluded, so keep a runner-up).
  double ready = 0;
  std::vector<int> hosts;
  for (int r : op.peers) {
    const std::size_t i = index(r);
    ready = std::max({ready, prev_[i], recv_[i]});
    hosts.push_back(host_[i]);
  }
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  int top_host = -1;
  double top = 0, second = 0;
  for (int h : hosts) {
    const double v = in_[static_cast<std::size_t>(h)];
    if (top_host < 0 || v > top) {
      second = top_host < 0 ? 0 : top;
      top = v;
      top_host = h;
    } else {
      second = std::max(second, v);
    }
  }
  const std::int64_t bytes = op.box.volume() * static_cast<std::int64_t>(elem_size_);
  int best = candidates.front();
  std::pair<double, std::int64_t> best_key{0, 0};
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    const std::size_t s = index(candidates[k]);
    const int hs = host_[s];
    const bool remote =
        hosts.size() > 1 || (hosts.size() == 1 && hosts.front() != hs);
    double start = std::max({ready, prev_[s], send_[s]});
    if (remote)
      start = std::max({start, out_[static_cast<std::size_t>(hs)], top_host != hs ? top : second});
    const std::pair<double, std::int64_t> key{start + duration(bytes, remote), sent_bytes_[s]};
    if (k == 0 || key < best_key) {
      best_key = key;
      best = candidates[k];
    }
  }
  return best;
}

int Schedule::best_contributor(std::span<const int> candidates, int root) const {
  int best = candidates.front();
  std::pair<double, std::int64_t> best_key{0, 0};
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    const std::size_t c = index(candidates[k]);
    if (candidates[k] == root) return root;  // holding an addend at the root costs nothing
    double ready = std::max(prev_[c], send_[c]);
    if (host_[c] != host(root)) ready = std::max(ready, out_[static_cast<std::size_t>(host_[c])]);
    const std::pair<double, std::int64_t> key{ready, sent_bytes_[c]};
    if (k == 0 || key < best_key) {
      best_key = key;
      best = candidates[k];
    }
  }
  return best;
}

double Schedule::place(const Op& op) {
  const std::int64_t bytes = op.box.volume() * static_cast<std::int64_t>(elem_size_);
  const std::size_t root = index(op.root);
  const int hr = host_[root];
  std::vector<std::size_t> touched_hosts_in, touched_hosts_out;
  double start = prev_[root], dur = 0;
  switch (op.kind) {
    case OpKind::Copy:
    case OpKind::Zero:
      start = std::max(start, recv_[root]);
      dur = op.kind == OpKind::Copy ? duration(bytes, false) : 0;
      break;
    case OpKind::Multicast: {
      bool remote = false;
      start = std::max(start, send_[root]);
      for (int r : op.peers) {
        const std::size_t i = index(r);
        start = std::max({start, prev_[i], recv_[i]});
        if (host_[i] != hr) {
          remote = true;
          touched_hosts_in.push_back(static_cast<std::size_t>(host_[i]));
          start = std::max(start, in_[touched_hosts_in.back()]);
        }
      }
      if (remote) {
        touched_hosts_out.push_back(static_cast<std::size_t>(hr));
        start = std::max(start, out_[static_cast<std::size_t>(hr)]);
      }
      dur = duration(bytes, remote);
      break;
    }
    case OpKind::Reduce: {
      std::int64_t local = 0, remote = 0;
      start = std::max(start, recv_[root]);
      for (int c : op.peers) {
        if (c == op.root) continue;
        const std::size_t i = index(c);
        start = std::max({start, prev_[i], send_[i]});
        if (host_[i] != hr) {
          ++remote;
          touched_hosts_out.push_back(static_cast<std::size_t>(host_[i]));
          start = std::max(start, out_[touched_hosts_out.back()]);
        } else {
          ++local;
        }
      }
      if (remote) {
        touched_hosts_in.push_back(static_cast<std::size_t>(hr));
        start = std::max(start, in_[static_cast<std::size_t>(hr)]);
      }
      dur = std::max(local ? duration(local * bytes, false) : 0.0,
                     remote ? duration(remote * bytes, true) : 0.0);
      break;
    }
  }
  const double end = start + dur;
  auto finish = [&](std::size_t i) { finish_[i] = std::max(finish_[i], end); };
  switch (op.kind) {
    case OpKind::Copy:
    case OpKind::Zero:
      recv_[root] = end;
      break;
    case OpKind::Multicast:
      send_[root] = end;
      sent_bytes_[root] += bytes;
      for (int r : op.peers) {
        recv_[index(r)] = end;
        finish(index(r));
      }
      break;
    case OpKind::Reduce:
      recv_[root] = end;
      for (int c : op.peers) {
        if (c == op.root) continue;
        send_[index(c)] = end;
        sent_bytes_[index(c)] += bytes;
        finish(index(c));
      }
      break;
  }
  finish(root);
  for (auto h : touched_hosts_in) in_[h] = end;
  for (auto h : touched_hosts_out) out_[h] = end;
  makespan_ = std::max(makespan_, end);
  total_end_ += end;
  return end;
}

void chain_order(std::vector<int>& peers, int root, const Schedule& s) {
  const int hr = s.host(root);
  std::sort(peers.begin(), peers.end(), [&](int a, int b) {
    const int ha = s.host(a), hb = s.host(b);
    if ((ha != hr) != (hb != hr)) return ha == hr;
    return ha != hb ? ha < hb : a < b;
  });
}

}  // namespace meshcast::detail
