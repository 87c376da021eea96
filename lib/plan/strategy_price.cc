#include "lib/plan/strategy_price.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <unordered_map>
#include <vector>

#include "lib/algebra/holder_set.h"
#include "lib/plan/multicast_tree.h"
#include "lib/plan/task_ops.h"
#include "meshcast/plan_size.h"

namespace meshcast::detail {
namespace {

// Links::analytic_seconds fed op by op, or with a link's summed bytes, instead of from a plan:
// per phase the busiest link's seconds plus the longest latency, or the slowest op alone.
class PhaseModel {
 public:
  // A device's links (indices into `links`), looked up once: Links finds a device by binary
  // search, which dominated pricing when done per hop.
  // With each link's seconds per byte: a division per hop was a fifth of pricing a broadcast.
  struct Device {
    std::size_t send, recv, out, in;
    int host;
    double send_s, recv_s, out_s, in_s;
  };

  PhaseModel(const Links& links, const LinkTimeline& s, std::int64_t chunk)
      : links_(links), topology_(s.topology()), s_(s), chunk_(chunk) {
    for (int d : s.devices()) {
      const std::size_t send = links.send(d), recv = links.recv(d), out = links.out(d),
                        in = links.in(d);
      devices_.push_back({send, recv, out, in, links.host(d), 1 / links.bandwidth(send),
                          1 / links.bandwidth(recv), 1 / links.bandwidth(out),
                          1 / links.bandwidth(in)});
    }
  }
  const Device& device(int id) const { return devices_[s_.slot(id)]; }

  // An op carrying `bytes` (its box is not read): its flows and its time, as analytic_seconds.
  void op(const Op& op, std::int64_t bytes) {
    if (op.kind == OpKind::Multicast) {
      multicast(op, bytes);
      return;
    }
    flows_.clear();
    const OpTime t = links_.flows(op, bytes, chunk_, flows_);
    Phase& ph = phase(op.phase);
    double longest = 0;  // a reduce's occupancy: its busiest link's share of it
    for (const Links::Flow& f : flows_)
      for (std::size_t k = 0; k < f.links.size(); ++k) {
        const double v = f.seconds(k, links_);
        ph.add(f.links[k], v);
        longest = std::max(longest, v);
      }
    time(op.phase, t.latency, t.latency + (op.kind == OpKind::Reduce ? longest : t.occupancy));
  }
  // Links::flows of a multicast (a chain root -> peers[0] -> ..., or a tree of chains: each
  // hop's receive port, its sender's port at send_weight, both hosts' NICs between hosts) with
  // the devices' links at hand; its time: chain_time, or MulticastTree's along the deepest path.
  void multicast(const Op& op, std::int64_t bytes) {
    Phase& ph = phase(op.phase);
    if (bytes != weighed_.bytes) {  // a task's transfers mostly carry the same bytes
      const std::int64_t m = messages(bytes, chunk_);
      weighed_ = {
          bytes, {send_weight(bytes, m, false, topology_), send_weight(bytes, m, true, topology_)}};
    }
    const double b = static_cast<double>(bytes);
    const double* weight = weighed_.weight;
    const Device* root = &device(op.root);
    const Device* prev = root;
    const auto n = static_cast<std::int64_t>(op.peers.size());
    int net = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      const Device& to = device(op.peers[static_cast<std::size_t>(k)]);
      if (op.group != 0) {
        const std::int64_t from = multicast_parent(k, n, op.group);
        prev = from < 0 ? root : &device(op.peers[static_cast<std::size_t>(from)]);
      }
      const bool remote = prev->host != to.host;
      ph.add(to.recv, b * to.recv_s);
      ph.add(prev->send, b * weight[remote] * prev->send_s);
      if (remote) {
        ph.add(prev->out, b * prev->out_s);
        ph.add(to.in, b * to.in_s);
      }
      net += remote;
      prev = &to;
    }
    if (op.group != 0) {
      const OpTime t = trees_->time(op, bytes);
      time(op.phase, t.latency, t.total());
      return;
    }
    const int intra = static_cast<int>(op.peers.size()) - net;
    if (bytes != chained_.bytes || net != chained_.net || intra != chained_.intra)
      chained_ = {bytes, net, intra, chain_time(bytes, net, intra, topology_, chunk_)};
    time(op.phase, chained_.time.latency, chained_.time.total());
  }
  // `bytes` more over a link that carries them at its bandwidth (weight 1).
  void load(int p, std::size_t link, std::int64_t bytes) {
    if (bytes != 0) phase(p).add(link, static_cast<double>(bytes) / links_.bandwidth(link));
  }
  // `bytes` in `messages` messages more from a sender's port: send_weight is linear in both, so
  // the sum over many flows is one call.
  void send(int p, std::size_t link, std::int64_t bytes, std::int64_t messages, bool remote) {
    if (bytes != 0)
      phase(p).add(link, static_cast<double>(bytes) *
                             send_weight(bytes, messages, remote, topology_) /
                             links_.bandwidth(link));
  }
  // Where a multicast's tree (op.group != 0) is timed: the walk's TaskOps' shapes, which just
  // chose each op's tree and so answer at once. Only a broadcast's ops are trees (sendrecv's
  // have one peer, allgather's forwarding is priced as chains in closed form).
  void share_trees(TreeShapes* t) { trees_ = t; }
  void time(int p, double latency, double alone) {
    Phase& ph = phase(p);
    ph.latency = std::max(ph.latency, latency);
    ph.alone = std::max(ph.alone, alone);
  }
  // The price of the ops fed so far, O(phases): it only grows as ops are added, so a strategy
  // whose partial price reaches another's whole price cannot be the cheaper.
  double seconds() const {
    double total = 0;
    for (const Phase& ph : phases_) total += std::max(ph.busiest + ph.latency, ph.alone);
    return total;
  }

