// simulate(): a discrete-event run of a plan over the links of the cost model. Ops start as the
// executor starts them (a device posts its whole phase once it finished the earlier ones); an op
// waits its latency and pipeline fill, then its flows move at max-min fair rates (progressive
// filling over the links they share), recomputed whenever a flow starts or ends. A pipelined
// chain, or tree of chains, is one flow over all its hops (closed form per hop: no chunk is
// simulated; a link two hops share carries it twice); a sender's
// per-message overhead weighs on its send port (Links::Flow::weights), as in predict().
#include <algorithm>
#include <limits>
#include <queue>

#include "links.h"
#include "meshcast/cost.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"

namespace meshcast {
namespace {

using detail::Links;

struct SimOp {
  int phase = 0;
  std::vector<std::size_t> devices;  // participants (dense indices), distinct
  double delay = 0;                  // latency + pipeline fill, before the flows move
  std::size_t first_flow = 0, flows = 0, flows_left = 0;
  std::size_t waiting = 0;  // participants not yet in the op's phase
};

struct SimFlow {
  std::vector<std::size_t> links;  // a link used twice appears twice (it carries the flow twice)
  std::vector<double> weights;     // per entry of links: the link's capacity used per byte/s
  double remaining = 0, rate = 0;
  std::size_t op = 0;
};

class Simulator {
 public:
  Simulator(const Plan& plan, const Topology& topology, std::int64_t chunk)
      : devices_(plan.devices()), links_(topology, devices_) {
    const std::int64_t elem = static_cast<std::int64_t>(dtype_size(plan.src().dtype()));
    std::vector<Links::Flow> fs;
    for (const Op& op : plan.ops()) {
      SimOp s;
      s.phase = op.phase;
      phases_ = std::max(phases_, op.phase + 1);
      s.devices.push_back(slot(op.root));
      for (int p : op.peers) s.devices.push_back(slot(p));
      std::sort(s.devices.begin(), s.devices.end());
      s.devices.erase(std::unique(s.devices.begin(), s.devices.end()), s.devices.end());
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
      s.flows = s.flows_left = fs.size();
      for (auto& f : fs)
        flows_.push_back({std::move(f.links), std::move(f.weights), static_cast<double>(f.bytes), 0,
                          ops_.size()});
      ops_.push_back(std::move(s));
    }
  }

  Simulation run() {
    const auto p = static_cast<std::size_t>(std::max(phases_, 1));
    const std::size_t n = devices_.size();
    at_.assign(n, 0);
    left_.assign(n * p, 0);
    std::vector<std::size_t> count(n * p + 1, 0);
    for (const SimOp& o : ops_)
      for (std::size_t d : o.devices) ++count[d * p + static_cast<std::size_t>(o.phase)];
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
      for (std::size_t d : o.devices) list_[fill[d * p + static_cast<std::size_t>(o.phase)]++] = i;
      o.waiting = o.phase > 0 ? o.devices.size() : 0;
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
  std::size_t slot(int device) const {
    return static_cast<std::size_t>(std::lower_bound(devices_.begin(), devices_.end(), device) -
                                    devices_.begin());
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
    for (std::size_t d : o.devices)
      if (--left_[d * p + static_cast<std::size_t>(o.phase)] == 0 &&
          at_[d] == static_cast<std::size_t>(o.phase))
        advance(d, t);
  }

  // Max-min fair rates by progressive filling: the link with the least share per unit of
  // weight fixes its flows at that share, which leaves the other links they cross with less (a
  // flow at rate r uses weight x r of a link: a sender's port also pays per-message overhead).
  void share() {
    ++out_.events;
    // Each event re-shares among every active flow: bounded, as a plan with many concurrent
    // flows would otherwise take time quadratic in its ops.
    work_ += static_cast<std::int64_t>(active_.size());
    check_limit("simulate work", work_, limits().simulate_work, "SIMULATE_WORK");
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
      for (std::size_t k = 0; k < flows_[f].links.size(); ++k) {
        const std::size_t l = flows_[f].links[k];
        if (cnt_[l]++ == 0) {
          touched_.push_back(l);
          cap_[l] = links_.bandwidth(l);
          weight_[l] = 0;
        }
        weight_[l] += flows_[f].weights[k];
      }
    // The flows on each touched link: on_[begin_[l], end_[l]).
    std::size_t total = 0;
    for (std::size_t l : touched_) {
      begin_[l] = end_[l] = total;
      total += cnt_[l];
    }
    on_.resize(total);
    for (std::size_t f : active_) {
      flows_[f].rate = -1;  // not fixed yet
      for (std::size_t l : flows_[f].links) on_[end_[l]++] = f;
    }
    using Entry = std::pair<double, std::size_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    for (std::size_t l : touched_) {
      level_[l] = cap_[l] / weight_[l];
      heap.push({level_[l], l});
    }
    while (!heap.empty()) {
      const auto [s, l] = heap.top();
      heap.pop();
      if (cnt_[l] == 0 || s != level_[l]) continue;  // done, or a stale entry
      for (std::size_t j = begin_[l]; j < end_[l]; ++j) {
        SimFlow& fl = flows_[on_[j]];
        if (fl.rate >= 0) continue;
        fl.rate = s;
        for (std::size_t k = 0; k < fl.links.size(); ++k) {
          const std::size_t l2 = fl.links[k];
          cap_[l2] = std::max(0.0, cap_[l2] - s * fl.weights[k]);
          weight_[l2] -= fl.weights[k];
          if (--cnt_[l2] > 0) {
            level_[l2] = cap_[l2] / std::max(weight_[l2], 1.0);  // each weight is >= 1
            heap.push({level_[l2], l2});
          }
        }
      }
    }
    for (std::size_t f : active_)  // a flow starved to 0 by rounding still moves
      flows_[f].rate = std::max(flows_[f].rate, 1e-9 * links_.bandwidth(flows_[f].links.front()));
  }

  std::vector<int> devices_;
  Links links_;
  std::vector<std::pair<std::size_t, double>> use_;  // the constructor's scratch: (link, s/byte)
  int phases_ = 0;
  std::vector<SimOp> ops_;
  std::vector<SimFlow> flows_;
  // Per device: the phase it is in; per (device, phase): ops not finished, and the ops (CSR).
  std::vector<std::size_t> at_, left_, list_start_, list_;
  std::vector<char> done_;
  using Start = std::pair<double, std::size_t>;
  std::priority_queue<Start, std::vector<Start>, std::greater<>> starts_;
  std::vector<std::size_t> active_;
  // share()'s scratch, per link: capacity left, share per unit of unfixed weight, unfixed weight,
  // unfixed flow entries, and the flows on it (on_[begin_, end_)).
  std::vector<double> cap_, level_, weight_;
  std::vector<std::size_t> cnt_, begin_, end_, on_, touched_;
  Simulation out_;
  std::int64_t work_ = 0;  // flow-rate updates so far
};

}  // namespace

Simulation simulate(const Plan& plan, const Topology& topology, std::int64_t chunk_bytes) {
  detail::check_chunk(chunk_bytes);
  // At least two events per op (its start and its end), each updating at least its own flows.
  check_limit("simulate work", 2 * static_cast<std::int64_t>(plan.ops().size()),
              limits().simulate_work, "SIMULATE_WORK");
  Simulator sim(plan, topology, chunk_bytes);
  Simulation s = sim.run();
  s.links = sim.links().loads(plan, chunk_bytes);
  return s;
}

}  // namespace meshcast
