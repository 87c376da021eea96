// simulate(): a discrete-event run of a plan over the links of the cost model. Ops start as the
// executor starts them (a device posts its whole phase once it finished the earlier ones); an op
// waits its latency and pipeline fill, then its flows move at max-min fair rates (progressive
// filling over the links they share), recomputed whenever a flow starts or ends. A pipelined
// chain, or tree of chains, is one flow over all its hops (closed form per hop: no chunk is
// simulated; a link two hops share carries it twice); a sender's
// per-message overhead weighs on its send port (Links::Flow::weights), as in predict().
#include <algorithm>
#include <bit>
#include <limits>
#include <queue>
#include <span>

#include "lib/plan/plan_check.h"
#include "links.h"
#include "meshcast/cost.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/multicast_tree.h"

namespace meshcast {
namespace {

using detail::Links;

// Ops and flows keep their devices and links in shared arrays (begin, end): a dense plan's
// millions of ops were three allocations each, most of the simulator's memory and time.
struct SimOp {
  int phase = 0;
  std::uint32_t flows = 0, flows_left = 0;  // an op has a few flows
  std::uint32_t waiting = 0;                // participants not yet in the op's phase
  std::size_t dev_begin = 0, dev_end = 0;   // participants (dense indices), distinct: devices_of_
  std::size_t first_flow = 0;
  double delay = 0;  // latency + pipeline fill, before the flows move
};

struct SimFlow {
  // links_of_ / weights_of_ [begin, end): a link used twice appears twice (it carries the flow
  // twice); per entry, the link's capacity used per byte/s.
  std::size_t begin = 0, end = 0;
  double remaining = 0, rate = 0;
  std::size_t op = 0;
  // The least rate share() gives it: a flow starved to 0 by rounding still moves, at a
  // billionth of its slowest link (of its first, a fast port's, it could outrun a slow network
  // link: faster than the bound).
  double floor = 0;
};

class Simulator {
 public:
  Simulator(const Plan& plan, const Topology& topology, std::int64_t chunk)
      : devices_(plan.devices()), links_(topology, devices_) {
    const Sizes n = check_bounds(plan);
    const std::int64_t elem = static_cast<std::int64_t>(dtype_size(plan.src().dtype()));
    std::vector<Links::Flow> fs;
    // To their counts (participants: at most, before duplicates go): a vector grown by doubling
    // held up to three times its entries while it moved.
    ops_.reserve(plan.ops().size());
    flows_.reserve(n.flows);
    devices_of_.reserve(n.participants);
    links_of_.reserve(n.entries);
    weights_of_.reserve(n.entries);
    for (const Op& op : plan.ops()) {
      SimOp s;
      s.phase = op.phase;
      phases_ = std::max(phases_, op.phase + 1);
      s.dev_begin = devices_of_.size();
      devices_of_.push_back(slot(op.root));
      for (int p : op.peers) devices_of_.push_back(slot(p));
      std::sort(devices_of_.begin() + static_cast<std::ptrdiff_t>(s.dev_begin), devices_of_.end());
      devices_of_.erase(std::unique(devices_of_.begin() + static_cast<std::ptrdiff_t>(s.dev_begin),
                                    devices_of_.end()),
                        devices_of_.end());
      s.dev_end = devices_of_.size();
      fs.clear();
      const std::int64_t bytes = op.box.volume() * elem;
      const detail::OpTime alone = links_.flows(op, bytes, chunk, fs);
      // Alone on idle links the flow moves at its slowest link (weighted, summed over the
      // entries of a link it crosses twice: a tree's leader port): what the op's time alone
      // adds beyond that (the pipeline fill, an empty chain's overheads) waits with the latency.
      double per_byte = 0;
      for (const auto& f : fs) {
        use_.clear();
        for (std::size_t k = 0; k < f.links.size(); ++k)
          use_.emplace_back(f.links[k], f.weights[k] / links_.bandwidth(f.links[k]));
        std::sort(use_.begin(), use_.end());
        for (std::size_t k = 0; k < use_.size();) {
          double sum = 0;
          const std::size_t l = use_[k].first;
          for (; k < use_.size() && use_[k].first == l; ++k) sum += use_[k].second;
          per_byte = std::max(per_byte, sum);
        }
      }
      s.delay = alone.latency;
      if (op.kind == OpKind::Multicast)
        s.delay += std::max(0.0, alone.occupancy - static_cast<double>(bytes) * per_byte);
      s.first_flow = flows_.size();
      s.flows = s.flows_left = static_cast<std::uint32_t>(fs.size());
      for (const auto& f : fs) {
        const std::size_t begin = links_of_.size();
        for (std::size_t l : f.links) links_of_.push_back(static_cast<std::uint32_t>(l));
        weights_of_.insert(weights_of_.end(), f.weights.begin(), f.weights.end());
        double slowest = std::numeric_limits<double>::infinity();
        for (std::size_t k = 0; k < f.links.size(); ++k)
          slowest = std::min(slowest, links_.bandwidth(f.links[k]) / f.weights[k]);
        flows_.push_back({begin, links_of_.size(), static_cast<double>(f.bytes), 0, ops_.size(),
                          1e-9 * slowest});  // every hop crosses its receiver's port
      }
      ops_.push_back(s);
    }
  }

