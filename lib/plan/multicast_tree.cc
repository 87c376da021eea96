#include "lib/plan/multicast_tree.h"

#include <algorithm>

#include "lib/plan/link_timeline.h"
#include "lib/support/word_hash.h"
#include "meshcast/multicast_tree.h"

namespace meshcast::detail {

void MulticastTree::reset(const Topology& topology, std::int64_t bytes, std::int64_t chunk) {
  topology_ = &topology;
  messages_ = messages(bytes, chunk);
  c_ = static_cast<double>(bytes) / static_cast<double>(messages_);
  host_.clear();
  nic_.clear();
  chained_.reset();
  ready_ = false;
}

void MulticastTree::add(int host, std::size_t nic) {
  host_.push_back(host);
  nic_.push_back(nic);
  ready_ = false;
}

void MulticastTree::prepare() {
  if (ready_) return;
  ready_ = true;
  const std::size_t n = host_.size() - 1;
  const bool chained = chained_ ? *chained_ : n > 1;  // as chain_time: a lone hop pays the
                                                      // plain latency
  stage_net_ = stage_time(c_, true, *topology_);
  stage_intra_ = stage_time(c_, false, *topology_);
  lat_net_ = topology_->network().hop_latency(chained);
  lat_intra_ = topology_->intra().hop_latency(chained);
  net_.assign(n, 0);
  sum_.assign(n + 1, 0);
  lat_.assign(n + 1, 0);
  nets_.assign(n + 1, 0);
  for (std::size_t k = 0; k < n; ++k) {
    const bool net = host_[k] != host_[k + 1];
    net_[k] = net;
    sum_[k + 1] = sum_[k] + latency(net) + stage(net);
    lat_[k + 1] = lat_[k] + latency(net);
    nets_[k + 1] = nets_[k] + net;
  }
  run_.assign(n, 0);
  for (std::size_t p = n; p-- > 0;)
    run_[p] =
        p + 1 < n && host_[p + 1] == host_[p + 2] ? run_[p + 1] : static_cast<std::int64_t>(p);
}

MulticastTree MulticastTree::branch(std::size_t from, std::size_t to) const {
  MulticastTree b;
  b.topology_ = topology_;
  b.messages_ = messages_;
  b.c_ = c_;
  b.chained_ = host_.size() > 2;  // the hops of the whole multicast's chunked chain
  b.host_.push_back(host_[0]);
  b.nic_.push_back(nic_[0]);
  b.host_.insert(b.host_.end(), host_.begin() + 1 + static_cast<std::ptrdiff_t>(from),
                 host_.begin() + 1 + static_cast<std::ptrdiff_t>(to));
  b.nic_.insert(b.nic_.end(), nic_.begin() + 1 + static_cast<std::ptrdiff_t>(from),
                nic_.begin() + 1 + static_cast<std::ptrdiff_t>(to));
  return b;
}

OpTime MulticastTree::time(std::int64_t group, std::int64_t fork) {
  const auto n = static_cast<std::int64_t>(host_.size()) - 1;
  if (n <= 0) return {};
  if (multicast_forks(n, fork)) return forked(split(fork), group);
  const Path p = path(group);
  return {p.latency, p.deepest - p.latency + static_cast<double>(messages_ - 1) * p.slowest};
}

MulticastTree::Fork MulticastTree::split(std::int64_t fork) const {
  const auto n = host_.size() - 1, f = static_cast<std::size_t>(fork);
  MulticastTree a = branch(0, f);
  Fork out{a.path(0), false, std::make_unique<MulticastTree>(branch(f, n))};
  out.first_net = a.net_[0];  // (path() prepared it)
  return out;
}

OpTime MulticastTree::forked(const Fork& f, std::int64_t group) {
  // Both branches stream at once behind the root, whose hop into each is its port's stage, which
  // posts each message twice (or its NIC's, carrying every branch that leaves its host).
  const double tail = static_cast<double>(messages_ - 1);
  const Path& pa = f.first;
  const bool net_a = f.first_net;
  MulticastTree& b = *f.second;
  const Path pb = b.path(group);
  const bool net_b = b.net_[0];
  const double port = overhead(net_a) + overhead(net_b) + 2 * c_ / topology_->intra().bandwidth;
  const double nic = static_cast<double>(int{net_a} + int{net_b}) * c_ / topology_->nic_bandwidth();
  const double stage_a = std::max(port, net_a ? nic : 0.0),
               stage_b = std::max(port, net_b ? nic : 0.0);
  const double via_a = pa.deepest - pa.first + stage_a, via_b = pb.deepest - pb.first + stage_b;
  const double latency = via_a >= via_b ? pa.latency : pb.latency;
  const double slowest = std::max({pa.slowest, pb.slowest, stage_a, stage_b});
  return {latency, std::max(via_a, via_b) - latency + tail * slowest};
}

MulticastTree::Path MulticastTree::path(std::int64_t group) {
  prepare();
  const auto n = static_cast<std::int64_t>(host_.size()) - 1;
  const double root = stage(net_[0]);
  if (group < 2 || group >= n) {  // one chain: chain_time
    const std::int64_t net = nets_[n];
    const double slowest = std::max(net ? stage_net_ : 0.0, net < n ? stage_intra_ : 0.0);
    return {sum_[n], lat_[n], slowest, root};
  }
  const std::int64_t first = n % group ? n % group : group;
  const std::int64_t groups = (n - first) / group + 1;
  const double copy = c_ / topology_->intra().bandwidth, wire = c_ / topology_->nic_bandwidth();
  // Receiver k is member k + 1 (host_, nic_); chain hop k reaches it (net_, sum_, lat_).
  double trunk = sum_[1], trunk_lat = lat_[1];  // the path to the current leader
  double deepest = -1, deepest_lat = 0, slowest = 0;
  std::int64_t kept = n, kept_net = nets_[n];  // chain hops the tree keeps: not into leaders 1..
  for (std::int64_t j = 0; j < groups; ++j) {
    const std::int64_t a = j ? first + (j - 1) * group : 0, end = j ? a + group : first;
    const bool next = j + 1 < groups;  // the trunk goes on to the leader `end`
    const bool net_t = next && host_[a + 1] != host_[end + 1];
    const bool inner = end - a > 1, net_f = inner && net_[a + 1];
    // The group's chain leaves the leader's host from its last receiver there (`e`), perhaps
    // through the NIC the trunk leaves by.
    const std::int64_t e = run_[a];
    const bool cont = e != a && e + 1 < end, shared = cont && nic_[e + 1] == nic_[a + 1];
    const double port =
        (next ? overhead(net_t) + copy : 0.0) + (inner ? overhead(net_f) + copy : 0.0);
    const double out = static_cast<double>(int{net_t} + int{net_f} + int{shared}) * wire;
    const double stage_t = std::max(port, net_t ? out : 0.0);
    const double stage_f = std::max(port, net_f ? out : 0.0);
    const double stage_c = std::max(overhead(true) + copy, shared ? out : wire);
    double path = trunk + sum_[end] - sum_[a + 1];
    if (inner) {
      path += stage_f - stage(net_f);
      slowest = std::max(slowest, stage_f);
    }
    if (cont) {
      path += stage_c - stage_net_;
      slowest = std::max(slowest, stage_c);
    }
    if (path > deepest) {
      deepest = path;
      deepest_lat = trunk_lat + lat_[end] - lat_[a + 1];
    }
    if (next) {
      slowest = std::max(slowest, stage_t);
      trunk += latency(net_t) + stage_t;
      trunk_lat += latency(net_t);
      --kept;
      kept_net -= net_[end];
    }
  }
  slowest = std::max({slowest, kept_net ? stage_net_ : 0.0, kept > kept_net ? stage_intra_ : 0.0});
  return {deepest, deepest_lat, slowest, root};
}

bool MulticastTree::whole(std::int64_t group, std::int64_t fork) {
  prepare();
  const auto n = static_cast<std::int64_t>(host_.size()) - 1;
  if (multicast_forks(n, fork))
    return branch(static_cast<std::size_t>(fork), static_cast<std::size_t>(n)).whole(group);
  if (group < 2 || group >= n) return true;  // one chain
  const std::int64_t first = n % group ? n % group : group;
  bool hosts = true, within = true;
  for (std::int64_t a = 0, end = first; a < n; a = end, end += group) {
    hosts = hosts && (a == 0 || net_[a]);
    within = within && run_[a] >= end - 1;
    if (!hosts && !within) return false;
  }
  return true;
}

std::int32_t MulticastTree::best(std::int64_t fork) {
  const auto n = static_cast<std::int64_t>(host_.size()) - 1;
  // Forked, the groups cut the second branch; the first, a chain, is the same for every group
  // (the whole op is timed: where the first branch is the deeper, a tree that slows the root's
  // stage slows the op).
  const bool forks = multicast_forks(n, fork);
  const Fork f = forks ? split(fork) : Fork{};
  MulticastTree& cut = forks ? *f.second : *this;
  const auto cost = [&](std::int64_t g) { return (forks ? forked(f, g) : time(g)).total(); };
  const std::int64_t m = forks ? n - fork : n;
  // With 3 receivers or fewer, every tree is a chain (no leader has both a trunk and a group).
  if (m < 4) return 0;
  double least = cost(0);
  std::int32_t best = 0;
  // sum over g of m / g: O(m log m) in all.
  for (std::int64_t g = 2; g < m; ++g)
    if (cut.whole(g))
      if (const double t = cost(g); t < least * (1 - 1e-12)) {
        least = t;
        best = static_cast<std::int32_t>(g);
      }
  return best;
}

std::size_t TreeShapes::Hash::operator()(const std::vector<std::int64_t>& key) const {
  detail::WordHash w;
  for (std::int64_t v : key) w.add(v);
  return static_cast<std::size_t>(w.value());
}

const TreeShapes::Shape& TreeShapes::shape(const Op& op, std::int64_t bytes) {
  // The multicast asked last (the planner chooses an op's tree, then prices it): its answer.
  if (last_ && op.root == last_root_ && bytes == last_bytes_ && op.fork == last_fork_ &&
      op.peers == last_peers_)
    return *last_;
  last_root_ = op.root;
  last_bytes_ = bytes;
  last_fork_ = op.fork;
  last_peers_.assign(op.peers.begin(), op.peers.end());
  last_ = &find(op, bytes);
  return *last_;
}

const TreeShapes::Shape& TreeShapes::find(const Op& op, std::int64_t bytes) {
  // The key: the bytes and fork, then per member (the root, then the receivers) its host and NIC
  // numbered in order of first appearance.
  ++stamp_;
  std::int32_t hosts = 0, nics = 0;
  auto label = [&](std::vector<std::pair<std::uint64_t, std::int32_t>>& labels, std::size_t id,
                   std::int32_t& next) {
    if (labels.size() <= id) labels.resize(id + 1, {0, 0});
    auto& l = labels[id];
    if (l.first != stamp_) l = {stamp_, next++};
    return static_cast<std::int64_t>(l.second);
  };
  key_.clear();
  key_.push_back(bytes);
  key_.push_back(op.fork);
  auto member = [&](int d) {
    const std::int64_t h = label(host_label_, static_cast<std::size_t>(s_->host(d)), hosts);
    key_.push_back(h << 32 | label(nic_label_, s_->nic(d), nics));
  };
  member(op.root);
  for (int p : op.peers) member(p);
  if (const auto it = shapes_.find(key_); it != shapes_.end()) return it->second;
  load(op, bytes);
  const std::int32_t group = op.peers.size() < 4 ? 0 : tree_.best(op.fork);
  if (kept_ + key_.size() > (std::size_t{1} << 20)) {
    shapes_.clear();  // (last_ is set again by shape() from what this returns)
    kept_ = 0;
  }
  kept_ += key_.size();
  return shapes_.emplace(key_, Shape{group, tree_.time(group, op.fork)}).first->second;
}

std::int32_t TreeShapes::best(const Op& op, std::int64_t bytes) {
  return op.peers.size() < 4 ? 0 : shape(op, bytes).group;  // (MulticastTree::best)
}

OpTime TreeShapes::time(const Op& op, std::int64_t bytes) {
  const Shape& sh = shape(op, bytes);
  if (sh.group == op.group) return sh.time;
  load(op, bytes);
  return tree_.time(op.group, op.fork);
}

void TreeShapes::load(const Op& op, std::int64_t bytes) {
  tree_.reset(s_->topology(), bytes, s_->chunk());
  tree_.add(s_->host(op.root), s_->nic(op.root));
  for (int p : op.peers) tree_.add(s_->host(p), s_->nic(p));
}

}  // namespace meshcast::detail
