// A sync's plan: every tensor's ops (one device's, or all of them for a prediction) under the
// task-local sender rule, then the transfers of each (phase, sender, receivers) coalesced into
// messages of at most a bucket's bytes.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "lib/plan/links.h"
#include "lib/plan/op_text.h"
#include "lib/plan/planner.h"
#include "lib/plan/task_ops.h"
#include "lib/support/fnv.h"
#include "lib/support/saturated.h"
#include "lib/support/sort_runs.h"
#include "lib/support/text.h"
#include "lib/support/word_hash.h"
#include "lib/sync/price_class.h"
#include "meshcast/cost.h"
#include "meshcast/error.h"
#include "meshcast/plan_size.h"
#include "meshcast/sync.h"
#include "meshcast/task.h"
#include "meshcast/units.h"

namespace meshcast {
namespace {

std::string tensor_field(std::size_t i, const char* what) {
  return "tensors[" + std::to_string(i) + "]." + what;
}

void check(const std::vector<TensorMove>& tensors, const SyncOptions& o) {
  detail::check_plan_options(o.plan, "plan");
  if (o.max_staging_bytes < 8)  // one element of any dtype
    throw ValidationError("max_staging_bytes",
                          "must be at least 8, got " + std::to_string(o.max_staging_bytes));
  if (o.bucket_bytes != 0 && o.bucket_bytes < 8)  // one element of any dtype
    throw ValidationError("bucket_bytes", "must be 0 (the default) or at least 8, got " +
                                              std::to_string(o.bucket_bytes));
  if (o.pack_bytes < 0)
    throw ValidationError("pack_bytes", "must be >= 0, got " + std::to_string(o.pack_bytes));
  std::unordered_set<std::string_view> names;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorMove& t = tensors[i];
    if (t.name.empty()) throw ValidationError(tensor_field(i, "name"), "is empty");
    if (t.name.size() > kMaxTensorNameBytes)
      throw ValidationError(tensor_field(i, "name"),
                            "is " + std::to_string(t.name.size()) + " bytes long, over the " +
                                std::to_string(kMaxTensorNameBytes) + " a name may have");
    if (!names.insert(t.name).second)
      throw ValidationError(tensor_field(i, "name"),
                            detail::quote(t.name, detail::kNameWidth) + " is named twice");
    if (t.src.shape() != t.dst.shape())
      throw ValidationError(tensor_field(i, "dst.shape"),
                            detail::quote(t.name, detail::kNameWidth) + ": " +
                                shape_str(t.dst.shape()) + " differs from the source's " +
                                shape_str(t.src.shape()));
    // A reduce stages one element of each addend at least: refused alike on every device.
    if (const std::int64_t one = t.src.partial_groups() * dtype_size(t.src.dtype());
        t.src.partial_groups() > 1 && one > o.max_staging_bytes)
      throw ValidationError("max_staging_bytes",
                            "must be at least " + std::to_string(one) + ": " +
                                detail::quote(t.name, detail::kNameWidth) + " sums " +
                                std::to_string(t.src.partial_groups()) +
                                " addends, staged together, of at least one element each");
    const DType a = t.src.dtype(), b = t.dst.dtype();
    if (a != b && !(a == DType::f32 && (b == DType::bf16 || b == DType::f16)))
      throw ValidationError(tensor_field(i, "dst.dtype"),
                            detail::quote(t.name, detail::kNameWidth) + ": cannot cast " +
                                to_string(a) + " to " + to_string(b) +
                                " (casts: f32 to bf16 or f16)");
  }
}

// Tag streams per op: the pieces of a split box (cast, or a reduce's) take streams
// s + p * total, and a sync reserves total * kPieceStreams of them (at most the group's
// window), so that up to this many pieces of one box are in flight at once, on distinct tags.
constexpr std::int64_t kPieceStreams = 64;

// The bucket: the largest coalesced message, and the largest piece of a split box.
std::int64_t bucket_of(const SyncOptions& o) {
  if (o.bucket_bytes > 0) return std::min(o.bucket_bytes, o.max_staging_bytes);
  return std::max<std::int64_t>(
      1, std::min<std::int64_t>(std::int64_t{4} << 20, o.max_staging_bytes / 4));
}

// Splits `box` into pieces of at most `max_elems` elements (>= 1), slabs along its outermost
// dimensions first, so each piece is as contiguous as the box allows.
void split_box(const Box& box, std::int64_t max_elems, std::vector<Box>& out) {
  if (box.volume() <= max_elems) {
    out.push_back(box);
    return;
  }
  std::size_t d = 0;
  while (box[d].size() == 1) ++d;  // volume > max_elems >= 1: some extent exceeds 1
  const std::int64_t inner = box.volume() / box[d].size();
  std::vector<Range> r = box.ranges();
  const std::int64_t step = std::max<std::int64_t>(1, max_elems / inner);
  for (std::int64_t lo = box[d].lo; lo < box[d].hi; lo += step) {
    r[d] = {lo, std::min(box[d].hi, lo + step)};
    if (inner > max_elems)
      split_box(Box(r), max_elems, out);
    else
      out.push_back(Box(r));
  }
}

// A digest of everything a layout is.
std::uint64_t layout_digest(const Layout& l) {
  detail::Fnv f;
  detail::add_but_extents(f, l);
  for (std::int64_t n : l.shape()) f.add(n);
  return f.h;
}

// The elements of a tile of `l`, at most (the first, where splits are uneven).
double tile_elements(const Layout& l) {
  double v = 1;
  for (std::size_t d = 0; d < l.ndim(); ++d)
    v *= std::ceil(static_cast<double>(l.shape()[d]) / static_cast<double>(l.splits(d)));
  return v;
}

// `e` with the pieces a cast splits boxes into (each at most a bucket, a message of its own):
// those of the whole tensor, or of one source tile sent and one destination tile received (the
// most of any device). split_box() cuts slabs of whole rows, at least half a bucket each.
PlanSize with_cast_pieces(PlanSize e, const TensorMove& m, bool whole, std::int64_t bucket) {
  const double per_bucket =
      2 * static_cast<double>(dtype_size(m.dst.dtype())) / static_cast<double>(bucket);
  const auto receivers = static_cast<double>(detail::holders_per_tile(m.dst));
  // A chain carries a piece to every receiver; sendrecv and allgather send one per receiver.
  const bool chain = e.strategy == Strategy::Broadcast;
  const double sends = chain ? 1 : receivers;
  double messages = (tile_elements(m.src) * sends + tile_elements(m.dst)) * per_bucket;
  if (whole) {
    double elements = 1;
    for (std::int64_t n : m.src.shape()) elements *= static_cast<double>(n);
    messages = elements * sends * per_bucket;
  }
  e.ops += messages;
  e.peers += messages * (chain ? receivers : 1);
  // Per message: its segment, and its receivers in the message and its key.
  e.bytes +=
      messages * (256 + 32 * static_cast<double>(m.src.ndim()) + 8 * (chain ? receivers : 1));
  return e;
}

// A partial source's reduces split into messages (build() keeps each piece's addends, one per
// contributor, within a bucket together): `e` with them, their contributors listed and their
// bytes. Per message a prediction held 8 bytes per contributor and 350 others (in its plan and
// as an op to price), a device's part 4 and 160 (sums over 128 and 1,024 contributors);
// split_box() cuts slabs of whole rows, at least half a piece each.
PlanSize with_reduce_pieces(PlanSize e, const TensorMove& m, bool whole, std::int64_t bucket) {
  const auto groups = static_cast<double>(m.src.partial_groups());
  if (groups <= 1) return e;
  const double one = groups * static_cast<double>(dtype_size(m.src.dtype()));
  const double per_piece = std::floor(std::max(static_cast<double>(bucket), one) / one);
  // Every element is summed once; a device sums at most one target tile's and adds to at most
  // one source tile's (both only where it is in both meshes).
  const bool both = detail::shared_devices(m.src.mesh(), m.dst.mesh()) > 0;
  const double a = tile_elements(m.src), b = tile_elements(m.dst);
  const double elements = whole  ? static_cast<double>(m.src.elements())
                          : both ? a + b
                                 : std::max(a, b);
  const double messages = 2 * elements / per_piece;
  e.ops += messages;
  e.peers += messages * groups;
  e.bytes += messages * ((whole ? 480 : 320) + 32 * static_cast<double>(m.src.ndim()) +
                         (whole ? 12 : 6) * groups);
  return e;
}

// One tensor's share of a sync's size, built with `strategy` (to the layout `planned`): of a
// prediction's whole plan, or of the largest part of any device.
PlanSize tensor_size(const TensorMove& m, const Layout& planned, Strategy strategy, bool whole,
                     std::int64_t bucket) {
  PlanSize e = whole ? estimate_plan_size(m.src, planned, strategy, Balance::Local)
                     : estimate_part_size(m.src, planned, strategy);
  if (m.src.dtype() != m.dst.dtype()) e = with_cast_pieces(e, m, whole, bucket);
  // A prediction (every device's messages) holds each op three times (the tensor's ops, its
  // coalescing key and segment, its message) and each message twice while it is priced: its
  // receivers a fourth time. Peak RSS, loaded model and all, was 1/1.11 (gpt2-small from tp 8
  // x pp 4 to tp 4 over 16,384 + 16,384 devices: 3.08 GB) to 1/2.6 of this over fifteen models
  // and meshes (DeepSeek-V3 3,072 -> 960 on cluster-1024x8: 1.6 GB for 60 M receivers, which
  // 160 bytes a receiver, here before, refused at 11.6 GiB).
  if (whole) {
    e.bytes = 3 * e.bytes + 8 * e.peers;
    e.transient *= 3;
  }
  // A reduce's message prices no chain: its pieces were measured on their own.
  return with_reduce_pieces(e, m, whole, bucket);
}

// The size of a sync before any work, tensor t built with strategy[t] (as `planned` targets
// it): a prediction's whole plan, or the largest part of any device for every tensor (alike on
// every device, so that all refuse or none).
template <class Planned>
PlanSize sync_size(const std::vector<TensorMove>& tensors, bool whole,
                   const std::vector<Strategy>& strategy, Planned&& planned, std::int64_t bucket) {
  PlanSize size;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const PlanSize e = tensor_size(tensors[t], planned(t), strategy[t], whole, bucket);
    size = t == 0 ? e : combined(size, e);
  }
  return size;
}