 private:
  struct Phase {
    std::vector<double> load;  // seconds per link
    double busiest = 0;        // the greatest of load (loads only grow)
    double latency = 0, alone = 0;
    void add(std::size_t link, double seconds) {
      double& l = load[link];
      l += seconds;
      busiest = std::max(busiest, l);
    }
  };
  Phase& phase(int p) {
    while (phases_.size() <= static_cast<std::size_t>(p))
      phases_.push_back({std::vector<double>(links_.size(), 0.0)});
    return phases_[static_cast<std::size_t>(p)];
  }

  const Links& links_;
  const Topology& topology_;
  const LinkTimeline& s_;
  std::int64_t chunk_;
  std::vector<Device> devices_;  // per device slot
  std::vector<Phase> phases_;
  std::vector<Links::Flow> flows_;
  TreeShapes* trees_ = nullptr;  // share_trees()
  // The last transfer's port weights (inside a host, between hosts) and chain time: a task's
  // transfers mostly repeat them (sendrecv's, one per receiver).
  struct {
    std::int64_t bytes = -1;
    double weight[2] = {0, 0};
  } weighed_;
  struct {
    std::int64_t bytes = -1;
    int net = 0, intra = 0;
    OpTime time;
  } chained_;
};

// The forwarding phase of an all-gather among r >= 2 receivers, in closed form: receiver j
// forwards its slice (s_j bytes, m_j messages) along a chain through the other r - 1 receivers
// in chain_order (the root's host first by id, then the other hosts ascending, each by rail
// from the root's NIC, then id). The r chains' r^2 hops are summed per link from per-host and
// per-NIC totals: O(r log r + hosts x nics^2), not O(r^2).
class AllGatherForward {
 public:
  AllGatherForward(const LinkTimeline& s, std::int64_t chunk)
      : s_(s), chunk_(chunk), nics_(s.topology().nics_per_host()) {}