  // What the constructor builds: flows, their link entries, the ops' participants (each at most
  // its root and peers).
  struct Sizes {
    std::size_t flows = 0, entries = 0, participants = 0;
  };

  // Refuses, before any flow is built, a run past the bounds: its memory, held throughout with
  // the plan's own and past the planner's (the flows' link entries, Links::hop's receive and send
  // ports and, off the host, the two NICs; the ops' participants, once in the ops and once in
  // the per-phase lists; per op its flows, times and place in the start queue; per device and
  // phase the lists' counts; per link the rate sharing's scratch and the loads reported); and
  // its work, at least each entry once, past simulate_work. A 16,384-device all-gather held
  // 12.6 GB, the plan and the flows each within the planner's 8 GiB, and ran for 4 minutes; a
  // 1,024-device transpose, estimated without the per-op times and lists, took 1.45x its bound.
  Sizes check_bounds(const Plan& plan) const {
    Sizes n;
    // What an allocation takes from the heap: its header, in 16-byte steps, at least 32 (glibc
    // on 64-bit Linux, elsewhere an estimate: a million ops' peers of one receiver each took
    // 34 MB, not 4).
    const auto heap = [](std::size_t bytes) -> std::int64_t {
      return bytes == 0
                 ? 0
                 : static_cast<std::int64_t>(std::max<std::size_t>(32, (bytes + 23) / 16 * 16));
    };
    std::int64_t entries = 0;
    auto plan_bytes = static_cast<std::int64_t>(plan.ops().capacity() * sizeof(Op));
    int phases = 1;
    for (const Op& op : plan.ops()) {
      const auto peers = static_cast<std::int64_t>(op.peers.size());
      n.participants += op.peers.size() + 1;
      phases = std::max(phases, op.phase + 1);
      plan_bytes += heap(op.peers.capacity() * sizeof(int)) + heap(op.box.ndim() * sizeof(Range));
      const auto hop = [&](int from, int to) { entries += links_.hop_links(from, to); };
      switch (op.kind) {
        case OpKind::Zero:
          break;
        case OpKind::Copy:
          ++n.flows;
          hop(op.root, op.root);
          break;
        case OpKind::Multicast:
          ++n.flows;
          for (std::int64_t k = 0; k < peers; ++k) {
            const std::int64_t from = multicast_parent(k, peers, op.group, op.fork);
            hop(from < 0 ? op.root : op.peers[static_cast<std::size_t>(from)],
                op.peers[static_cast<std::size_t>(k)]);
          }
          break;
        case OpKind::Reduce:
          for (int c : op.peers)
            if (c != op.root) {
              ++n.flows;
              hop(c, op.root);
            }
          break;
      }
    }
    n.entries = static_cast<std::size_t>(entries);
    const auto bytes = [](std::size_t count, std::size_t each) {
      return static_cast<std::int64_t>(count * each);
    };
    constexpr std::size_t kWord = sizeof(std::size_t);
    const std::size_t ops = plan.ops().size();
    const std::size_t lists = devices_.size() * static_cast<std::size_t>(phases) + 1;
    // What run() grows by doubling (the start queue, the active flows, share()'s flows per link)
    // counts twice. Per link: share()'s scratch and heap, loads() with each link's name, and the
    // Links' own.
    const std::size_t per_link =
        5 * sizeof(double) + 6 * kWord + sizeof(Start) + sizeof(LinkLoad) + 64;
    const std::int64_t memory =
        plan_bytes +
        bytes(n.entries, sizeof(std::uint32_t) + sizeof(double) + 2 * sizeof(std::uint32_t)) +
        bytes(n.participants, sizeof(std::uint32_t) + kWord) +
        bytes(n.flows, sizeof(SimFlow) + 2 * kWord) +
        bytes(ops, sizeof(SimOp) + 2 * sizeof(double) + 1 + 2 * sizeof(Start)) +
        bytes(lists, 4 * kWord) +            // left_, list_start_ and run()'s count and fill
        bytes(devices_.size(), 2 * kWord) +  // at_, and the Links' per device
        bytes(links_.size(), per_link);
    check_limit("simulate memory", memory, limits().plan_memory_bytes, "PLAN_MEMORY_BYTES");
    check_limit("simulate work", entries, limits().simulate_work, "SIMULATE_WORK");
    return n;
  }