// Throws check_plan_size()'s error where the sync exceeds the bounds, naming the tensor that
// takes the most of what is refused (ops or memory): what the user would change.
template <class Planned>
void check_sync_size(const std::vector<TensorMove>& tensors, bool whole,
                     const std::vector<Strategy>& strategy, Planned&& planned, std::int64_t bucket,
                     std::int64_t bound) {
  const PlanSize size = sync_size(tensors, whole, strategy, planned, bucket);
  if (tensors.empty() || within_limits(size, bound)) return;
  try {
    check_plan_size(size, bound);
  } catch (const ValidationError& e) {
    const bool ops = e.field() == "plan ops";
    std::size_t largest = 0;
    double most = -1;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const PlanSize one = tensor_size(tensors[t], planned(t), strategy[t], whole, bucket);
      const double its = ops ? one.ops : one.bytes - one.transient;  // of the process: shared
      if (its > most) largest = t, most = its;
    }
    std::ostringstream os;
    const std::int64_t n = detail::saturated_int64(most);  // an estimate may exceed 2^63
    os << e.cause() << "; the largest: tensors." << tensors[largest].name << ", "
       << (ops ? std::to_string(n) + " ops" : human_bytes(n));
    throw ValidationError(e.field(), os.str());
  }
}

// What auto's choices may make a device's part of a sync hold before the tensors that save the
// most take the strategy of their smallest part: planning memory is taken from the host that
// trains, per rank. DeepSeek-V3 from 4,096 to 4,096 devices: auto's allgather for the tensors
// replicated on 512 generators planned 1.43 M messages in 6.5 GB and 22 s at each generator,
// its smallest parts 3,635 (cluster-1024x8; the sync is predicted at 6.73 s,
// its link bound 6.71 s).
constexpr double kPartBudget = double(std::int64_t{256} << 20);