  // receivers[j] forwards bytes[j] (0: an empty slice, no chain) in phase q, `times` times
  // over (the tasks of one class: every load is linear in the bytes and messages carried).
  void add(PhaseModel& m, const std::vector<int>& receivers, const std::vector<std::int64_t>& bytes,
           int q, std::int64_t times = 1) {
    const std::size_t r = receivers.size();
    rs_.clear();
    std::int64_t total = 0, msgs = 0;
    for (std::size_t j = 0; j < r; ++j) {
      const int d = receivers[j];
      const std::int64_t b = bytes[j], n = b > 0 ? messages(b, chunk_) : 0;
      const PhaseModel::Device& dev = m.device(d);
      rs_.push_back({d, dev.host, static_cast<int>(s_.nic(d) % nics_), &dev, b, times * b,
                     times * n, 0, 0, 0, 0});
      total += times * b;
      msgs += times * n;
    }
    // Sorted by (host, id): hosts are runs. Per host and NIC value: the least and greatest
    // receiver id, and the bytes and messages of the chains rooted there.
    const auto by_host = [](const Recv& a, const Recv& b) {
      return a.host != b.host ? a.host < b.host : a.id < b.id;
    };
    if (!std::is_sorted(rs_.begin(), rs_.end(), by_host))  // a mesh's order mostly is
      std::sort(rs_.begin(), rs_.end(), by_host);
    // hosts_[0, H): this call's hosts (the vectors are kept from call to call: one allocation
    // per host and task was a fifth of pricing an allgather).
    std::size_t H = 0;
    const auto nics = static_cast<std::size_t>(nics_);
    for (std::size_t i = 0; i < rs_.size(); ++i) {
      if (i == 0 || rs_[i].host != rs_[i - 1].host) {
        if (hosts_.size() == H) hosts_.push_back({0, 0, std::vector<Nic>(nics)});
        Host& fresh = hosts_[H++];
        fresh.begin = i;
        std::fill(fresh.nic.begin(), fresh.nic.end(), Nic{});
      }
      Host& h = hosts_[H - 1];
      h.end = i + 1;
      Nic& n = h.nic[static_cast<std::size_t>(rs_[i].nic)];
      if (n.least < 0) n.least = rs_[i].id;
      n.greatest = rs_[i].id;  // ids ascend within a host's run
      n.bytes += rs_[i].bytes;
      n.msgs += rs_[i].msgs;
    }
    std::vector<Nic>& t = totals_;  // per NIC value over all hosts (only bytes and msgs used)
    t.assign(nics, Nic{});
    for (std::size_t hi = 0; hi < H; ++hi)
      for (std::size_t k = 0; k < nics; ++k) {
        t[k].bytes += hosts_[hi].nic[k].bytes;
        t[k].msgs += hosts_[hi].nic[k].msgs;
      }
    std::int64_t timed = -1;  // the slice size whose chain time is `time` (at most two sizes)
    OpTime time;
    for (std::size_t hi = 0; hi < H; ++hi) {
      const Host& h = hosts_[hi];
      for (std::size_t i = h.begin; i < h.end; ++i) {
        const Recv& x = rs_[i];
        if (x.slice == 0) continue;
        // Every chain enters each other receiving host once: H - 1 hops between hosts.
        if (x.slice != timed) {
          time = chain_time(x.slice, static_cast<int>(H) - 1, static_cast<int>(r - H),
                            s_.topology(), chunk_);
          timed = x.slice;
        }
        m.time(q, time.latency, time.total());
        // The root's block (the root, then its host's other receivers by id) ends at its
        // host's greatest id other than the root (the root itself if alone on its host).
        const std::size_t exit = h.end - 1 != i ? h.end - 1 : (i > h.begin ? i - 1 : i);
        if (H == 1) {
          end(exit, x);
          continue;
        }
        leave(m, q, exit, x.bytes, x.msgs);
        const Host& last = hosts_[hi == H - 1 ? H - 2 : H - 1];  // the greatest other host
        end(find(last, exit_nic(last, x.nic), true), x);
      }
    }
    if (H > 1) {
      // The other hosts' blocks: a chain rooted on another host enters host h at its entry
      // receiver and, unless h is the chain's last host (the greatest other than the root's),
      // leaves from its exit receiver.
      for (std::size_t hi = 0; hi < H; ++hi) {
        const Host& h = hosts_[hi];
        for (std::size_t k = 0; k < nics; ++k) {
          const std::int64_t in_bytes = t[k].bytes - h.nic[k].bytes;
          if (in_bytes == 0) continue;
          const auto root_nic = static_cast<int>(k);
          m.load(q, rs_[find(h, entry_nic(h, root_nic), false)].dev->in, in_bytes);
          if (hi == H - 1) continue;  // the greatest host is last for every chain entering it
          std::int64_t b = in_bytes, n = t[k].msgs - h.nic[k].msgs;
          if (hi == H - 2) {  // last for the chains rooted on the greatest host
            b -= hosts_[H - 1].nic[k].bytes;
            n -= hosts_[H - 1].nic[k].msgs;
          }
          if (b != 0) leave(m, q, find(h, exit_nic(h, root_nic), true), b, n);
        }
      }
    }
    // Receive ports: every slice but their own. Send ports: every slice less those of the
    // chains they end, the hops that leave their host at the network's overhead.
    for (const Recv& x : rs_) {
      const PhaseModel::Device& dev = *x.dev;
      m.load(q, dev.recv, total - x.bytes);
      const std::int64_t b = total - x.end_bytes, n = msgs - x.end_msgs;
      m.send(q, dev.send, b - x.out_bytes, n - x.out_msgs, false);
      m.send(q, dev.send, x.out_bytes, x.out_msgs, true);
    }
  }