  Simulation run() {
    const auto p = static_cast<std::size_t>(std::max(phases_, 1));
    const std::size_t n = devices_.size();
    at_.assign(n, 0);
    left_.assign(n * p, 0);
    std::vector<std::size_t> count(n * p + 1, 0);
    for (const SimOp& o : ops_)
      for (std::size_t d : devices(o)) ++count[d * p + static_cast<std::size_t>(o.phase)];
    list_start_.assign(n * p + 1, 0);
    for (std::size_t i = 0; i < n * p; ++i) {
      left_[i] = count[i];
      list_start_[i + 1] = list_start_[i] + count[i];
    }
    list_.resize(list_start_.back());
    out_.op_start.assign(ops_.size(), 0);
    out_.op_end.assign(ops_.size(), 0);
    done_.assign(ops_.size(), 0);
    std::vector<std::size_t> fill(list_start_.begin(), list_start_.end() - 1);
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      SimOp& o = ops_[i];
      for (std::size_t d : devices(o)) list_[fill[d * p + static_cast<std::size_t>(o.phase)]++] = i;
      o.waiting = o.phase > 0 ? static_cast<std::uint32_t>(o.dev_end - o.dev_begin) : 0;
      if (o.waiting == 0) ready(i, 0);
    }
    for (std::size_t d = 0; d < n; ++d) advance(d, 0);

    double t = 0;
    constexpr double kInf = std::numeric_limits<double>::infinity();
    std::vector<std::size_t> done;
    while (!starts_.empty() || !active_.empty()) {
      double dt = kInf;
      if (!active_.empty()) {
        share();
        for (std::size_t f : active_) dt = std::min(dt, flows_[f].remaining / flows_[f].rate);
      }
      // Advance to the first flow's end or the next op's start, whichever comes first.
      const double until_start = starts_.empty() ? kInf : starts_.top().first - t;
      const double step = std::min(dt, until_start);
      t = step == until_start ? starts_.top().first : t + step;
      // A flow ends when what it has left would take less than the clock's resolution at t:
      // the one that set the step, and any within rounding of it (else t + dt == t could stall).
      const double resolution = 1e-12 * std::max(1.0, t);
      done.clear();
      std::size_t kept = 0;
      for (std::size_t f : active_) {
        SimFlow& fl = flows_[f];
        fl.remaining -= fl.rate * step;
        if (fl.remaining <= fl.rate * resolution)
          done.push_back(f);
        else
          active_[kept++] = f;
      }
      active_.resize(kept);
      for (std::size_t f : done)
        if (--ops_[flows_[f].op].flows_left == 0) complete(flows_[f].op, t);
      while (!starts_.empty() && starts_.top().first <= t) {
        const std::size_t i = starts_.top().second;
        starts_.pop();
        for (std::size_t f = ops_[i].first_flow; f < ops_[i].first_flow + ops_[i].flows; ++f)
          active_.push_back(f);
        if (ops_[i].flows == 0) complete(i, t);
      }
    }
    for (std::size_t i = 0; i < ops_.size(); ++i)
      if (!done_[i])  // cannot happen for a valid plan: every op's devices reach its phase
        throw ValidationError("plan", "simulation: op " + std::to_string(i) + " never started");
    return std::move(out_);
  }