// Auto's choices, where their parts exceed kPartBudget (or the bounds), give way tensor by
// tensor to each tensor's smallest part, the largest saving first (ties: the earlier tensor):
// alike on every device, and a prediction models what the devices build.
template <class Planned>
void fit_parts(const std::vector<TensorMove>& tensors, std::vector<Strategy>& strategy,
               Planned&& planned, std::int64_t bucket, std::int64_t bound) {
  PlanSize size = sync_size(tensors, false, strategy, planned, bucket);
  const double budget = std::min(kPartBudget, static_cast<double>(plan_memory_bound(bound)));
  if (size.bytes <= budget && within_limits(size, bound)) return;
  struct Saving {
    double bytes, ops;
    std::size_t t;
    Strategy smallest;
  };
  std::vector<Saving> savings;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const PlanSize now = tensor_size(tensors[t], planned(t), strategy[t], false, bucket);
    Saving best{0, 0, t, strategy[t]};
    for (Strategy st : {Strategy::Broadcast, Strategy::AllGather, Strategy::SendRecv}) {
      const PlanSize e = tensor_size(tensors[t], planned(t), st, false, bucket);
      if (now.bytes - e.bytes > best.bytes) best = {now.bytes - e.bytes, now.ops - e.ops, t, st};
    }
    if (best.smallest != strategy[t]) savings.push_back(best);
  }
  std::stable_sort(savings.begin(), savings.end(),
                   [](const Saving& a, const Saving& b) { return a.bytes > b.bytes; });
  for (const Saving& s : savings) {
    if (size.bytes <= budget && within_limits(size, bound)) return;
    strategy[s.t] = s.smallest;
    size.bytes -= s.bytes;
    size.ops -= s.ops;
  }
}