 private:
  struct Recv {
    int id, host, nic;
    const PhaseModel::Device* dev;     // its links
    std::int64_t slice;                // its slice's bytes
    std::int64_t bytes, msgs;          // its slices' (times over)
    std::int64_t end_bytes, end_msgs;  // of the chains it ends
    std::int64_t out_bytes, out_msgs;  // of the chains it forwards to another host
  };
  struct Nic {
    int least = -1, greatest = -1;     // receiver ids on this NIC of the host
    std::int64_t bytes = 0, msgs = 0;  // of the chains rooted on this NIC of the host
  };
  struct Host {
    std::size_t begin, end;  // run in rs_
    std::vector<Nic> nic;
  };

  void end(std::size_t i, const Recv& chain) {
    rs_[i].end_bytes += chain.bytes;
    rs_[i].end_msgs += chain.msgs;
  }
  void leave(PhaseModel& m, int q, std::size_t i, std::int64_t bytes, std::int64_t msgs) {
    rs_[i].out_bytes += bytes;
    rs_[i].out_msgs += msgs;
    m.load(q, rs_[i].dev->out, bytes);
  }
  // A chain from a root on NIC `root_nic` takes another host's receivers by rail (their NIC's
  // distance after the root's), then id: it enters at the least rail present, leaves at the
  // greatest.
  int entry_nic(const Host& h, int root_nic) const {
    for (int t = 0; t < nics_; ++t)
      if (h.nic[static_cast<std::size_t>((root_nic + t) % nics_)].least >= 0)
        return (root_nic + t) % nics_;
    return 0;
  }
  int exit_nic(const Host& h, int root_nic) const {
    for (int t = nics_ - 1; t >= 0; --t)
      if (h.nic[static_cast<std::size_t>((root_nic + t) % nics_)].least >= 0)
        return (root_nic + t) % nics_;
    return 0;
  }
  // The index in rs_ of host h's least (or greatest) receiver on NIC k.
  std::size_t find(const Host& h, int k, bool greatest) const {
    const Nic& n = h.nic[static_cast<std::size_t>(k)];
    const int id = greatest ? n.greatest : n.least;
    const auto it = std::lower_bound(rs_.begin() + static_cast<std::ptrdiff_t>(h.begin),
                                     rs_.begin() + static_cast<std::ptrdiff_t>(h.end), id,
                                     [](const Recv& a, int v) { return a.id < v; });
    return static_cast<std::size_t>(it - rs_.begin());
  }

  const LinkTimeline& s_;
  std::int64_t chunk_;
  int nics_;
  std::vector<Recv> rs_;
  std::vector<Host> hosts_;
  std::vector<Nic> totals_;
};

// Allgather's forwarding, batched: its loads depend on a task's receivers and slices alone (not
// on its senders), and a tensor's tasks repeat a few of those (every task of one target tile has
// the same receivers), so each class is added once, times its tasks. Bounded: past about a
// million receivers held, flushed and forgotten.
class ForwardClasses {
 public:
  ForwardClasses(const LinkTimeline& s, std::int64_t chunk) : forward_(s, chunk) {}
  void add(PhaseModel& m, const std::vector<int>& receivers, const std::vector<std::int64_t>& bytes,
           int q) {
    std::uint64_t h = 0xcbf29ce484222325ull ^ static_cast<std::uint64_t>(q);
    for (int d : receivers) h = (h ^ static_cast<std::uint64_t>(d)) * 0x100000001b3ull;
    for (std::int64_t b : bytes) h = (h ^ static_cast<std::uint64_t>(b)) * 0x100000001b3ull;
    const auto [it, fresh] = index_.try_emplace(h, classes_.size());
    if (!fresh) {
      Class& c = classes_[it->second];
      if (c.q == q && c.receivers == receivers && c.bytes == bytes) {
        if (c.times++ == 0) pending_.push_back(it->second);
        return;
      }
      forward_.add(m, receivers, bytes, q);  // another class of the same hash: not kept
      return;
    }
    held_ += receivers.size();
    pending_.push_back(classes_.size());
    classes_.push_back({receivers, bytes, q, 1});
    if (held_ > (std::size_t{1} << 20)) flush(m, true);
  }
  // Adds the pending classes to `m` (and, if `forget`, drops them all).
  void flush(PhaseModel& m, bool forget = false) {
    for (std::size_t i : pending_) {
      Class& c = classes_[i];
      forward_.add(m, c.receivers, c.bytes, c.q, c.times);
      c.times = 0;
    }
    pending_.clear();
    if (!forget) return;
    classes_.clear();
    index_.clear();
    held_ = 0;
  }