  const Links& links() const { return links_; }

 private:
  std::uint32_t slot(int device) const {
    return static_cast<std::uint32_t>(std::lower_bound(devices_.begin(), devices_.end(), device) -
                                      devices_.begin());
  }

  std::span<const std::uint32_t> devices(const SimOp& o) const {
    return {devices_of_.data() + o.dev_begin, o.dev_end - o.dev_begin};
  }

  void ready(std::size_t op, double t) {
    out_.op_start[op] = t;
    starts_.push({t + ops_[op].delay, op});
  }

  // Device d finished its ops of phase at_[d]: it moves on past phases with nothing to do, and
  // the ops of the phase it reaches lose one device to wait for.
  void advance(std::size_t d, double t) {
    const auto p = static_cast<std::size_t>(std::max(phases_, 1));
    while (at_[d] < p && left_[d * p + at_[d]] == 0) {
      if (++at_[d] == p) return;
      const std::size_t k = d * p + at_[d];
      for (std::size_t j = list_start_[k]; j < list_start_[k + 1]; ++j)
        if (--ops_[list_[j]].waiting == 0) ready(list_[j], t);
    }
  }

  void complete(std::size_t op, double t) {
    const auto p = static_cast<std::size_t>(std::max(phases_, 1));
    done_[op] = 1;
    out_.op_end[op] = t;
    out_.seconds = std::max(out_.seconds, t);
    const SimOp& o = ops_[op];
    for (std::size_t d : devices(o))
      if (--left_[d * p + static_cast<std::size_t>(o.phase)] == 0 &&
          at_[d] == static_cast<std::size_t>(o.phase))
        advance(d, t);
  }