// Where a multicast is coalesced: its phase, sender, receivers as a set and whether it forks.
struct Coalesce {
  int phase = 0, root = 0;
  bool fork = false;
  std::vector<std::uint64_t> set;  // the receivers' (host, id), ascending (receiver_set)
  bool operator==(const Coalesce&) const = default;
  struct Hash {
    std::size_t operator()(const Coalesce& k) const {
      detail::WordHash w;
      w.add(k.phase).add(k.root).add(k.fork);
      for (std::uint64_t v : k.set) w.add(v);
      return static_cast<std::size_t>(w.value());
    }
  };
};

// A chain's receivers as a set: their (host, id) ascending. A sort of each chain, and a map
// ordered by the sets, were half of a device's planning of 1,000 all-gathers over 128 devices.
void receiver_set(const std::vector<int>& peers, const Topology& topology,
                  std::vector<std::uint64_t>& set) {
  set.clear();
  for (int p : peers)
    set.push_back(static_cast<std::uint64_t>(topology.host_of(p)) << 32 |
                  static_cast<std::uint32_t>(p));
  detail::sort_runs(set, 32);
}

// The sync's ops, coalesced. `device` < 0: every device's (a prediction).
struct Built {
  std::vector<SyncPlan::Local> locals;
  std::vector<SyncPlan::Message> messages;
  std::int64_t streams = 0;
};