 private:
  struct Class {
    std::vector<int> receivers;
    std::vector<std::int64_t> bytes;
    int q;
    std::int64_t times;  // tasks since the last flush
  };
  AllGatherForward forward_;
  std::vector<Class> classes_;
  std::unordered_map<std::uint64_t, std::size_t> index_;  // by hash
  std::vector<std::size_t> pending_;                      // classes with times > 0
  std::size_t held_ = 0;
};

}  // namespace

namespace {

// Prices `walk`'s ops (Broadcast or SendRecv) task by task into `plain` (that strategy's model)
// and, for a SendRecv walk, allgather's into `gathered`: its senders, receivers and phases are
// sendrecv's, one transfer per receiver by the same rule and key, so its scatter is sendrecv's
// ops carrying slices, and its forwarding, which needs no sender, is priced in closed form by
// class. Either model may be null. A model whose price reaches `cap` is no longer fed (its
// price is then only known to be >= cap). Allgather takes two walks: the first prices sendrecv
// and the forwarding, choosing senders only while sendrecv is priced; the second its scatter,
// skipped if the forwarding alone reached the cap (where a broadcast is cheaper, the
// forwarding's many hops mostly do).
void walk_tasks(const TaskGrid& grid, const LinkTimeline& s, Strategy walk, Balance rule,
                std::int64_t chunk, PhaseModel* plain, PhaseModel* gathered, bool* fans_out,
                double cap = std::numeric_limits<double>::infinity()) {
  // A task's ops arrive one at a time (TaskOps reuses one Op for them): those `plain` prices as
  // they come; for allgather its transfers' receivers, senders and box are noted.
  struct Walk final : OpSink {
    std::int64_t elem = 0;
    PhaseModel* plain = nullptr;
    PhaseModel* local = nullptr;  // takes the ops that are not transfers
    std::vector<int> receivers, roots;
    int phase = 0;
    Box box;
    void operator()(const Op& op) override {
      if (plain) plain->op(op, op.box.volume() * elem);
      if (op.kind != OpKind::Multicast) {
        if (local) local->op(op, op.box.volume() * elem);
        return;
      }
      if (receivers.empty()) box = op.box;  // every transfer of the task carries the task's box
      receivers.push_back(op.peers.front());
      roots.push_back(op.root);
      phase = op.phase;
    }
    // Under cap: a model at or past it is dropped.
    static void check(PhaseModel*& m, double cap) {
      if (m && m->seconds() >= cap) m = nullptr;
    }
  } w;
  w.elem = static_cast<std::int64_t>(dtype_size(grid.src().dtype()));
  w.plain = plain;
  std::vector<std::int64_t> bytes;  // the task's slices (allgather_split)
  auto slices = [&] {
    const AllGatherSplit split = allgather_split(w.box, w.receivers.size());
    const std::int64_t across = w.box.volume() / std::max<std::int64_t>(1, w.box[split.dim].size());
    split.sizes(bytes);
    for (std::int64_t& b : bytes) b *= across * w.elem;
  };
  TaskOps first(grid, s, walk, rule);
  ForwardClasses forward(s, chunk);
  if (plain) plain->share_trees(&first.trees());
  for (std::int64_t i = 0; i < grid.size() && (w.plain || gathered); ++i) {
    Walk::check(w.plain, cap);
    if (!w.plain) first.choose_senders(false);  // the forwarding needs none
    w.receivers.clear();
    w.roots.clear();
    first.task(i, -1, w);  // one task's ops at a time: O(its receivers)
    if (!gathered || w.receivers.size() < 2) continue;
    slices();
    forward.add(*gathered, w.receivers, bytes, w.phase + 1);
  }
  if (plain) plain->share_trees(nullptr);
  if (fans_out) *fans_out = first.fans_out();
  if (!gathered) return;
  forward.flush(*gathered);
  // The scatter (and the tasks' local ops), with senders.
  w.plain = nullptr;
  w.local = gathered;
  TaskOps second(grid, s, walk, rule);
  Op scatter;  // a transfer of the scatter: sendrecv's, carrying a slice
  scatter.kind = OpKind::Multicast;
  scatter.peers.resize(1);
  for (std::int64_t i = 0; i < grid.size(); ++i) {
    Walk::check(w.local, cap);
    if (!w.local) return;
    w.receivers.clear();
    w.roots.clear();
    second.task(i, -1, w);
    if (w.receivers.empty()) continue;
    scatter.phase = w.phase;
    scatter.box = w.box;
    if (w.receivers.size() == 1) {  // no forwarding: one transfer, as broadcast
      scatter.root = w.roots[0];
      scatter.peers[0] = w.receivers[0];
      gathered->op(scatter, w.box.volume() * w.elem);
      continue;
    }
    slices();  // receiver j's slice comes from the sender the sendrecv op to it has
    for (std::size_t j = 0; j < w.receivers.size(); ++j) {
      if (bytes[j] == 0) continue;
      scatter.root = w.roots[j];
      scatter.peers[0] = w.receivers[j];
      gathered->op(scatter, bytes[j]);
    }
  }
}

}  // namespace