  // Max-min fair rates by progressive filling: the link with the least share per unit of
  // weight fixes its flows at that share, which leaves the other links they cross with less (a
  // flow at rate r uses weight x r of a link: a sender's port also pays per-message overhead).
  void share() {
    ++out_.events;
    if (cap_.empty()) {
      cap_.assign(links_.size(), 0);
      level_.assign(links_.size(), 0);
      weight_.assign(links_.size(), 0);
      cnt_.assign(links_.size(), 0);
      begin_.assign(links_.size(), 0);
      end_.assign(links_.size(), 0);
    }
    touched_.clear();
    for (std::size_t f : active_)
      for (std::size_t k = flows_[f].begin; k < flows_[f].end; ++k) {
        const std::size_t l = links_of_[k];
        if (cnt_[l]++ == 0) {
          touched_.push_back(l);
          cap_[l] = links_.bandwidth(l);
          weight_[l] = 0;
        }
        weight_[l] += weights_of_[k];
      }
    // The flows on each touched link: on_[begin_[l], end_[l]).
    std::size_t total = 0;
    for (std::size_t l : touched_) {
      begin_[l] = end_[l] = total;
      total += cnt_[l];
    }
    // Each event re-shares the links of every active flow: its work is their link entries (a
    // chain's grows with its receivers) and the heap's steps over the links they touch, bounded,
    // as a plan with many concurrent flows would otherwise take time quadratic in its ops
    // (counting flows let a 65,536-receiver plan run 504 s on 6e5 of them; counting entries
    // alone, a 16,256-device transpose ran 3 minutes, its 32,000 ports' heap most of it).
    const auto links = static_cast<std::int64_t>(touched_.size());
    work_ += static_cast<std::int64_t>(total) +
             links * std::bit_width(static_cast<std::uint64_t>(links));
    check_limit("simulate work", work_, limits().simulate_work, "SIMULATE_WORK");
    on_.resize(total);
    for (std::size_t f : active_) {
      flows_[f].rate = -1;  // not fixed yet
      for (std::size_t k = flows_[f].begin; k < flows_[f].end; ++k)
        on_[end_[links_of_[k]]++] = static_cast<std::uint32_t>(f);
    }
    using Entry = std::pair<double, std::size_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    for (std::size_t l : touched_) {
      level_[l] = cap_[l] / weight_[l];
      heap.push({level_[l], l});
    }
    // A link's level only rises as flows elsewhere are fixed (they take at most its level), so
    // its heap entry is a lower bound: refreshed when it comes up, not on every change (a dense
    // plan's millions of flows each change four links).
    while (!heap.empty()) {
      const auto [s, l] = heap.top();
      heap.pop();
      if (cnt_[l] == 0) continue;  // done
      if (s != level_[l]) {
        heap.push({level_[l], l});
        continue;
      }
      for (std::size_t j = begin_[l]; j < end_[l]; ++j) {
        SimFlow& fl = flows_[on_[j]];
        if (fl.rate >= 0) continue;
        fl.rate = s;
        for (std::size_t k = fl.begin; k < fl.end; ++k) {
          const std::size_t l2 = links_of_[k];
          cap_[l2] = std::max(0.0, cap_[l2] - s * weights_of_[k]);
          weight_[l2] -= weights_of_[k];
          if (--cnt_[l2] > 0) level_[l2] = cap_[l2] / std::max(weight_[l2], 1.0);  // weights >= 1
        }
      }
    }
    for (std::size_t f : active_) flows_[f].rate = std::max(flows_[f].rate, flows_[f].floor);
  }

  std::vector<int> devices_;
  Links links_;
  std::vector<std::pair<std::size_t, double>> use_;  // the constructor's scratch: (link, s/byte)
  int phases_ = 0;
  std::vector<SimOp> ops_;
  std::vector<SimFlow> flows_;
  std::vector<std::uint32_t> devices_of_;  // the ops' participants, op by op
  std::vector<std::uint32_t> links_of_;    // the flows' links, flow by flow
  std::vector<double> weights_of_;         // per entry of links_of_
  // Per device: the phase it is in; per (device, phase): ops not finished, and the ops (CSR).
  std::vector<std::size_t> at_, left_, list_start_, list_;
  std::vector<char> done_;
  using Start = std::pair<double, std::size_t>;
  std::priority_queue<Start, std::vector<Start>, std::greater<>> starts_;
  std::vector<std::size_t> active_;
  // share()'s scratch, per link: capacity left, share per unit of unfixed weight, unfixed weight,
  // unfixed flow entries, and the flows on it (on_[begin_, end_)).
  std::vector<double> cap_, level_, weight_;
  std::vector<std::size_t> cnt_, begin_, end_, touched_;
  std::vector<std::uint32_t> on_;  // flow indices (< 2^32: simulate_work bounds the ops)
  Simulation out_;
  std::int64_t work_ = 0;  // flow-rate updates so far
};

}  // namespace

Simulation simulate(const Plan& plan, const Topology& topology, std::int64_t chunk_bytes) {
  detail::check_chunk(chunk_bytes);
  // At least two events per op (its start and its end), each updating at least its own flows.
  check_limit("simulate work", 2 * static_cast<std::int64_t>(plan.ops().size()),
              limits().simulate_work, "SIMULATE_WORK");
  detail::check_plan_ops(plan);  // its phases and boxes index the simulator's tables
  Simulator sim(plan, topology, chunk_bytes);
  Simulation s = sim.run();
  s.links = sim.links().loads(plan, chunk_bytes);
  return s;
}

}  // namespace meshcast