Built build(const std::vector<TensorMove>& tensors, int device, const Topology& topology,
            const SyncOptions& options) {
  check(tensors, options);
  const std::int64_t bucket = bucket_of(options);
  const std::int64_t pack = std::min(options.pack_bytes, bucket);
  // Stream space: tensor t's ops take [offset_t, offset_t + tasks_t * slots_t) with slots_t the
  // most any strategy uses, so that every device numbers them alike without pricing tensors it
  // does not take part in; the pieces of a split box take further multiples of the total.
  std::vector<std::int64_t> offset(tensors.size() + 1, 0), key(tensors.size() + 1, 0);
  // Planned in the source's dtype; the wire carries the target's (a cast at the sender). Only a
  // cast's target is copied for it, once: a layout holds its mesh's devices.
  std::vector<std::optional<Layout>> recast(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t)
    if (const Layout& d = tensors[t].dst; d.dtype() != tensors[t].src.dtype())
      recast[t].emplace(d.shape(), tensors[t].src.dtype(), d.mesh(), d.spec());
  const auto planned = [&](std::size_t t) -> const Layout& {
    return recast[t] ? *recast[t] : tensors[t].dst;
  };
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const TaskGrid grid(tensors[t].src, planned(t));
    std::int64_t slots = 0;
    for (Strategy s : {Strategy::Broadcast, Strategy::SendRecv, Strategy::AllGather})
      slots = std::max(slots, detail::stream_slots(s, tensors[t].dst));
    offset[t + 1] = offset[t] + grid.size() * slots;
    key[t + 1] = key[t] + grid.size();
  }
  const std::int64_t total = std::max<std::int64_t>(1, offset.back());
  // Auto priced per class of alike tensors (price_class.h: a model's layers repeat their
  // layouts), the same on every device, within a budget for a device's part; then bounded
  // before any work by the strategies built.
  std::vector<const Layout*> srcs, dsts;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    srcs.push_back(&tensors[t].src);
    dsts.push_back(&planned(t));
  }
  std::vector<Strategy> strategy = detail::tensor_strategies(srcs, dsts, topology, options.plan);
  const std::int64_t bound = options.plan.max_plan_bytes;
  if (options.plan.strategy == Strategy::Auto) fit_parts(tensors, strategy, planned, bucket, bound);
  check_sync_size(tensors, device < 0, strategy, planned, bucket, bound);

  // A chain's order differs from box to box (rotate_chain): a message takes its first box's.
  struct Seg {
    std::int64_t stream;
    SyncPlan::Segment seg;
    std::int64_t bytes;
    const std::vector<int>* order;  // the op's receivers, in chain order
    std::int32_t fork;              // the op's
    bool convert;                   // read from the source and cast: must be packed
  };
  std::vector<std::vector<Op>> kept;  // the ops the segments' orders point into
  std::unordered_map<Coalesce, std::vector<Seg>, Coalesce::Hash> coalesced;
  Coalesce where;  // the op's (its set's capacity kept from op to op)
  Built out;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const TensorMove& m = tensors[t];
    if (device >= 0 && !m.src.mesh().contains(device) && !m.dst.mesh().contains(device)) continue;
    const Layout& dst = planned(t);
    PlanOptions chosen = options.plan;
    chosen.strategy = strategy[t];
    kept.push_back(detail::tensor_ops(m.src, dst, device, topology, chosen, key[t], false).ops);
    const auto wire = static_cast<std::int64_t>(dtype_size(m.dst.dtype()));
    const auto src_elem = static_cast<std::int64_t>(dtype_size(m.src.dtype()));
    const bool cast = m.src.dtype() != m.dst.dtype();
    const auto tensor = static_cast<std::int32_t>(t);
    std::vector<Box> pieces;
    for (Op& op : kept.back()) {
      const std::int64_t stream = offset[t] + op.stream;
      if (op.kind == OpKind::Copy || op.kind == OpKind::Zero) {
        out.locals.push_back({tensor, std::move(op)});
        continue;
      }
      pieces.clear();
      if (op.kind == OpKind::Reduce) {
        // The root stages every addend of a piece: keep them within a bucket together, or at
        // least within the bound.
        const std::int64_t one = static_cast<std::int64_t>(op.peers.size()) * src_elem;
        split_box(op.box, std::max<std::int64_t>(1, std::max(bucket, one) / one), pieces);
        for (std::size_t k = 0; k < pieces.size(); ++k)
          out.messages.push_back({.phase = op.phase,
                                  .kind = OpKind::Reduce,
                                  .root = op.root,
                                  .peers = op.peers,
                                  .stream = stream + static_cast<std::int64_t>(k) * total,
                                  .packed = false,
                                  .bytes = pieces[k].volume() * src_elem,
                                  .segments = {{tensor, pieces[k], false}}});
        continue;
      }
      const std::int64_t bytes = op.box.volume() * wire;
      const bool convert = cast && !op.from_dst;
      if (bytes > bucket && convert) {
        split_box(op.box, std::max<std::int64_t>(1, bucket / wire), pieces);
      } else {
        pieces.push_back(op.box);
      }
      where.phase = op.phase;
      where.root = op.root;
      where.fork = op.fork != 0;
      receiver_set(op.peers, topology, where.set);
      auto at = coalesced.find(where);
      if (at == coalesced.end()) at = coalesced.emplace(where, std::vector<Seg>{}).first;
      for (std::size_t p = 0; p < pieces.size(); ++p)
        at->second.push_back({stream + static_cast<std::int64_t>(p) * total,
                              {tensor, pieces[p], op.from_dst},
                              pieces[p].volume() * wire,
                              &op.peers,
                              op.fork,
                              convert});
    }
  }
  // Each (phase, sender, receivers) in buckets of consecutive boxes by stream: the same on the
  // sender and every receiver, which see the same boxes. A box over pack_bytes travels alone,
  // unpacked, unless it is cast (then it was sliced above into pieces of at most a bucket).
  for (auto& [k, segs] : coalesced) {
    std::sort(segs.begin(), segs.end(),
              [](const Seg& a, const Seg& b) { return a.stream < b.stream; });
    SyncPlan::Message msg;
    auto flush = [&] {
      if (msg.segments.empty()) return;
      out.messages.push_back(std::move(msg));
      msg = {};
    };
    // Chains, not trees (group 0): a tree's leaders send every message twice, which pays for one
    // op alone (its depth) but not among a model's thousands of multicasts, which keep every
    // link busy anyway: a tree's hub would carry a TP rank's share of the model many times.
    for (Seg& s : segs) {
      if (s.bytes > pack && !s.convert) {
        flush();
        out.messages.push_back({.phase = k.phase,
                                .kind = OpKind::Multicast,
                                .root = k.root,
                                .peers = *s.order,
                                .fork = s.fork,
                                .stream = s.stream,
                                .packed = false,
                                .bytes = s.bytes,
                                .segments = {s.seg}});
        continue;
      }
      if (!msg.segments.empty() && msg.bytes + s.bytes > bucket) flush();
      if (msg.segments.empty()) {
        msg.phase = k.phase;
        msg.root = k.root;
        msg.peers = *s.order;
        msg.fork = s.fork;
        msg.stream = s.stream;
      }
      msg.bytes += s.bytes;
      msg.segments.push_back(std::move(s.seg));
    }
    flush();
  }
  std::sort(out.messages.begin(), out.messages.end(), [](const auto& a, const auto& b) {
    return std::tie(a.phase, a.stream) < std::tie(b.phase, b.stream);
  });
  std::stable_sort(out.locals.begin(), out.locals.end(),
                   [](const auto& a, const auto& b) { return a.op.phase < b.op.phase; });
  out.streams = total * kPieceStreams;
  return out;
}

}  // namespace

