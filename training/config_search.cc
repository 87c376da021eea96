#include "meshcast/training/config_search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>

#include "lib/support/require.h"
#include "lib/support/saturated.h"
#include "meshcast/cost.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/sparse.h"

namespace meshcast::training {
namespace {

constexpr double kFloat = 4;  // bytes of an f32

using detail::require;

// What collective_seconds() needs of a group: its size, and the messages a step of its ring
// puts through the busiest NIC it crosses (0: the group is inside one host).
struct GroupLink {
  int members = 1;
  std::int64_t per_nic = 0;
};

using HostCounts = std::map<int, int>;  // host -> devices

// Devices per host in those of `groups` that span hosts: they share the host's NICs when the
// groups run at once.
HostCounts spanning_per_host(const std::vector<std::vector<int>>& groups, const Topology& t) {
  HostCounts out;
  for (const auto& g : groups) {
    HostCounts on_host;
    for (int d : g) ++on_host[t.host_of(d)];
    if (on_host.size() > 1)
      for (const auto& [host, k] : on_host) out[host] += k;
  }
  return out;
}

// Messages through a host's busiest NIC when `senders` of its devices send one each at once
// (device i of a host uses NIC i mod nics_per_host).
std::int64_t per_nic(int senders, const Topology& t) {
  const int nics = std::max(1, t.nics_per_host());
  return (senders + nics - 1) / nics;
}

// `sharing`: spanning_per_host() of every group that runs at the same time as this one.
GroupLink group_link(const std::vector<int>& group, const Topology& t, const HostCounts& sharing) {
  GroupLink l;
  l.members = static_cast<int>(group.size());
  HostCounts on_host;
  for (int d : group) ++on_host[t.host_of(d)];
  if (l.members < 2 || on_host.size() == 1) return l;
  for (const auto& [host, k] : on_host)
    l.per_nic = std::max(l.per_nic, per_nic(sharing.at(host), t));
  return l;
}

// A ring collective's steps, each a round of the cost model (meshcast/cost.h round_seconds:
// one message of bytes / n from every member to the next, the latency, the sender's overhead
// and port, and the busiest NIC's share), the same formulas as the planner's and the
// collectives' own choice of algorithm.
double group_seconds(const GroupLink& l, CollectiveKind kind, double bytes, const Topology& t) {
  if (l.members < 2) return 0;
  const double n = l.members;
  const double steps = (kind == CollectiveKind::AllReduce ? 2 : 1) * (n - 1);
  return steps * round_seconds(bytes / n, 1, l.per_nic, t);
}

// `count` collectives of `bytes` each over one group.
struct Load {
  CollectiveKind kind;
  double bytes = 0;
  double count = 0;
};

// What each device of a stage runs over each of its groups in a step.
struct StageLoads {
  std::vector<Load> rows, cols, gathers, scatters, replicas, tokens;
};

// The stage mesh's axes {dp, R, C, D} (training/stage.h) that a group's members differ in.
using Free = std::array<bool, 4>;

// Every group along `free` of the stage mesh `s` on ids from `first` (those place_of() forms).
std::vector<std::vector<int>> groups_along(const StageShape& s, int first, const Free& free) {
  const std::array<int, 4> extent{s.dp, s.rows, s.cols, s.depth};
  std::array<int, 4> stride{};
  stride[3] = 1;
  for (int a = 2; a >= 0; --a) stride[a] = stride[a + 1] * extent[a + 1];
  std::vector<std::vector<int>> out;
  for (int i = 0; i < s.devices(); ++i) {
    bool leader = true;  // coordinate 0 on every free axis: one device per group
    for (int a = 0; a < 4; ++a) leader = leader && !(free[a] && (i / stride[a]) % extent[a] != 0);
    if (!leader) continue;
    std::vector<int> members{first + i};
    for (int a = 0; a < 4; ++a) {
      if (!free[a]) continue;
      std::vector<int> grown;
      for (int m : members)
        for (int k = 0; k < extent[a]; ++k) grown.push_back(m + k * stride[a]);
      members = std::move(grown);
    }
    out.push_back(std::move(members));
  }
  return out;
}

// Adds to out[device] the seconds of its stage's `loads` over its group along `free`, every
// stage's groups along `free` running at once.
void add_group_loads(const ParallelConfig& par, const Free& free,
                     const std::vector<StageLoads>& loads, std::vector<Load> StageLoads::*which,
                     const Topology& t, std::vector<double>& out) {
  const StageShape& s = par.stages.front();
  std::vector<std::vector<std::vector<int>>> groups;
  std::vector<std::vector<int>> all;
  for (std::size_t st = 0; st < par.stages.size(); ++st) {
    groups.push_back(groups_along(s, static_cast<int>(st) * s.devices(), free));
    all.insert(all.end(), groups.back().begin(), groups.back().end());
  }
  const HostCounts sharing = spanning_per_host(all, t);
  for (std::size_t st = 0; st < par.stages.size(); ++st) {
    for (const auto& g : groups[st]) {
      const GroupLink link = group_link(g, t, sharing);
      double seconds = 0;
      for (const Load& l : loads[st].*which)
        seconds += l.count * group_seconds(link, l.kind, l.bytes, t);
      for (int m : g) out[static_cast<std::size_t>(m)] += seconds;
    }
  }
}

// Seconds of one point-to-point transfer of `bytes` for each pair (from[i], to[i]), which all
// run at once: a round of the cost model (round_seconds), the pairs crossing hosts sharing the
// NICs of their hosts.
std::vector<double> transfer_seconds(const std::vector<int>& from, const std::vector<int>& to,
                                     double bytes, const Topology& t) {
  std::map<int, int> leaving, entering;
  for (std::size_t i = 0; i < from.size(); ++i) {
    const int a = t.host_of(from[i]), b = t.host_of(to[i]);
    if (a == b) continue;
    ++leaving[a];
    ++entering[b];
  }
  std::vector<double> out;
  for (std::size_t i = 0; i < from.size(); ++i) {
    const int a = t.host_of(from[i]), b = t.host_of(to[i]);
    const std::int64_t nic = a == b ? 0 : per_nic(std::max(leaving[a], entering[b]), t);
    out.push_back(round_seconds(bytes, 1, nic, t));
  }
  return out;
}

// The estimate for a configuration validate() accepted.
ConfigEstimate estimate(const ModelConfig& model, const TrainConfig& train,
                        const ParallelConfig& par, const Topology& topology,
                        const Machine& machine) {
  const StageShape& s = par.stages.front();
  const int pp = static_cast<int>(par.stages.size()), n = s.devices(), mbs = par.micro_batches;
  const double d = model.d_model, f = model.ffn_width(), seq = model.seq, vocab = model.vocab;
  const double R = s.rows, C = s.cols, D = s.depth, rc = R * C;
  const int samples = train.batch / mbs, groups = s.dp * s.depth;
  // Tokens of a micro-batch on the device with the most samples.
  const double T = static_cast<double>((samples + groups - 1) / groups) * seq;
  const double block_flops = 3 * T * (2 * (3 * d * d + d * d + 2 * d * f) / rc + 4 * seq * d / C);
  const double head_flops = 3 * T * 2 * d * vocab / R;
  const std::array<double, 4> weights{3 * d * d / rc, d * d / rc, d * f / rc, f * d / rc};

  const std::size_t total_devices = static_cast<std::size_t>(pp) * static_cast<std::size_t>(n);
  std::vector<double> compute(total_devices), tensor(total_devices), data(total_devices),
      pipe(total_devices);
  const auto AR = CollectiveKind::AllReduce;
  std::vector<StageLoads> loads(static_cast<std::size_t>(pp));
  for (int st = 0; st < pp; ++st) {
    StageLoads& sl = loads[static_cast<std::size_t>(st)];
    const int first = st * n;
    const bool embed = st == 0, head = st == pp - 1;
    const double L = static_cast<double>(shard_range(model.layers, pp, st).size()), M = mbs;
    const double flops = M * (L * block_flops + (head ? head_flops : 0));
    std::fill_n(compute.begin() + first, n, flops / machine.flops);

    // Per micro-batch per block over R: qkv and fc1 partial sums, proj and fc2 input gradients,
    // layernorms (2 forward all-reduces of T each, 1 backward of 2T).
    sl.rows = {{AR, T * 3 * d / C * kFloat, L * M},
               {AR, T * f / C * kFloat, 2 * L * M},
               {AR, T * d / C * kFloat, L * M},
               {AR, T * kFloat, 4 * L * M},
               {AR, 2 * T * kFloat, 2 * L * M}};
    if (head) {
      sl.rows.push_back({AR, T * kFloat, 2 * M});
      sl.rows.push_back({AR, T * vocab * kFloat, M});
      sl.rows.push_back({AR, 2 * T * kFloat, M});
    }
    // Over C: proj and fc2 partial sums, qkv and fc1 input gradients.
    sl.cols = {{AR, T * d / R * kFloat, 4 * L * M}};
    double dense = L * (3 * d / C + d / R + f / C + d / R + 4 * d / R);
    for (double w : weights) {
      if (s.depth == 1) {
        dense += L * w;  // not sharded: joins the buckets
        continue;
      }
      sl.gathers.push_back({CollectiveKind::AllGather, w * kFloat, L});
      sl.scatters.push_back({CollectiveKind::ReduceScatter, w * kFloat, L});
      sl.replicas.push_back({AR, w / D * kFloat, L});
    }
    if (embed) dense += seq * d / R;
    if (head) dense += 2 * d / R + d / R * vocab;
    const double buckets =
        std::ceil(dense * kFloat / static_cast<double>(ParallelConfig{}.bucket_bytes));
    sl.tokens = {{AR, dense * kFloat / buckets, buckets}};
    if (embed && groups > 1) {
      // The embedding table: what its cheapest sparse method moves, as the all-reduce that
      // moves as much (2(n-1)/n of the bytes given) over the same 2(n-1) steps.
      const auto mine = static_cast<std::int64_t>(std::min(vocab, T * mbs));
      const std::vector<std::int64_t> nonzero(static_cast<std::size_t>(groups), mine);
      const auto distinct = static_cast<std::int64_t>(std::min(vocab, seq * train.batch));
      double traffic = std::numeric_limits<double>::infinity();
      for (auto m : {SparseMethod::Dense, SparseMethod::AllGather, SparseMethod::Balanced})
        traffic = std::min(
            traffic, sparse_traffic(m, nonzero, distinct, model.vocab, model.d_model / s.rows));
      sl.tokens.push_back({AR, traffic * groups / (2.0 * (groups - 1)), 1});
    }
  }
  add_group_loads(par, {false, true, false, false}, loads, &StageLoads::rows, topology, tensor);
  add_group_loads(par, {false, false, true, false}, loads, &StageLoads::cols, topology, tensor);
  add_group_loads(par, {false, false, false, true}, loads, &StageLoads::gathers, topology, tensor);
  add_group_loads(par, {false, false, false, true}, loads, &StageLoads::scatters, topology, data);
  add_group_loads(par, {true, false, false, false}, loads, &StageLoads::replicas, topology, data);
  add_group_loads(par, {true, false, false, true}, loads, &StageLoads::tokens, topology, data);
  // The loss and gradient norm: one all-reduce of 2 doubles over every device.
  std::vector<int> world(total_devices);
  for (std::size_t i = 0; i < total_devices; ++i) world[i] = static_cast<int>(i);
  const double norm = group_seconds(
      group_link(world, topology, spanning_per_host({world}, topology)), AR, 16, topology);
  for (double& x : data) x += norm;

  // Stage crossings: the boundaries, then skips whose ends lie on different stages; each moves
  // an activation forward and a gradient back per micro-batch, [T, d / R] per device.
  std::vector<std::pair<int, int>> crossings;
  for (int st = 0; st + 1 < pp; ++st) crossings.emplace_back(st, st + 1);
  auto stage_of = [&](int layer) {
    for (int st = 0; st < pp; ++st)
      if (shard_range(model.layers, pp, st).hi > layer) return st;
    return pp - 1;
  };
  for (const auto& [a, b] : model.skips)
    if (stage_of(a) != stage_of(b)) crossings.emplace_back(stage_of(a), stage_of(b));
  for (const auto& [a, b] : crossings) {
    std::vector<int> from, to;
    for (int i = 0; i < n; ++i) {
      from.push_back(a * n + i);
      to.push_back(b * n + i);
    }
    const auto seconds = transfer_seconds(from, to, T * d / R * kFloat, topology);
    for (int i = 0; i < n; ++i) {
      pipe[static_cast<std::size_t>(from[i])] += 2 * mbs * seconds[static_cast<std::size_t>(i)];
      pipe[static_cast<std::size_t>(to[i])] += 2 * mbs * seconds[static_cast<std::size_t>(i)];
    }
  }

  // The busiest stage sets the pipeline's tick; the slowest device sets the step.
  double busiest = 0;
  std::size_t slowest = 0;
  auto whole = [&](std::size_t i) { return compute[i] + tensor[i] + data[i] + pipe[i]; };
  for (std::size_t i = 0; i < total_devices; ++i) {
    busiest = std::max(busiest, compute[i] + tensor[i]);
    if (whole(i) > whole(slowest)) slowest = i;
  }
  ConfigEstimate p;
  p.parallel = par;
  p.compute = compute[slowest];
  p.tensor_comm = tensor[slowest];
  p.data_comm = data[slowest];
  p.pipeline_comm = pipe[slowest];
  p.bubble = (pp - 1) * busiest / mbs;
  p.total = p.compute + p.tensor_comm + p.data_comm + p.pipeline_comm + p.bubble;
  return p;
}

// Every dp x R x C x D of n devices.
std::vector<StageShape> stage_shapes(int n) {
  std::vector<StageShape> out;
  for (int dp = 1; dp <= n; ++dp) {
    if (n % dp != 0) continue;
    for (int r = 1; r <= n / dp; ++r) {
      if (n / dp % r != 0) continue;
      for (int c = 1; c <= n / dp / r; ++c)
        if (n / dp / r % c == 0) out.push_back({dp, r, c, n / dp / r / c});
    }
  }
  return out;
}

}  // namespace

std::string ConfigEstimate::str() const {
  const StageShape& s = parallel.stages.front();
  char line[256];
  std::snprintf(line, sizeof line,
                "pp=%zu dp=%d grid=%dx%dx%d mb=%d %s: %.1f ms = compute %.1f + tp %.1f + dp %.1f + "
                "pp %.1f + bubble %.1f",
                parallel.stages.size(), s.dp, s.rows, s.cols, s.depth, parallel.micro_batches,
                to_string(parallel.schedule).c_str(), total * 1e3, compute * 1e3, tensor_comm * 1e3,
                data_comm * 1e3, pipeline_comm * 1e3, bubble * 1e3);
  return line;
}

double collective_seconds(const std::vector<int>& group, double bytes, CollectiveKind kind,
                          const Topology& topology) {
  require(bytes >= 0 && std::isfinite(bytes), "bytes",
          "must be a finite number >= 0 (got " + std::to_string(bytes) + ")");
  return group_seconds(group_link(group, topology, spanning_per_host({group}, topology)), kind,
                       bytes, topology);
}

std::vector<ConfigEstimate> search_configurations(const ModelConfig& model,
                                                  const TrainConfig& train, int devices,
                                                  const Topology& topology, const Machine& machine,
                                                  int top_k) {
  require(devices >= 1, "devices", "must be at least 1 (got " + std::to_string(devices) + ")");
  require(top_k >= 1, "top_k", "must be at least 1 (got " + std::to_string(top_k) + ")");
  require(machine.flops > 0 && std::isfinite(machine.flops), "flops",
          "must be a positive FLOP/s rate");
  for (int d = 0; d < devices; ++d)
    require(topology.covers(d), "devices",
            std::to_string(devices) + " devices, but topology '" + topology.name() +
                "' does not place device " + std::to_string(d));
  validate(model, ParallelConfig{}, train);  // the model and the batch alone, named as train()

  // Bounded before any is priced: each candidate's estimate walks every device (2^20 devices of
  // 2^20 samples ran for minutes, unbounded). First the candidates themselves (their checks),
  // then the devices of those that pass, which each estimate walks several times over (groups
  // and their hosts along every axis): about 40 times the cost of a candidate's check per
  // device (4,096 devices of a 4,096-block model, of 2^20 samples: 71 s, the candidates'
  // checks 14 s of it).
  double work = 0;
  for (int pp = 1; pp <= std::min(devices, model.layers); ++pp) {
    if (devices % pp != 0) continue;
    double batches = 0;
    for (std::int64_t m = pp; m <= train.batch && train.batch % m == 0; m *= 2) ++batches;
    work += static_cast<double>(stage_shapes(devices / pp).size()) * batches * devices;
  }
  check_limit("train search work", detail::saturated_int64(work), limits().train_search_work,
              "TRAIN_SEARCH_WORK");
  constexpr double kWalks = 40;
  // Calls `fn` with every candidate that fits the model and the batch.
  const auto candidates = [&](const auto& fn) {
    for (int pp = 1; pp <= std::min(devices, model.layers); ++pp) {
      if (devices % pp != 0) continue;
      for (const StageShape& shape : stage_shapes(devices / pp)) {
        for (std::int64_t m = pp; m <= train.batch && train.batch % m == 0; m *= 2) {
          ParallelConfig par;
          par.stages.assign(static_cast<std::size_t>(pp), shape);
          par.micro_batches = static_cast<int>(m);
          par.schedule = pp > 1 ? ScheduleKind::Eager1F1B : ScheduleKind::OneFOneB;
          par.topology = &topology;
          try {
            validate(model, par, train);
          } catch (const ValidationError&) {
            continue;  // the grid does not fit the model or the micro-batch
          }
          fn(par);
        }
      }
    }
  };
  double priced = 0;
  candidates([&](const ParallelConfig&) { priced += kWalks * devices; });
  check_limit("train search work", detail::saturated_int64(work + priced),
              limits().train_search_work, "TRAIN_SEARCH_WORK");

  std::vector<ConfigEstimate> out;
  candidates([&](const ParallelConfig& par) {
    out.push_back(estimate(model, train, par, topology, machine));
  });
  require(!out.empty(), "devices",
          "no configuration of " + std::to_string(devices) + " devices fits the model and batch");
  std::stable_sort(out.begin(), out.end(), [](const ConfigEstimate& a, const ConfigEstimate& b) {
    return a.total < b.total;
  });
  if (out.size() > static_cast<std::size_t>(top_k)) out.resize(static_cast<std::size_t>(top_k));
  return out;
}

}  // namespace meshcast::training
