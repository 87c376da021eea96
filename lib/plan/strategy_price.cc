#include "lib/plan/strategy_price.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "lib/algebra/holder_set.h"
#include "lib/plan/multicast_tree.h"
#include "lib/plan/task_ops.h"
#include "lib/support/word_hash.h"
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
  // `times` over (a class of tasks), the root's side of its hop left out unless `root` (the
  // class's roots differ: see sends()).
  void multicast(const Op& op, std::int64_t bytes, double times = 1, bool root = true) {
    Phase& ph = phase(op.phase);
    if (bytes != weighed_.bytes) {  // a task's transfers mostly carry the same bytes
      const std::int64_t m = messages(bytes, chunk_);
      weighed_ = {
          bytes, {send_weight(bytes, m, false, topology_), send_weight(bytes, m, true, topology_)}};
    }
    const double b = static_cast<double>(bytes) * times;
    const double* weight = weighed_.weight;
    const Device* from_root = &device(op.root);
    const Device* prev = from_root;
    const auto n = static_cast<std::int64_t>(op.peers.size());
    int net = 0;
    const bool tree = op.group != 0 || op.fork != 0;
    for (std::int64_t k = 0; k < n; ++k) {
      const Device& to = device(op.peers[static_cast<std::size_t>(k)]);
      if (tree) {
        const std::int64_t from = multicast_parent(k, n, op.group, op.fork);
        prev = from < 0 ? from_root : &device(op.peers[static_cast<std::size_t>(from)]);
      }
      const bool remote = prev->host != to.host;
      const bool sender = root || prev != from_root;
      ph.add(to.recv, b * to.recv_s);
      if (sender) ph.add(prev->send, b * weight[remote] * prev->send_s);
      if (remote) {
        if (sender) ph.add(prev->out, b * prev->out_s);
        ph.add(to.in, b * to.in_s);
      }
      net += remote;
      prev = &to;
    }
    if (tree) {
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
  // The sender's side of hops from `from`, `bytes` in `messages` messages in all: its send
  // port, and its NIC if they leave its host.
  void sends(int p, int from, std::int64_t bytes, std::int64_t messages, bool remote) {
    const Device& d = device(from);
    send(p, d.send, bytes, messages, remote);
    if (remote) load(p, d.out, bytes);
  }
  // The receiver's side of hops into `to`, `bytes` in all: its receive port, and its NIC if
  // they come from another host.
  void receives(int p, int to, double bytes, bool remote) {
    const Device& d = device(to);
    Phase& ph = phase(p);
    ph.add(d.recv, bytes * d.recv_s);
    if (remote) ph.add(d.in, bytes * d.in_s);
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
  // Link loads added so far: what pricing cost, counted alike on every device.
  std::int64_t work() const {
    std::int64_t n = 0;
    for (const Phase& ph : phases_) n += ph.adds;
    return n;
  }

 private:
  struct Phase {
    std::vector<double> load;  // seconds per link
    double busiest = 0;        // the greatest of load (loads only grow)
    double latency = 0, alone = 0;
    std::int64_t adds = 0;
    void add(std::size_t link, double seconds) {
      double& l = load[link];
      l += seconds;
      busiest = std::max(busiest, l);
      ++adds;
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

// What a walk of pricing has cost after `tasks` tasks: its models' link loads, and ten loads a
// task (its tiles and holders selected, its class found: AutoChoice::work).
std::int64_t walk_work(std::int64_t tasks, std::initializer_list<const PhaseModel*> models) {
  std::int64_t n = 10 * tasks;
  for (const PhaseModel* m : models)
    if (m) n += m->work();
  return n;
}
constexpr std::int64_t kNoCap = std::numeric_limits<std::int64_t>::max();

// Allgather's forwarding, batched: its loads depend on a task's receivers and slices alone (not
// on its senders), and a tensor's tasks repeat a few of those (every task of one target tile has
// the same receivers), so each class is added once, times its tasks. Bounded: past about a
// million receivers held, flushed and forgotten.
class ForwardClasses {
 public:
  ForwardClasses(const LinkTimeline& s, std::int64_t chunk) : forward_(s, chunk) {}
  void add(PhaseModel& m, const std::vector<int>& receivers, const std::vector<std::int64_t>& bytes,
           int q) {
    detail::WordHash w;
    w.add(q);
    for (int d : receivers) w.add(d);
    for (std::int64_t b : bytes) w.add(b);
    const auto [it, fresh] = index_.try_emplace(w.value(), classes_.size());
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

// Tasks priced by class. Where the source is complete and each task has one sender (or the two
// meshes' hosts are disjoint), a task's ops are fixed by its receivers (its destination tile's
// devices less those that hold the box: a group), its bytes and where its sender is: a
// broadcast's chain by the root's host (if a receiver is there), NIC and rotation; a transfer by
// whether it leaves the sender's host. Only the sender's side of the sender's hops differs
// within a class: it is summed per device (a send port's load is linear in bytes and
// messages), and the rest added once per class, times its tasks. A tensor of 262,144 tasks to
// 64 receivers each so costs 262,144 sends and a few thousand classes, not 16.7 million hops.
class ClassWalk {
 public:
  ClassWalk(const TaskGrid& grid, const LinkTimeline& s, Balance rule, std::int64_t chunk,
            bool fork = true)
      : grid_(grid),
        s_(s),
        chunk_(chunk),
        elem_(static_cast<std::int64_t>(dtype_size(grid.src().dtype()))),
        nics_(static_cast<std::size_t>(s.topology().nics_per_host())),
        one_sender_(rule == Balance::None || holders_per_tile(grid.src()) == 1),
        ops_(grid, s, Strategy::Broadcast, rule, 0, fork),
        forward_(s, chunk) {
    std::size_t tiles = 1;
    for (std::size_t d = 0; d < grid.dst().ndim(); ++d) {
      splits_.push_back(grid.dst().splits(d));
      tiles *= static_cast<std::size_t>(splits_.back());
    }
    tile_at_.assign(tiles, kNone);
    copy_.kind = OpKind::Copy;
  }

  // Whether the tasks can be priced by class (several holders on hosts shared with receivers
  // choose a sender per receiver by host), and are worth it: with fewer than two tasks per
  // destination tile, classes repeat too little to pay for keeping them (bench/planner's
  // S0R>S1R at 65,536, one task per tile, took 1.5x longer by class).
  bool applies() const {
    return ops_.complete() && (one_sender_ || !ops_.shared_hosts()) &&
           grid_.size() >= 2 * static_cast<std::int64_t>(tile_at_.size());
  }

  // The three strategies' ops, each into its model if not null (as walk_tasks, without a price
  // cap), in one walk: most of a task's price by class is finding its class. Adds its cost
  // (walk_work) to `work` if given. False, the models incomplete, where that and the receivers
  // its classes hold passed `work_cap`.
  bool run(PhaseModel* broadcast, PhaseModel* sendrecv, PhaseModel* allgather, bool* fans_out,
           std::int64_t* work = nullptr, std::int64_t work_cap = kNoCap) {
    PhaseModel* models[3] = {broadcast, sendrecv, allgather};
    for (std::size_t k = 0; k < 3; ++k)
      if (models[k]) sent_[k].assign(s_.devices().size(), Sent{});
    if (broadcast) broadcast->share_trees(&ops_.trees());
    // What the walk cost after task i: the receivers its classes hold too (listed, not added).
    const auto spent = [&](std::int64_t i) {
      return walk_work(i, {broadcast, sendrecv, allgather}) + static_cast<std::int64_t>(held_);
    };
    for (std::int64_t i = 0; i < grid_.size(); ++i) {
      if (i % 256 == 255 && spent(i) > work_cap) {
        if (broadcast) broadcast->share_trees(nullptr);
        if (work) *work += spent(i);
        return false;
      }
      ops_.select(i);
      const Box box = grid_.box(i);
      const std::int64_t bytes = box.volume() * elem_;
      const std::size_t g = group(tile(), box, bytes, models);
      const std::size_t n = groups_[g].receivers.size();
      if (n == 0) continue;
      fans_out_ |= n > 1;
      // The broadcast's root, and the transfers' one sender (where there is one).
      const int root = ops_.sender(groups_[g].receivers[0], i);
      if (broadcast) this->broadcast(*broadcast, i, g, root, bytes);
      if (sendrecv || allgather) transfers(sendrecv, allgather, i, g, root, box);
      if (held_ > kHeld) flush(broadcast, sendrecv, allgather, true);
    }
    flush(broadcast, sendrecv, allgather, false);
    if (broadcast) broadcast->share_trees(nullptr);
    for (std::size_t k = 0; k < 3; ++k)
      for (std::size_t d = 0; d < sent_[k].size(); ++d)
        for (int remote : {0, 1})
          models[k]->sends(0, s_.devices()[d], sent_[k][d].bytes[remote],
                           sent_[k][d].messages[remote], remote != 0);
    if (fans_out) *fans_out = fans_out_;
    if (work) *work += walk_work(grid_.size(), {broadcast, sendrecv, allgather});
    return true;
  }

 private:
  static constexpr std::size_t kNone = ~std::size_t{0};
  // Entries (ints, mostly) held by tiles, groups and classes past which they are flushed and
  // forgotten: about 32 MB. A group of holders among its targets mostly has one task; at a
  // quarter of this, 4,096 such groups of 64 made a same-mesh move forget every class three times.
  static constexpr std::size_t kHeld = std::size_t{1} << 22;
  struct Tile {
    std::vector<int> targets;   // in mesh order
    std::size_t whole = kNone;  // its group of no holder among the targets
    std::size_t last = kNone;   // the group its last task with one fell in
  };
  // A tile's receivers for tasks whose holders among its targets are `held` (they copy).
  struct Group {
    std::vector<int> held;                            // ascending
    std::vector<int> receivers;                       // the other targets, in mesh order
    std::vector<std::pair<int, std::int64_t>> hosts;  // (host, receivers on it), by host
    // The least common multiple of the hosts' receiver counts (a broadcast chain's runs), which
    // rotate_chain's starts repeat with (0: too large to class a broadcast's tasks by).
    std::uint64_t period = 1;
    // Hints (Classes::count): its broadcasts' with the root off the receivers' hosts, by root
    // NIC and rotation (if few), and its transfers'.
    std::vector<std::size_t> broadcast;
    std::size_t transfers = 0;
  };
  // A class: its group and, per kind, what else fixes its ops.
  struct Key {
    std::size_t group;
    std::int64_t a, b, c, d, e;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      detail::WordHash w;
      w.add(k.group);
      for (std::int64_t v : {k.a, k.b, k.c, k.d, k.e}) w.add(v);
      return static_cast<std::size_t>(w.value());
    }
  };
  struct Class {
    Op op;                             // a broadcast's: its multicast
    std::vector<std::int64_t> slices;  // an all-gather's: its receivers' bytes
    // To receivers on the sender's host [0] and on others [1]: how many, and their slices'.
    std::int64_t receivers[2] = {0, 0};
    std::int64_t bytes[2] = {0, 0}, messages[2] = {0, 0}, largest[2] = {0, 0};
  };
  // Classes by key, with the pending ones (counted since the last flush). Keys and counts are
  // kept apart from the classes' ops: they are what each task touches.
  struct Classes {
    std::unordered_map<Key, std::size_t, KeyHash> index;
    std::vector<Key> keys;
    std::vector<double> times;  // tasks since the last flush
    std::vector<Class> all;
    std::vector<std::size_t> pending;
    // The class of `key`, counted once more, and whether it is new (then its fields are to be
    // filled). `hint`: where the caller keeps the index of a class its tasks mostly fall in
    // (checked by key, so it may be stale): a hash lookup per task was a quarter of the walk.
    std::pair<Class*, bool> count(const Key& key, std::size_t& hint) {
      bool fresh = false;
      if (hint >= keys.size() || !(keys[hint] == key)) {
        const auto it = index.try_emplace(key, keys.size());
        fresh = it.second;
        if (fresh) {
          keys.push_back(key);
          times.push_back(0);
          all.emplace_back();
        }
        hint = it.first->second;
      }
      if (times[hint]++ == 0) pending.push_back(hint);
      return {&all[hint], fresh};
    }
    void clear() {
      index.clear();
      keys.clear();
      times.clear();
      all.clear();
      pending.clear();
    }
  };

  // The selected task's tile.
  std::size_t tile() {
    std::size_t at = 0;  // its index among the destination's tiles (row-major by shard)
    const std::vector<std::int64_t>& shard = ops_.dst_shard();
    for (std::size_t d = 0; d < shard.size(); ++d)
      at = at * static_cast<std::size_t>(splits_[d]) + static_cast<std::size_t>(shard[d]);
    std::size_t& slot = tile_at_[at];
    if (slot < tiles_.size()) return slot;
    slot = tiles_.size();
    Tile t;
    const HolderSet& targets = ops_.targets();
    for (std::int64_t k = 0; k < targets.size(); ++k) t.targets.push_back(targets[k]);
    held_ += t.targets.size();
    tiles_.push_back(std::move(t));
    return slot;
  }

  // The selected task's group in tile t; its copies (targets that hold the box) priced.
  std::size_t group(std::size_t t, const Box& box, std::int64_t bytes, PhaseModel* const* models) {
    Tile& tile = tiles_[t];
    held_list_.clear();
    if (ops_.shared_hosts()) {  // else no target holds the box
      const HolderSet& holders = ops_.holders();
      const HolderSet& targets = ops_.targets();
      if (holders.size() <= targets.size()) {
        for (std::int64_t k = 0; k < holders.size(); ++k)
          if (targets.contains(holders[k])) held_list_.push_back(holders[k]);
      } else {
        for (int d : tile.targets)
          if (holders.contains(d)) held_list_.push_back(d);
      }
      std::sort(held_list_.begin(), held_list_.end());
      copy_.box = box;
      for (int d : held_list_) {
        copy_.root = d;
        for (std::size_t k = 0; k < 3; ++k)
          if (models[k]) models[k]->op(copy_, bytes);
      }
    }
    if (held_list_.empty()) {
      if (tile.whole == kNone) tile.whole = make_group(t);
      return tile.whole;
    }
    if (tile.last != kNone && groups_[tile.last].held == held_list_) return tile.last;
    const auto [it, fresh] = group_index_.try_emplace({t, held_list_}, groups_.size());
    if (fresh) make_group(t);
    return tile.last = it->second;
  }
  std::size_t make_group(std::size_t t) {
    Group g;
    g.held = held_list_;
    for (int d : tiles_[t].targets)
      if (!std::binary_search(g.held.begin(), g.held.end(), d)) g.receivers.push_back(d);
    std::vector<int> hosts;
    for (int d : g.receivers) hosts.push_back(s_.host(d));
    std::sort(hosts.begin(), hosts.end());
    for (std::size_t k = 0; k < hosts.size(); ++k)
      if (k == 0 || hosts[k] != hosts[k - 1])
        g.hosts.emplace_back(hosts[k], 1);
      else
        ++g.hosts.back().second;
    for (const auto& [host, length] : g.hosts) {
      g.period = std::lcm(g.period, static_cast<std::uint64_t>(length));
      if (g.period > (std::uint64_t{1} << 16)) {
        g.period = 0;
        break;
      }
    }
    // A table of hints for a tile's usual group where its tasks are more than the entries.
    if (const std::uint64_t n = nics_ * g.period * g.hosts.size();
        g.held.empty() && n <= 4096 &&
        n <= 2 * static_cast<std::uint64_t>(grid_.size()) / tile_at_.size())
      g.broadcast.assign(n, 0);
    held_ += g.held.size() + 2 * g.receivers.size() + g.broadcast.size();
    groups_.push_back(std::move(g));
    return groups_.size() - 1;
  }
  // The host of `sender` if some receiver of group g is there (then the chain starts there and
  // the transfers to it stay on the host), with their count; else -1 and 0.
  std::pair<std::int64_t, std::int64_t> near(const Group& g, int sender) const {
    const int h = s_.host(sender);
    const auto it = std::lower_bound(g.hosts.begin(), g.hosts.end(), std::pair{h, std::int64_t{0}});
    if (it == g.hosts.end() || it->first != h) return {-1, 0};
    return {h, it->second};
  }

  // Task i's broadcast from `root` to group g counted in its class (its hops but the root's),
  // and the root's side of its hop.
  void broadcast(PhaseModel& m, std::int64_t i, std::size_t g, int root, std::int64_t bytes) {
    Group& grp = groups_[g];
    if (grp.period == 0) {  // priced alone (its transfers, not its copies, priced already)
      struct Price final : OpSink {
        PhaseModel* m;
        std::int64_t bytes;
        void operator()(const Op& op) override {
          if (op.kind == OpKind::Multicast) m->op(op, bytes);
        }
      } price;
      price.m = &m;
      price.bytes = bytes;
      ops_.task(i, -1, price);
      return;
    }
    const auto [host, on_host] = near(grp, root);
    const std::int64_t key = ops_.rotation(i);
    const auto others = std::max<std::uint64_t>(1, grp.hosts.size() - (host >= 0 ? 1 : 0));
    const auto turn =
        key < 0 ? 0 : static_cast<std::int64_t>(static_cast<std::uint64_t>(key) % others);
    const auto mix = key < 0 ? 0 : static_cast<std::int64_t>(chain_mix(key) % grp.period);
    // The root's NIC orders each host's receivers (by rail from it): with one receiver per
    // host and none on the root's, it changes nothing (its NIC is no receiver's either).
    const bool one_per_host = grp.period == 1 && host < 0;
    const auto nic =
        static_cast<std::int64_t>(nics_ > 1 && !one_per_host ? s_.nic(root) % nics_ : 0);
    std::size_t none = 0;
    std::size_t& hint = grp.broadcast.empty() || host >= 0
                            ? none
                            : grp.broadcast[static_cast<std::size_t>(
                                  (nic * static_cast<std::int64_t>(grp.hosts.size()) + turn) *
                                      static_cast<std::int64_t>(grp.period) +
                                  mix)];
    const auto [c, fresh] = broadcasts_.count({g, bytes, nic, turn, mix, host}, hint);
    if (fresh) {
      struct Keep final : OpSink {
        Op* op;
        void operator()(const Op& o) override {
          if (o.kind == OpKind::Multicast) *op = o;
        }
      } keep;
      keep.op = &c->op;
      ops_.task(i, -1, keep);  // its copies, then one multicast
      held_ += c->op.peers.size();
    }
    // The root sends to the first receiver, and where its class's chain forks (the key fixes
    // whether: the root's host and the receivers') to another host as well.
    sent(0, root, bytes, messages_of(bytes), host < 0);
    if (c->op.fork != 0) sent(0, root, bytes, messages_of(bytes), true);
  }

  // Task i's transfers to group g (sendrecv's, and allgather's scatter and forwarding: one class
  // for both, by the group, its slices and where the sender is), counted in their class, and
  // their senders' side. `root`: the sender to its first receiver (the only one if one_sender_).
  void transfers(bool sendrecv, bool allgather, std::int64_t i, std::size_t g, int root,
                 const Box& box) {
    const std::vector<int>& to = groups_[g].receivers;
    const auto n = static_cast<std::int64_t>(to.size());
    const AllGatherSplit split = allgather_split(box, static_cast<std::size_t>(n));
    const std::int64_t across =
        box.volume() / std::max<std::int64_t>(1, box[split.dim].size()) * elem_;
    const std::int64_t bytes = split.range.size() * across, msgs = messages_of(bytes);
    const auto [host, on_host] = one_sender_ ? near(groups_[g], root) : std::pair{-1L, 0L};
    const auto [c, fresh] =
        transfers_.count({g, split.range.size(), across, host, 0, 0}, groups_[g].transfers);
    if (fresh) {
      split.sizes(c->slices);
      for (std::size_t j = 0; j < c->slices.size(); ++j) {
        std::int64_t& b = c->slices[j];
        b *= across;
        const bool remote = s_.host(to[j]) != host;
        ++c->receivers[remote];
        c->bytes[remote] += b;
        c->messages[remote] += b > 0 ? messages(b, chunk_) : 0;
        c->largest[remote] = std::max(c->largest[remote], b);
      }
      held_ += c->slices.size();
    }
    if (one_sender_) {
      if (sendrecv) {
        sent(1, root, (n - on_host) * bytes, (n - on_host) * msgs, true);
        sent(1, root, on_host * bytes, on_host * msgs, false);
      }
      if (allgather)
        for (int remote : {0, 1}) sent(2, root, c->bytes[remote], c->messages[remote], remote != 0);
      return;
    }
    // Several holders, hosts disjoint: receiver j's sender is holder (i + j) mod H, so each of
    // the first min(n, H) holders from there sends ceil((n - j) / H) of sendrecv's n transfers.
    const std::int64_t h = ops_.holders().size();
    if (sendrecv)
      for (std::int64_t j = 0; j < std::min(n, h); ++j) {
        const std::int64_t k = (n - j + h - 1) / h;
        sent(1, ops_.sender(to[static_cast<std::size_t>(j)], i + j), k * bytes, k * msgs, true);
      }
    if (allgather)
      for (std::size_t j = 0; j < to.size(); ++j)
        if (const std::int64_t b = c->slices[j]; b > 0)
          sent(2, ops_.sender(to[j], i + static_cast<std::int64_t>(j)), b, messages(b, chunk_),
               true);
  }

  // Sends of `bytes` in `messages` from `device` in model k (0 broadcast, 1 sendrecv,
  // 2 allgather), to its host or another: a send port's load is linear in both (send_weight),
  // so they are summed per device and added to the model once, at the end.
  void sent(std::size_t k, int device, std::int64_t bytes, std::int64_t messages, bool remote) {
    Sent& x = sent_[k][s_.slot(device)];
    x.bytes[remote] += bytes;
    x.messages[remote] += messages;
  }
  std::int64_t messages_of(std::int64_t bytes) {
    if (bytes != last_bytes_) last_bytes_ = bytes, last_messages_ = messages(bytes, chunk_);
    return last_messages_;
  }

  // Adds the pending classes (and, if `forget`, drops every class, group and tile).
  void flush(PhaseModel* broadcast, PhaseModel* sendrecv, PhaseModel* allgather, bool forget) {
    // All-gathers' forwardings: (a class, its group, tasks) by group and slices, in order.
    std::vector<std::tuple<const Class*, std::size_t, double>> forwards;
    std::unordered_map<Key, std::size_t, KeyHash> forward_at;
    for (std::size_t k : broadcasts_.pending)
      broadcast->multicast(broadcasts_.all[k].op, broadcasts_.keys[k].a, broadcasts_.times[k],
                           false);
    for (std::size_t k : transfers_.pending) {
      const Key& key = transfers_.keys[k];
      const double times = transfers_.times[k];
      const std::vector<int>& to = groups_[key.group].receivers;
      const Class& c = transfers_.all[k];
      const std::int64_t host = key.c;
      if (sendrecv) {
        const std::int64_t bytes = key.a * key.b;
        for (int d : to)
          sendrecv->receives(0, d, static_cast<double>(bytes) * times, s_.host(d) != host);
        for (int remote : {0, 1})
          if (c.receivers[remote] > 0) time(*sendrecv, bytes, remote != 0);
      }
      if (!allgather) continue;
      if (to.size() > 1) {  // the forwarding does not depend on the sender: summed over hosts
        const auto [it, fresh] =
            forward_at.try_emplace({key.group, key.a, key.b, 0, 0, 0}, forwards.size());
        if (fresh) forwards.emplace_back(&c, key.group, 0.0);
        std::get<2>(forwards[it->second]) += times;
      }
      for (std::size_t j = 0; j < to.size(); ++j)
        if (c.slices[j] != 0)
          allgather->receives(0, to[j], static_cast<double>(c.slices[j]) * times,
                              s_.host(to[j]) != host);
      for (int remote : {0, 1})
        if (c.largest[remote] > 0) time(*allgather, c.largest[remote], remote != 0);
    }
    for (const auto& [c, group, times] : forwards)
      forward_.add(*allgather, groups_[group].receivers, c->slices, 1,
                   static_cast<std::int64_t>(times));
    for (Classes* c : {&broadcasts_, &transfers_}) {
      for (std::size_t k : c->pending) c->times[k] = 0;
      c->pending.clear();
    }
    if (!forget) return;
    for (Classes* c : {&broadcasts_, &transfers_}) c->clear();
    tiles_.clear();
    groups_.clear();
    group_index_.clear();
    std::fill(tile_at_.begin(), tile_at_.end(), kNone);
    held_ = 0;
  }
  // A transfer's time (as PhaseModel::multicast's of one peer).
  void time(PhaseModel& m, std::int64_t bytes, bool remote) const {
    const OpTime t = chain_time(bytes, remote ? 1 : 0, remote ? 0 : 1, s_.topology(), chunk_);
    m.time(0, t.latency, t.total());
  }

  const TaskGrid& grid_;
  const LinkTimeline& s_;
  std::int64_t chunk_;
  std::int64_t elem_;
  std::size_t nics_;
  bool one_sender_;  // every task's transfers come from one of its holders
  TaskOps ops_;
  AllGatherForward forward_;
  std::vector<std::int64_t> splits_;  // the destination's, per dimension
  std::vector<std::size_t> tile_at_;  // per destination tile: its index in tiles_, or kNone
  std::vector<Tile> tiles_;
  std::vector<Group> groups_;
  struct GroupHash {
    std::size_t operator()(const std::pair<std::size_t, std::vector<int>>& k) const {
      detail::WordHash w;
      w.add(k.first);
      for (int d : k.second) w.add(d);
      return static_cast<std::size_t>(w.value());
    }
  };
  // Groups with holders among the targets, by tile and those holders.
  std::unordered_map<std::pair<std::size_t, std::vector<int>>, std::size_t, GroupHash> group_index_;
  std::vector<int> held_list_;  // scratch: the selected task's holders among its targets
  Op copy_;                     // scratch: a copy
  Classes broadcasts_, transfers_;
  struct Sent {
    std::int64_t bytes[2] = {0, 0}, messages[2] = {0, 0};  // to its host [0], to others [1]
  };
  std::vector<Sent> sent_[3];                         // per model: per device slot (sent())
  std::int64_t last_bytes_ = -1, last_messages_ = 0;  // messages_of()'s last answer
  std::size_t held_ = 0;  // targets, receivers and peers held by tiles, groups and classes
  bool fans_out_ = false;
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
// forwarding's many hops mostly do). Adds its cost (walk_work) to `work` if given. False, the
// models incomplete, where that passed `work_cap`.
bool walk_tasks(const TaskGrid& grid, const LinkTimeline& s, Strategy walk, Balance rule, bool fork,
                std::int64_t chunk, PhaseModel* plain, PhaseModel* gathered, bool* fans_out,
                double cap = std::numeric_limits<double>::infinity(), std::int64_t* work = nullptr,
                std::int64_t work_cap = kNoCap) {
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
  std::int64_t walked = 0;  // tasks, over both walks
  const auto over = [&] {
    return walked % 256 == 255 && walk_work(walked, {plain, gathered}) > work_cap;
  };
  const auto done = [&](bool whole) {
    if (plain) plain->share_trees(nullptr);
    if (work) *work += walk_work(walked, {plain, gathered});
    return whole;
  };
  TaskOps first(grid, s, walk, rule, 0, fork);
  ForwardClasses forward(s, chunk);
  if (plain) plain->share_trees(&first.trees());
  for (std::int64_t i = 0; i < grid.size() && (w.plain || gathered); ++i, ++walked) {
    if (over()) return done(false);
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
  if (!gathered) return done(true);
  forward.flush(*gathered);
  // The scatter (and the tasks' local ops), with senders.
  w.plain = nullptr;
  w.local = gathered;
  TaskOps second(grid, s, walk, rule, 0, fork);
  Op scatter;  // a transfer of the scatter: sendrecv's, carrying a slice
  scatter.kind = OpKind::Multicast;
  scatter.peers.resize(1);
  for (std::int64_t i = 0; i < grid.size(); ++i, ++walked) {
    if (over()) return done(false);
    Walk::check(w.local, cap);
    if (!w.local) return done(true);
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
  return done(true);
}

}  // namespace

bool priced_by_class(const TaskGrid& grid, const LinkTimeline& s, Balance rule) {
  return ClassWalk(grid, s, rule, s.chunk()).applies();
}

double strategy_price(const TaskGrid& grid, const LinkTimeline& s, const Links& links,
                      Strategy strategy, Balance rule, std::int64_t chunk, bool* fans_out,
                      bool fork) {
  PhaseModel m(links, s, chunk);
  if (ClassWalk w(grid, s, rule, chunk, fork); w.applies()) {
    auto only = [&](Strategy st) { return strategy == st ? &m : nullptr; };
    w.run(only(Strategy::Broadcast), only(Strategy::SendRecv), only(Strategy::AllGather), fans_out);
    return m.seconds();
  }
  if (strategy == Strategy::AllGather)
    walk_tasks(grid, s, Strategy::SendRecv, rule, fork, chunk, nullptr, &m, fans_out);
  else
    walk_tasks(grid, s, strategy, rule, fork, chunk, &m, nullptr, fans_out);
  return m.seconds();
}

AutoChoice auto_strategy(const TaskGrid& grid, const LinkTimeline& s, const PlanOptions& options,
                         std::int64_t work_cap) {
  const Links links(s.topology(), s.devices());
  const Balance rule = options.balance == Balance::None ? Balance::None : Balance::Local;
  // Chains fork only where they are built by the local rule itself: greedy and search, which
  // Local stands in for here, place plain chains.
  const bool fork = options.fork && options.balance == Balance::Local;
  std::optional<AutoChoice> best;
  double best_price = 0;
  std::int64_t work = 0;  // what pricing cost (walk_work of every walk)
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
  const double hosts = host_bytes(s.topology(), grid.src(), grid.dst());
  // Where tasks are priced by class, broadcast's price (and `scatter`) from one walk of all three.
  std::optional<double> classed;
  bool class_tried = false;
  for (Strategy st : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv}) {
    AutoChoice c{st, options.balance};
    auto fits = [&] {
      return within_limits(
          with_hosts(estimate_plan_size(grid.src(), grid.dst(), st, c.balance), hosts),
          options.max_plan_bytes);
    };
    if (!fits() && (c.balance = Balance::Local, !fits())) continue;
    if (!may_fan_out) return c;
    if (single) return c;
    bool fans_out = true;
    double price = 0;
    bool priced = true;  // within work_cap
    if (!class_tried) {
      class_tried = true;
      if (ClassWalk w(grid, s, rule, options.chunk_bytes, fork); w.applies()) {
        PhaseModel b(links, s, options.chunk_bytes), r = b, g = b;
        bool fan = true;
        priced = w.run(&b, &r, &g, &fan, &work, work_cap - work);
        classed = b.seconds();
        scatter = Scatter{r.seconds(), g.seconds(), fan};
      }
    }
    if (st == Strategy::Broadcast && classed) {
      price = *classed;
      fans_out = scatter->fans_out;
    } else if (st == Strategy::Broadcast) {  // by hop (strategy_price would try classes again)
      PhaseModel m(links, s, options.chunk_bytes);
      priced = walk_tasks(grid, s, st, rule, fork, options.chunk_bytes, &m, nullptr, &fans_out,
                          std::numeric_limits<double>::infinity(), &work, work_cap - work);
      price = m.seconds();
    } else {
      if (!scatter) {  // both from one walk of sendrecv's ops
        // Priced only until they reach the best price so far: then neither can win.
        PhaseModel sendrecv(links, s, options.chunk_bytes), allgather = sendrecv;
        bool fan = true;
        priced = walk_tasks(
            grid, s, Strategy::SendRecv, rule, fork, options.chunk_bytes, &sendrecv, &allgather,
            &fan, best ? best_price * (1 - 1e-9) : std::numeric_limits<double>::infinity(), &work,
            work_cap - work);
        // A walk cut short may not have met a box that fans out; a priced candidate (best) did.
        scatter = Scatter{sendrecv.seconds(), allgather.seconds(), fan || best.has_value()};
      }
      price = st == Strategy::SendRecv ? scatter->sendrecv : scatter->allgather;
      fans_out = scatter->fans_out;
    }
    if (!priced) break;  // the best of those priced whole, if any
    if (!fans_out) {
      c.work = work;
      return c;
    }
    if (!best || price < best_price * (1 - 1e-9)) {
      best = c;
      best_price = price;
    }
  }
  if (best) {
    best->work = work;
    return *best;
  }
  // No whole plan fits (plan() refuses it before this), or pricing passed work_cap before any
  // strategy was priced: the strategy of the smallest part, the same on every device.
  const PlanSize part = estimate_part_size(grid.src(), grid.dst(), Strategy::Auto);
  return {part.strategy, Balance::Local, work};
}

}  // namespace meshcast::detail