double sync_transfers(const TensorMove& t, const SyncOptions& options) {
  const auto targets = static_cast<double>(t.dst.mesh().size());
  // Pieces surely sent: where no device holds both sides (a device's own part is copied, cast
  // and summed in place), every byte crosses, a bucket a message at most. Not rounded per
  // tensor: pieces of several tensors share a message.
  if (detail::shared_devices(t.src.mesh(), t.dst.mesh()) > 0) return targets;
  const double elements = static_cast<double>(t.src.elements());
  const auto bucket = static_cast<double>(bucket_of(options));
  double pieces = 0;
  if (t.src.dtype() != t.dst.dtype())
    pieces = elements * static_cast<double>(dtype_size(t.dst.dtype())) / bucket;
  if (const auto groups = static_cast<double>(t.src.partial_groups()); groups > 1) {
    const double one = groups * static_cast<double>(dtype_size(t.src.dtype()));
    pieces = std::max(pieces, elements / std::floor(std::max(bucket, one) / one));
  }
  return std::max(pieces, targets);
}

SyncPlan::SyncPlan(std::vector<TensorMove> tensors, int device, std::vector<Local> locals,
                   std::vector<Message> messages, std::int64_t streams, SyncOptions options)
    : tensors_(std::move(tensors)),
      device_(device),
      locals_(std::move(locals)),
      messages_(std::move(messages)),
      streams_(streams),
      options_(std::move(options)) {
  detail::Fnv f;  // of the structure, not of text that two models could share
  for (const TensorMove& t : tensors_) {
    f.add(static_cast<std::int64_t>(t.name.size())).add(t.name);
    f.add(static_cast<std::int64_t>(layout_digest(t.src)));
    f.add(static_cast<std::int64_t>(layout_digest(t.dst)));
  }
  model_digest_ = f.h;
  // A binding looks up every name it is given: a scan each was quadratic in the tensors (40,000
  // of them checked for 11 s).
  by_name_.resize(tensors_.size());
  std::iota(by_name_.begin(), by_name_.end(), 0);
  std::stable_sort(by_name_.begin(), by_name_.end(), [&](std::int32_t a, std::int32_t b) {
    return tensors_[static_cast<std::size_t>(a)].name < tensors_[static_cast<std::size_t>(b)].name;
  });
}