double strategy_price(const TaskGrid& grid, const LinkTimeline& s, const Links& links,
                      Strategy strategy, Balance rule, std::int64_t chunk, bool* fans_out) {
  PhaseModel m(links, s, chunk);
  if (strategy == Strategy::AllGather)
    walk_tasks(grid, s, Strategy::SendRecv, rule, chunk, nullptr, &m, fans_out);
  else
    walk_tasks(grid, s, strategy, rule, chunk, &m, nullptr, fans_out);
  return m.seconds();
}

AutoChoice auto_strategy(const TaskGrid& grid, const LinkTimeline& s, const PlanOptions& options) {
  const Links links(s.topology(), s.devices());
  const Balance rule = options.balance == Balance::None ? Balance::None : Balance::Local;
  std::optional<AutoChoice> best;
  double best_price = 0;
  // One receiver per tile: no box fans out, without pricing all the tasks (a device planning
  // its own part alone must not pay for the whole plan's tasks).
  const bool single = holders_per_tile(grid.dst()) == 1;
  // Only a destination tile with replicas can fan out; else every strategy builds the same ops
  // and the first that fits is taken unpriced (a dense reshard has millions of boxes).
  HolderSet targets(grid.dst());
  targets.select(std::vector<std::int64_t>(grid.dst().ndim(), 0), 0);
  const bool may_fan_out = targets.size() > 1;
  struct Scatter {
    double sendrecv, allgather;
    bool fans_out;
  };
  std::optional<Scatter> scatter;
  for (Strategy st : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv}) {
    AutoChoice c{st, options.balance};
    auto fits = [&] {
      return within_limits(estimate_plan_size(grid.src(), grid.dst(), st, c.balance),
                           options.max_plan_bytes);
    };
    if (!fits() && (c.balance = Balance::Local, !fits())) continue;
    if (!may_fan_out) return c;
    if (single) return c;
    bool fans_out = true;
    double price = 0;
    if (st == Strategy::Broadcast) {
      price = strategy_price(grid, s, links, st, rule, options.chunk_bytes, &fans_out);
    } else {
      if (!scatter) {  // both from one walk of sendrecv's ops
        // Priced only until they reach the best price so far: then neither can win.
        PhaseModel sendrecv(links, s, options.chunk_bytes), allgather = sendrecv;
        bool fan = true;
        walk_tasks(grid, s, Strategy::SendRecv, rule, options.chunk_bytes, &sendrecv, &allgather,
                   &fan, best ? best_price * (1 - 1e-9) : std::numeric_limits<double>::infinity());
        // A walk cut short may not have met a box that fans out; a priced candidate (best) did.
        scatter = Scatter{sendrecv.seconds(), allgather.seconds(), fan || best.has_value()};
      }
      price = st == Strategy::SendRecv ? scatter->sendrecv : scatter->allgather;
      fans_out = scatter->fans_out;
    }
    if (!fans_out) return c;
    if (!best || price < best_price * (1 - 1e-9)) {
      best = c;
      best_price = price;
    }
  }
  // plan() checked that the smallest estimate fits, so there was a candidate.
  return best.value_or(AutoChoice{Strategy::Broadcast, Balance::Local});
}

}  // namespace meshcast::detail
