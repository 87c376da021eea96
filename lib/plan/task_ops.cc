#include "lib/plan/task_ops.h"

#include <algorithm>

#include "lib/plan/multicast_tree.h"

namespace meshcast::detail {
namespace {

bool local(const Op& op) { return op.kind == OpKind::Copy || op.kind == OpKind::Zero; }

}  // namespace

double shared_devices(const Mesh& a, const Mesh& b) {
  const auto [alo, ahi] = std::minmax_element(a.devices().begin(), a.devices().end());
  const auto [blo, bhi] = std::minmax_element(b.devices().begin(), b.devices().end());
  if (a.devices().empty() || b.devices().empty() || *ahi < *blo || *bhi < *alo) return 0;
  // Meshes of consecutive ids (distinct: no gaps): their ranges' overlap.
  const auto span = [](int lo, int hi) { return std::int64_t{hi} - lo + 1; };  // ids up to 2^31
  if (span(*alo, *ahi) == a.size() && span(*blo, *bhi) == b.size())
    return static_cast<double>(span(std::max(*alo, *blo), std::min(*ahi, *bhi)));
  const Mesh& small = a.size() <= b.size() ? a : b;
  const Mesh& large = a.size() <= b.size() ? b : a;
  double n = 0;
  for (int d : small.devices()) n += large.contains(d);
  return n;
}

std::int64_t holders_per_tile(const Layout& layout) {
  HolderSet h(layout);
  h.select(std::vector<std::int64_t>(layout.ndim(), 0), 0);
  return h.size();
}

bool senders_to_choose(const Layout& src) {
  return src.spec().is_partial() || holders_per_tile(src) > 1;
}

std::int64_t stream_slots(Strategy strategy, const Layout& dst) {
  switch (strategy) {
    case Strategy::SendRecv:
      return 1 + holders_per_tile(dst);
    case Strategy::AllGather:
      return 1 + 2 * holders_per_tile(dst);
    default:
      return 2;
  }
}

AllGatherSplit allgather_split(const Box& box, std::size_t n) {
  std::size_t dim = 0;
  for (std::size_t d = 0; d < box.ndim(); ++d)
    if (box[d].size() > box[dim].size() && box[dim].size() < static_cast<std::int64_t>(n)) dim = d;
  for (std::size_t d = 0; d < box.ndim(); ++d)
    if (box[d].size() >= static_cast<std::int64_t>(n)) {
      dim = d;
      break;
    }
  return {dim, box[dim], n};
}

Range AllGatherSplit::slice(std::size_t j) const {
  const Range s =
      shard_range(range.size(), static_cast<std::int64_t>(n), static_cast<std::int64_t>(j));
  return {range.lo + s.lo, range.lo + s.hi};
}

void AllGatherSplit::sizes(std::vector<std::int64_t>& out) const {
  // Slice j ends at floor((j + 1) * m / n) (shard_range), m = q * n + r: its size is q plus
  // one where floor((j + 1) * r / n) steps, which a running remainder tells.
  const auto p = static_cast<std::int64_t>(n);
  const std::int64_t q = range.size() / p, r = range.size() % p;
  out.clear();
  std::int64_t rem = 0;
  for (std::size_t j = 0; j < n; ++j) {
    rem += r;
    const bool step = rem >= p;
    if (step) rem -= p;
    out.push_back(q + step);
  }
}

std::vector<Box> allgather_slices(const Box& box, std::size_t n) {
  const AllGatherSplit split = allgather_split(box, n);
  std::vector<Box> out;
  for (std::size_t j = 0; j < n; ++j) {
    auto ranges = box.ranges();
    ranges[split.dim] = split.slice(j);
    out.emplace_back(std::move(ranges));
  }
  return out;
}

void order_ops(std::vector<Op>& ops) {
  // A stable bucket pass over (phase, not local): phases are few, and a stable sort of millions
  // of ops moved each of them log n times.
  int phases = 0;
  for (const Op& op : ops) phases = std::max(phases, op.phase + 1);
  std::vector<std::size_t> start(2 * static_cast<std::size_t>(phases) + 1, 0);
  auto key = [](const Op& op) { return 2 * static_cast<std::size_t>(op.phase) + !local(op); };
  // Mostly in order already (one phase, no local op before a transfer): then no copy of them.
  if (std::is_sorted(ops.begin(), ops.end(),
                     [&](const Op& a, const Op& b) { return key(a) < key(b); }))
    return;
  for (const Op& op : ops) ++start[key(op) + 1];
  for (std::size_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
  std::vector<Op> out(ops.size());
  for (Op& op : ops) out[start[key(op)]++] = std::move(op);
  ops = std::move(out);
}

TaskOps::TaskOps(const TaskGrid& grid, const LinkTimeline& timeline, Strategy strategy,
                 Balance balance, std::int64_t key_offset, bool fork)
    : grid_(&grid),
      s_(&timeline),
      strategy_(strategy),
      balance_(balance),
      key_offset_(key_offset),
      slots_(stream_slots(strategy, grid.dst())),
      trees_(timeline),
      targets_(grid.dst()),
      holders_(static_cast<std::size_t>(grid.src().partial_groups()), HolderSet(grid.src())),
      any_holder_(holders_[0]) {      // (copies share the device index table)
  for (int d : timeline.devices()) {  // ascending, so each host's list is too
    const auto h = static_cast<std::size_t>(timeline.host(d));
    if (on_host_.size() <= h) on_host_.resize(h + 1);
    on_host_[h].push_back(d);
  }
  std::vector<char> has_source(on_host_.size(), 0);
  const Mesh& from = grid.src().mesh();
  const Mesh& to = grid.dst().mesh();
  for (std::int64_t k = 0; k < from.size(); ++k)
    has_source[static_cast<std::size_t>(timeline.host(from.device(k)))] = 1;
  for (std::int64_t k = 0; k < to.size() && !shared_hosts_; ++k)
    shared_hosts_ = has_source[static_cast<std::size_t>(timeline.host(to.device(k)))] != 0;
  // With one NIC per host no fork moves load off a NIC.
  const auto nics = static_cast<std::size_t>(timeline.topology().nics_per_host());
  if (!fork || balance != Balance::Local || !shared_hosts_ || nics == 1) return;
  // Per host, its distinct NICs under the source's devices there and under the destination's:
  // O(devices), each side's NICs stamped with the host last counted.
  std::vector<std::size_t> stamp(2 * nics, 0);
  fork_from_.assign(on_host_.size(), 0);
  for (std::size_t h = 0; h < on_host_.size(); ++h) {
    std::int64_t count[2] = {0, 0};
    for (int d : on_host_[h])
      for (std::size_t side : {0, 1})
        if ((side ? to : from).contains(d))
          if (std::size_t& s = stamp[side * nics + timeline.nic(d) % nics]; s != h + 1) {
            s = h + 1;
            ++count[side];
          }
    fork_from_[h] = count[0] > count[1] && count[1] > 0;
  }
}

void TaskOps::push(const Op& op, int device, OpSink& out) {
  if (device >= 0 && op.root != device &&
      std::find(op.peers.begin(), op.peers.end(), device) == op.peers.end())
    return;
  out(op);
}

void TaskOps::zeros(int device, std::vector<Op>& out) const {
  const Layout& dst = grid_->dst();
  if (!dst.spec().is_partial()) return;
  auto zero = [&](std::int64_t k) {
    if (dst.partial_group(k) != 0 && !dst.tile_at(k).empty())
      out.push_back({OpKind::Zero, 0, dst.tile_at(k), dst.mesh().device(k), {}, false, 0});
  };
  if (device < 0) {
    for (std::int64_t k = 0; k < dst.mesh().size(); ++k) zero(k);
  } else if (const auto k = dst.mesh().index_of(device)) {
    zero(*k);
  }
}

std::uint64_t chain_mix(std::int64_t key) {
  // A hash of the key: a tensor's tasks of one tensor-parallel rank have keys in arithmetic
  // progression, which k / others % n would map to one member.
  return (static_cast<std::uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> 32;
}

void rotate_chain(std::vector<int>& peers, int root, std::int64_t key, const LinkTimeline& s,
                  std::vector<std::size_t>& start, std::vector<int>& out) {
  // The runs of chain_order: the root's host first, then one run per host.
  start.clear();
  for (std::size_t i = 0; i < peers.size(); ++i)
    if (i == 0 || s.host(peers[i]) != s.host(peers[i - 1])) start.push_back(i);
  start.push_back(peers.size());
  const std::size_t runs = start.size() - 1;
  const std::size_t fixed = runs > 0 && s.host(peers[0]) == s.host(root) ? 1 : 0;
  const auto k = static_cast<std::size_t>(key);
  const std::size_t others = runs - fixed;
  out.clear();
  const std::uint64_t mixed = chain_mix(key);
  auto emit = [&](std::size_t r) {  // run r from its member `first` on, round to the start
    const auto begin = peers.begin() + static_cast<std::ptrdiff_t>(start[r]);
    const auto end = peers.begin() + static_cast<std::ptrdiff_t>(start[r + 1]);
    const auto first = begin + static_cast<std::ptrdiff_t>((mixed + r) % (start[r + 1] - start[r]));
    out.insert(out.end(), first, end);
    out.insert(out.end(), begin, first);
  };
  if (fixed) emit(0);
  for (std::size_t t = 0, r = k % std::max<std::size_t>(others, 1); t < others; ++t) {
    emit(fixed + r);  // runs from (k mod others) on, round to the first
    if (++r == others) r = 0;
  }
  peers.swap(out);
}

std::int32_t chain_fork(const std::vector<int>& peers, int root, const LinkTimeline& s) {
  std::size_t run = 0;
  while (run < peers.size() && s.host(peers[run]) == s.host(root)) ++run;
  return run < peers.size() ? static_cast<std::int32_t>(run) : 0;
}

int TaskOps::choose(const HolderSet& holders, int to, std::int64_t key) {
  if (!senders_) return -1;
  if (balance_ == Balance::None) return holders[0];
  key += key_offset_;
  if (on_host_.size() > 1 && shared_hosts_) {
    // The holders on the receiver's host: walk whichever list is shorter, then sort by id so
    // that the choice does not depend on which.
    const auto& host = on_host_[static_cast<std::size_t>(s_->host(to))];
    near_.clear();
    if (static_cast<std::int64_t>(host.size()) <= holders.size()) {
      for (int d : host)
        if (holders.contains(d)) near_.push_back(d);
    } else {
      for (std::int64_t k = 0; k < holders.size(); ++k)
        if (s_->host(holders[k]) == s_->host(to)) near_.push_back(holders[k]);
      std::sort(near_.begin(), near_.end());
    }
    if (!near_.empty()) return near_[static_cast<std::size_t>(key) % near_.size()];
  }
  return holders[key % holders.size()];
}

void TaskOps::task(std::int64_t i, int device, std::vector<Op>& out) {
  struct Append final : OpSink {
    std::vector<Op>& ops;
    explicit Append(std::vector<Op>& o) : ops(o) {}
    void operator()(const Op& op) override { ops.push_back(op); }
  } append(out);
  task(i, device, append);
}

void TaskOps::select(std::int64_t i) {
  grid_->shards(i, src_shard_, dst_shard_);
  targets_.select(dst_shard_, 0);
  for (std::size_t g = 0; g < holders_.size(); ++g)
    holders_[g].select(src_shard_, static_cast<std::int64_t>(g));
  if (holders_.size() > 1) any_holder_.select(src_shard_, -1);
}

bool TaskOps::holds(int device) const {
  return (holders_.size() == 1 ? holders_[0] : any_holder_).contains(device);
}

void TaskOps::task(std::int64_t i, int device, OpSink& out) {
  select(i);
  if (device >= 0 && !targets_.contains(device) && !holds(device))
    return;  // neither holds nor receives it
  const Box box = grid_->box(i);
  receivers_.clear();
  if (holders_.size() == 1) {
    if (device >= 0 && strategy_ == Strategy::SendRecv && !holders_[0].contains(device)) {
      receive_alone(box, i, device, out);
      return;
    }
    // Devices holding the data in both layouts copy it locally; the others receive it.
    for (std::int64_t k = 0; k < targets_.size(); ++k) {
      const int d = targets_[k];
      if (!holders_[0].contains(d))
        receivers_.push_back(d);
      else if (device < 0 || device == d)
        out({OpKind::Copy, 0, box, d, {}, false, 0});
    }
    serve(box, -1, 0, false, i, device, out);
    return;
  }
  // A pending sum: reduced at a destination device (one holding an addend where there is one,
  // so its own addend need not move), which then serves the others.
  for (std::int64_t k = 0; k < targets_.size(); ++k)  // the candidate roots, for now
    if (holds(targets_[k])) receivers_.push_back(targets_[k]);
  if (receivers_.empty())
    for (std::int64_t k = 0; k < targets_.size(); ++k) receivers_.push_back(targets_[k]);
  const int root = balance_ == Balance::None
                       ? receivers_.front()
                       : receivers_[static_cast<std::size_t>(i) % receivers_.size()];
  Op reduce{OpKind::Reduce, 0, box, root, {}, true, i * slots_};
  for (std::size_t g = 0; g < holders_.size(); ++g)
    reduce.peers.push_back(holders_[g].contains(root)
                               ? root
                               : choose(holders_[g], root, i + static_cast<std::int64_t>(g)));
  push(reduce, device, out);
  receivers_.clear();
  for (std::int64_t k = 0; k < targets_.size(); ++k)
    if (targets_[k] != root) receivers_.push_back(targets_[k]);
  serve(box, root, 1, true, i, device, out);
}

Op& TaskOps::transfer(const Box& box, int phase, bool from_dst) {
  op_.kind = OpKind::Multicast;
  op_.phase = phase;
  op_.box = box;
  op_.from_dst = from_dst;
  op_.group = 0;
  op_.fork = 0;
  return op_;
}

void TaskOps::receive_alone(const Box& box, std::int64_t i, int device, OpSink& out) {
  // Its index among the targets, less the targets before it that hold the box (they copy it).
  const std::int64_t k = targets_.position(device);
  std::int64_t j = k, copies = 0;
  if (shared_hosts_)  // else no holder is a target
    for (std::int64_t h = 0; h < holders_[0].size(); ++h) {
      const std::int64_t p = targets_.position(holders_[0][h]);
      copies += p >= 0;
      j -= p >= 0 && p < k;
    }
  if (targets_.size() - copies > 1) fans_out_ = true;
  Op& op = transfer(box, 0, false);  // as serve() builds sendrecv's transfer j
  op.root = choose(holders_[0], device, i + j);
  op.peers.assign(1, device);
  op.stream = i * slots_ + 1 + j;
  out(op);
}

void TaskOps::serve(const Box& box, int root, int phase, bool from_dst, std::int64_t i, int device,
                    OpSink& out) {
  const std::vector<int>& to = receivers_;
  if (to.empty()) return;
  if (to.size() > 1) fans_out_ = true;
  auto sender = [&](std::size_t j) {
    return root >= 0 ? root : choose(holders_[0], to[j], i + static_cast<std::int64_t>(j));
  };
  const std::int64_t base = i * slots_ + 1;
  Op& op = transfer(box, phase, from_dst);
  if (strategy_ == Strategy::SendRecv) {
    for (std::size_t j = 0; j < to.size(); ++j) {
      op.root = sender(j);
      op.peers.assign(1, to[j]);
      op.stream = base + static_cast<std::int64_t>(j);
      push(op, device, out);
    }
    return;
  }
  if (strategy_ == Strategy::Broadcast || to.size() == 1) {
    const int from = sender(0);
    if (device >= 0 && device != from && std::find(to.begin(), to.end(), device) == to.end())
      return;
    op.root = from;
    op.peers.assign(to.begin(), to.end());
    op.stream = base;
    chain_order(op.peers, from, *s_);
    if (balance_ == Balance::Local) {
      rotate_chain(op.peers, from, i + key_offset_, *s_, runs_, rotated_);
      // (A sum's root sends from its target: its NIC is a receiver's, no better than the run's.)
      if (!from_dst && forks_from(s_->host(from))) op.fork = chain_fork(op.peers, from, *s_);
    }
    if (trees_on_)
      op.group = trees_.best(op, box.volume() * static_cast<std::int64_t>(s_->elem_size()));
    out(op);
    return;
  }
  // AllGather: receiver j gets slice j, then forwards it to the other receivers.
  const auto parts = allgather_slices(box, to.size());
  const bool receives = device < 0 || std::find(to.begin(), to.end(), device) != to.end();
  for (std::size_t j = 0; j < parts.size(); ++j) {
    if (parts[j].empty()) continue;
    const auto slot = base + 2 * static_cast<std::int64_t>(j);
    op.phase = phase;
    op.box = parts[j];
    op.root = sender(j);
    op.peers.assign(1, to[j]);
    op.from_dst = from_dst;
    op.stream = slot;
    push(op, device, out);
    if (!receives) continue;
    op.phase = phase + 1;
    op.root = to[j];
    op.peers.clear();
    for (int r : to)
      if (r != to[j]) op.peers.push_back(r);
    op.from_dst = true;
    op.stream = slot + 1;
    chain_order(op.peers, to[j], *s_);  // a chain: see TreeShapes
    out(op);
  }
}

}  // namespace meshcast::detail