int SyncPlan::index(std::string_view name) const {
  const auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                                   [&](std::int32_t i, std::string_view n) {
                                     return tensors_[static_cast<std::size_t>(i)].name < n;
                                   });
  if (it == by_name_.end() || tensors_[static_cast<std::size_t>(*it)].name != name) return -1;
  return *it;
}

SyncStats SyncPlan::stats() const {
  SyncStats s;
  s.tensors = static_cast<std::int64_t>(tensors_.size());
  s.messages = static_cast<std::int64_t>(messages_.size());
  for (const Message& m : messages_) {
    s.boxes += static_cast<std::int64_t>(m.segments.size());
    // What this device receives: a multicast's bytes at a receiver, a reduce's addends from the
    // other contributors at its root.
    if (m.kind == OpKind::Multicast && m.root != device_) s.bytes_moved += m.bytes;
    if (m.kind == OpKind::Reduce && m.root == device_)
      s.bytes_moved +=
          m.bytes * static_cast<std::int64_t>(std::count_if(m.peers.begin(), m.peers.end(),
                                                            [&](int c) { return c != device_; }));
  }
  return s;
}

std::string SyncPlan::str(std::size_t max_messages) const {
  const SyncStats s = stats();
  std::ostringstream os;
  os << "sync plan of device " << device_ << ": " << s.tensors << " tensors, " << locals_.size()
     << " local ops, " << s.messages << " messages carrying " << s.boxes << " boxes, "
     << s.bytes_moved << " bytes received\n";
  for (std::size_t i = 0; i < messages_.size() && i < max_messages; ++i) {
    const Message& m = messages_[i];
    os << "  phase " << m.phase << "  " << (m.kind == OpKind::Reduce ? "reduce " : "message ")
       << m.root << (m.kind == OpKind::Reduce ? " <- " : " -> ");
    for (std::size_t k = 0; k < m.peers.size(); ++k) os << (k ? "," : "") << m.peers[k];
    os << "  " << m.bytes << " bytes, " << m.segments.size()
       << (m.segments.size() == 1 ? " box" : " boxes") << (m.packed ? "" : " (unpacked)")
       << ", first " << tensors_[static_cast<std::size_t>(m.segments[0].tensor)].name << ' '
       << m.segments[0].box.str() << '\n';
  }
  if (messages_.size() > max_messages)
    os << "  ... " << messages_.size() - max_messages << " more messages\n";
  return os.str();
}

SyncPlan plan_sync(std::vector<TensorMove> tensors, int device, const Topology& topology,
                   const SyncOptions& options) {
  if (device < 0) throw ValidationError("device", "must be >= 0, got " + std::to_string(device));
  Built b = build(tensors, device, topology, options);
  return SyncPlan(std::move(tensors), device, std::move(b.locals), std::move(b.messages), b.streams,
                  options);
}

std::vector<int> sync_devices(const std::vector<TensorMove>& tensors) {
  // A model's meshes repeat: marked in a bitmap of the ids (a sort of every tensor's meshes took
  // 10 s for 127 tensors on 2 x 524,288 devices), unless the ids are sparse beyond their count.
  std::int64_t listed = 0;
  int largest = -1;
  for (const TensorMove& t : tensors)
    for (const Mesh* m : {&t.src.mesh(), &t.dst.mesh()}) {
      listed += m->size();
      for (int d : m->devices()) largest = std::max(largest, d);
    }
  std::vector<int> devices;
  if (largest < 0) return devices;
  if (static_cast<std::int64_t>(largest) < 8 * listed + (1 << 20)) {
    std::vector<bool> in(static_cast<std::size_t>(largest) + 1);
    for (const TensorMove& t : tensors)
      for (const Mesh* m : {&t.src.mesh(), &t.dst.mesh()})
        for (int d : m->devices()) in[static_cast<std::size_t>(d)] = true;
    for (std::size_t d = 0; d < in.size(); ++d)
      if (in[d]) devices.push_back(static_cast<int>(d));
    return devices;
  }
  for (const TensorMove& t : tensors)
    for (const Mesh* m : {&t.src.mesh(), &t.dst.mesh()})
      devices.insert(devices.end(), m->devices().begin(), m->devices().end());
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  return devices;
}

SyncStats predict_sync(const std::vector<TensorMove>& tensors, const Topology& topology,
                       const SyncOptions& options) {
  const Built b = build(tensors, -1, topology, options);
  const detail::Links links(topology, sync_devices(tensors));
  const std::int64_t chunk = options.plan.chunk_bytes;
  detail::check_chunk(chunk);

  // Each message as an op over a tensor of bytes: the cost model prices bytes, not boxes.
  SyncStats s;
  s.tensors = static_cast<std::int64_t>(tensors.size());
  s.messages = static_cast<std::int64_t>(b.messages.size());
  std::vector<Op> ops;
  ops.reserve(b.messages.size());
  std::vector<double> link_bytes(links.size(), 0);
  std::vector<detail::Links::Flow> flows;
  for (const SyncPlan::Message& m : b.messages) {
    s.boxes += static_cast<std::int64_t>(m.segments.size());
    Op op{m.kind, m.phase, Box({{0, m.bytes}}), m.root, m.peers, false, m.stream, m.group, m.fork};
    flows.clear();
    links.flows(op, m.bytes, chunk, flows);
    for (const auto& f : flows)
      for (std::size_t l : f.links) link_bytes[l] += static_cast<double>(f.bytes);
    const auto receivers = static_cast<std::int64_t>(m.peers.size());
    const bool root_adds = std::find(m.peers.begin(), m.peers.end(), m.root) != m.peers.end();
    if (!detail::add_product(s.bytes_moved, m.bytes,
                             m.kind == OpKind::Reduce ? receivers - root_adds : receivers))
      throw ValidationError("model", "the sync would move more than 2^63 bytes (8 EiB)");
    ops.push_back(std::move(op));
  }
  s.predicted_seconds = links.analytic_seconds(ops, 1, chunk);
  for (std::size_t l = 0; l < links.size(); ++l) {
    if (link_bytes[l] / links.bandwidth(l) > s.link_bound_seconds) {
      s.link_bound_seconds = link_bytes[l] / links.bandwidth(l);
      s.busiest_link = links.name(l);
    }
    // Every network hop leaves through one NIC's out link (even indices among the NICs').
    if (links.network(l) && l % 2 == 0 &&
        !detail::add_product(s.bytes_network, detail::saturated_int64(link_bytes[l]), 1))
      throw ValidationError("model", "the sync would move more than 2^63 bytes (8 EiB)");
  }
  return s;
}

}  // namespace meshcast
