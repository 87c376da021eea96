// Plan::validate()'s checker: each op on its own, then, per target device, that the boxes
// written there tile its target tile exactly, by box arithmetic rather than per element
// (meshcast/plan.h states what is checked).
#include "lib/plan/plan_check.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/multicast_tree.h"
#include "meshcast/plan.h"

namespace meshcast::detail {
namespace plan_check {

// Work the coverage check may spend beyond one pass over the ops: grid cells visited and boxes
// compared. A plan so fragmented that it needs more is refused rather than checked for minutes.
constexpr std::int64_t kBaseWork = std::int64_t{1} << 24;
constexpr std::int64_t kWorkPerWrite = 64;
// The largest grid of one device (4 bytes a cell), and the number of boxes up to which a
// device's boxes are simply compared pairwise.
constexpr std::int64_t kMaxCells = std::int64_t{1} << 24;
constexpr std::size_t kFewBoxes = 16;

// Text for a one-line message: at most 80 characters.
inline std::string brief(std::string s) { return s.size() > 80 ? s.substr(0, 77) + "..." : s; }
inline std::string brief(const Box& b) { return brief(b.str()); }

inline std::string op_field(std::size_t i) { return at_index("plan.ops", i); }

// A field of an op, spelled out only for an error: "plan.ops[3].peers[1]".
struct Where {
  static constexpr std::size_t kWhole = static_cast<std::size_t>(-1);
  std::size_t op;
  const char* member;          // ".root", ".peers", ...
  std::size_t index = kWhole;  // an element of the member
  std::string str() const {
    const std::string s = op_field(op) + member;
    return index == kWhole ? s : at_index(s, index);
  }
};

// The number of elements two boxes of the same ndim share (without building their intersection).
inline std::int64_t shared(const Box& a, const Box& b) {
  std::int64_t v = 1;
  for (std::size_t d = 0; d < a.ndim(); ++d) {
    const std::int64_t e = std::min(a[d].hi, b[d].hi) - std::max(a[d].lo, b[d].lo);
    if (e <= 0) return 0;
    v *= e;  // at most the volume of a box in the tensor
  }
  return v;
}

// What a target element must end up holding: the value, or zero (addends of a partial target
// other than the first are zero-filled; their sum with addend 0 is then the value).
enum class Content : char { Value, Zero };

// The coordinate grid of one device's boxes: the bounds of every box cut every dimension, so
// each box is a product of whole cells. A cell records the op that writes it (index + 1; 0: none).
class Grid {
 public:
  Grid(const Box& tile, const std::vector<const Box*>& boxes) : cuts_(tile.ndim()) {
    for (std::size_t d = 0; d < tile.ndim(); ++d) {
      auto& c = cuts_[d];
      c = {tile[d].lo, tile[d].hi};
      for (const Box* b : boxes) {
        c.push_back((*b)[d].lo);
        c.push_back((*b)[d].hi);
      }
      std::sort(c.begin(), c.end());
      c.erase(std::unique(c.begin(), c.end()), c.end());
    }
  }
  // Number of cells, or kMaxCells + 1 when larger.
  std::int64_t cells() const {
    std::int64_t n = 1;
    for (const auto& c : cuts_) {
      const auto e = static_cast<std::int64_t>(c.size()) - 1;
      if (e <= 0) return 0;
      if (n > kMaxCells / e) return kMaxCells + 1;
      n *= e;
    }
    return n;
  }
  void allocate() { cell_.assign(static_cast<std::size_t>(cells()), 0); }
  std::uint32_t& at(std::size_t i) { return cell_[i]; }
  // Calls f(cell index) for every cell of `b` (a box whose bounds are cuts).
  template <class F>
  void each(const Box& b, F&& f) const {
    const std::size_t r = cuts_.size();
    std::vector<std::size_t> lo(r), hi(r), at(r), stride(r);
    std::size_t s = 1;
    for (std::size_t d = r; d-- > 0;) {
      const auto& c = cuts_[d];
      lo[d] = static_cast<std::size_t>(std::lower_bound(c.begin(), c.end(), b[d].lo) - c.begin());
      hi[d] = static_cast<std::size_t>(std::lower_bound(c.begin(), c.end(), b[d].hi) - c.begin());
      if (lo[d] >= hi[d]) return;
      at[d] = lo[d];
      stride[d] = s;
      s *= c.size() - 1;
    }
    while (true) {
      std::size_t i = 0;
      for (std::size_t d = 0; d < r; ++d) i += at[d] * stride[d];
      f(i);
      std::size_t d = r;
      while (d-- > 0) {
        if (++at[d] < hi[d]) break;
        at[d] = lo[d];
      }
      if (d == static_cast<std::size_t>(-1)) return;
    }
  }

 private:
  std::vector<std::vector<std::int64_t>> cuts_;
  std::vector<std::uint32_t> cell_;
};

class PlanChecker {
 public:
  explicit PlanChecker(const Plan& p)
      : p_(p),
        src_(p.src()),
        dst_(p.dst()),
        src_tiles_(static_cast<std::size_t>(src_.mesh().size())),
        dst_tiles_(static_cast<std::size_t>(dst_.mesh().size())) {}

  void run(bool whole) {
    if (p_.strategy() == Strategy::Auto)
      throw ValidationError("plan.strategy", "a plan records the strategy chosen, never auto");
    if (src_.shape() != dst_.shape())
      throw ValidationError("plan.dst.shape", "shape " + brief(shape_str(dst_.shape())) +
                                                  " differs from the source's " +
                                                  brief(shape_str(src_.shape())));
    if (src_.dtype() != dst_.dtype())
      throw ValidationError("plan.dst.dtype", "dtype " + to_string(dst_.dtype()) +
                                                  " differs from the source's " +
                                                  to_string(src_.dtype()));
    const auto& ops = p_.ops();
    check_limit("plan.ops", static_cast<std::int64_t>(ops.size()), limits().plan_ops, "PLAN_OPS");
    if (ops.size() >= std::numeric_limits<std::uint32_t>::max())
      throw ValidationError("plan.ops", "too many ops to check");
    int phase = -1;
    for (std::size_t i = 0; i < ops.size(); ++i) check_op(i, phase);
    if (whole) coverage();
    // After coverage: an op given twice is reported as the double write it is.
    distinct_streams();
  }

 private:
  // ---- One op ----
  void check_op(std::size_t i, int& phase) {
    const Op& op = p_.ops()[i];
    const auto at = [i](const char* member) { return Where{i, member}.str(); };
    if (op.phase < 0) throw ValidationError(at(".phase"), "negative phase");
    if (op.phase < phase)
      throw ValidationError(at(".phase"), "phase " + std::to_string(op.phase) +
                                              " after an op of phase " + std::to_string(phase) +
                                              ": ops are listed in phase order");
    if (op.phase > phase + 1)
      throw ValidationError(at(".phase"), "phase " + std::to_string(op.phase) + " skips phase " +
                                              std::to_string(phase + 1));
    phase = op.phase;
    if (op.stream < 0 || op.stream >= p_.streams())
      throw ValidationError(at(".stream"), "stream " + std::to_string(op.stream) +
                                               " is outside the plan's " +
                                               std::to_string(p_.streams()) + " streams");
    // A fork leaves receivers on both sides; a tree of chains cuts those after the fork into
    // groups of at least 2 and at least two groups (any other cut is one chain, written 0).
    // ".member" `value`, outside `allowed` or on an op other than a multicast.
    const auto refuse = [&](const char* member, std::int32_t value, const std::string& allowed) {
      throw ValidationError(at(member),
                            std::string(member + 1) + " " + std::to_string(value) +
                                (op.kind != OpKind::Multicast
                                     ? " on a " + to_string(op.kind) + ": only multicasts have one"
                                     : " must be " + allowed));
    };
    const auto receivers = static_cast<std::int64_t>(op.peers.size());
    if (op.fork != 0 && (op.kind != OpKind::Multicast || !multicast_forks(receivers, op.fork)))
      refuse(".fork", op.fork,
             "0 (no split) or in [1, " + std::to_string(receivers) + ") (its receivers)");
    const std::int64_t chained = receivers - op.fork;  // the receivers the groups cut
    if (op.group != 0 && (op.kind != OpKind::Multicast || op.group < 2 || op.group >= chained))
      refuse(".group", op.group,
             "0 (one chain) or in [2, " + std::to_string(chained) + ") (its receivers" +
                 (op.fork ? " after the fork)" : ")"));
    const Shape& shape = src_.shape();
    if (op.box.ndim() != shape.size())
      throw ValidationError(at(".box"), "has " + std::to_string(op.box.ndim()) +
                                            " dimensions but the tensor has " +
                                            std::to_string(shape.size()));
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (op.box[d].lo >= op.box[d].hi)
        throw ValidationError(at(".box"), brief(op.box) + " is empty in dimension " +
                                              std::to_string(d) + " (needs lo < hi)");
      if (op.box[d].lo < 0 || op.box[d].hi > shape[d])
        throw ValidationError(at(".box"), brief(op.box) + " lies outside the tensor of shape " +
                                              brief(shape_str(shape)));
    }
    const auto me = static_cast<std::uint32_t>(i);
    switch (op.kind) {
      case OpKind::Copy: {
        no_peers(op, {i, ".peers"}, "a copy");
        complete_source({i, ".kind"}, "copied");
        src_holder(op.root, op.box, {i, ".root"});
        const auto d = dst_holder(op.root, op.box, {i, ".root"});
        expect(d, Content::Value, {i, ".root"});
        writes_.push_back({d, me});
        return;
      }
      case OpKind::Zero: {
        no_peers(op, {i, ".peers"}, "a zero-fill");
        const auto d = dst_holder(op.root, op.box, {i, ".root"});
        expect(d, Content::Zero, {i, ".root"});
        writes_.push_back({d, me});
        return;
      }
      case OpKind::Multicast: {
        if (op.peers.empty())
          throw ValidationError(at(".peers"), "a multicast needs at least one receiver");
        distinct(op.peers, {i, ".peers"});
        if (std::find(op.peers.begin(), op.peers.end(), op.root) != op.peers.end())
          throw ValidationError(at(".peers"), "names the root, device " + std::to_string(op.root) +
                                                  ": a device does not send to itself");
        Content c = Content::Value;
        if (op.from_dst) {
          const auto r = dst_holder(op.root, op.box, {i, ".root"});
          c = need(r);
          reads_.push_back({r, me});
        } else {
          complete_source({i, ".from_dst"}, "sent");
          src_holder(op.root, op.box, {i, ".root"});
        }
        for (std::size_t k = 0; k < op.peers.size(); ++k) {
          const auto d = dst_holder(op.peers[k], op.box, {i, ".peers", k});
          expect(d, c, {i, ".peers", k});
          writes_.push_back({d, me});
        }
        return;
      }
      case OpKind::Reduce: {
        const std::int64_t groups = src_.partial_groups();
        if (static_cast<std::int64_t>(op.peers.size()) != groups)
          throw ValidationError(at(".peers"), "names " + std::to_string(op.peers.size()) +
                                                  " contributors for the source's " +
                                                  std::to_string(groups) + " addend(s)");
        for (std::size_t g = 0; g < op.peers.size(); ++g) {
          const auto s = src_holder(op.peers[g], op.box, {i, ".peers", g});
          if (src_.partial_group(s) != static_cast<std::int64_t>(g))
            throw ValidationError(Where{i, ".peers", g}.str(),
                                  "device " + std::to_string(op.peers[g]) + " holds addend " +
                                      std::to_string(src_.partial_group(s)) + ", not " +
                                      std::to_string(g) +
                                      " (contributors are listed in addend order)");
        }
        const auto d = dst_holder(op.root, op.box, {i, ".root"});
        expect(d, Content::Value, {i, ".root"});
        writes_.push_back({d, me});
        return;
      }
    }
    throw ValidationError(at(".kind"), "unknown op kind");
  }

  // Two transfers on one stream would share their tags: the receiver could take one's data for
  // the other's. (Copies and zero-fills send nothing; their streams may repeat.)
  void distinct_streams() const {
    std::vector<std::pair<std::int64_t, std::size_t>> s;  // (stream, op)
    for (std::size_t i = 0; i < p_.ops().size(); ++i)
      if (const Op& op = p_.ops()[i]; op.kind == OpKind::Multicast || op.kind == OpKind::Reduce)
        s.emplace_back(op.stream, i);
    std::sort(s.begin(), s.end());
    for (std::size_t k = 1; k < s.size(); ++k)
      if (s[k].first == s[k - 1].first)
        throw ValidationError(Where{s[k].second, ".stream"}.str(),
                              "stream " + std::to_string(s[k].first) + " is also " +
                                  op_field(s[k - 1].second) +
                                  "'s: the transfers of a plan have distinct streams");
  }

  static void no_peers(const Op& op, const Where& w, const char* what) {
    if (!op.peers.empty()) throw ValidationError(w.str(), std::string(what) + " has no peers");
  }

  static void distinct(const std::vector<int>& ids, const Where& w) {
    if (ids.size() < 2) return;
    std::vector<int> s = ids;
    std::sort(s.begin(), s.end());
    const auto it = std::adjacent_find(s.begin(), s.end());
    if (it != s.end())
      throw ValidationError(w.str(), "device " + std::to_string(*it) + " appears twice");
  }

  void complete_source(const Where& w, const char* verb) const {
    if (src_.partial_groups() != 1)
      throw ValidationError(w.str(), "the source is a pending sum (" + brief(src_.spec().str()) +
                                         "): one device's addend cannot be " + verb +
                                         " as the value (a reduce sums the addends)");
  }

  static const Box& tile(const Layout& l, std::vector<Box>& cache, std::int64_t i) {
    Box& b = cache[static_cast<std::size_t>(i)];
    if (b.ndim() == 0) b = l.tile_at(i);
    return b;
  }

  // The mesh index of a device whose tile of `l` contains `box`; else ValidationError(w).
  static std::int64_t holder(const Layout& l, std::vector<Box>& cache, int device, const Box& box,
                             const Where& w, const char* side) {
    const auto i = l.mesh().index_of(device);
    if (!i)
      throw ValidationError(
          w.str(), "device " + std::to_string(device) + " is not in the " + side + " mesh");
    const Box& t = tile(l, cache, *i);
    if (!t.contains(box))
      throw ValidationError(w.str(), "device " + std::to_string(device) + " does not hold " +
                                         brief(box) + " in the " + side + " layout (its tile is " +
                                         brief(t) + ")");
    return *i;
  }
  std::int64_t src_holder(int device, const Box& box, const Where& w) {
    return holder(src_, src_tiles_, device, box, w, "source");
  }
  std::int64_t dst_holder(int device, const Box& box, const Where& w) {
    return holder(dst_, dst_tiles_, device, box, w, "target");
  }

  Content need(std::int64_t d) const {
    return dst_.spec().is_partial() && dst_.partial_group(d) != 0 ? Content::Zero : Content::Value;
  }
  void expect(std::int64_t d, Content c, const Where& w) const {
    if (need(d) == c) return;
    const std::string dev = "device " + std::to_string(dst_.mesh().device(d));
    throw ValidationError(
        w.str(), c == Content::Value
                     ? dev + " holds addend " + std::to_string(dst_.partial_group(d)) +
                           " of the partial target: it is zero-filled, not given the value"
                     : dev +
                           " needs the value, not zeros (only addends other than the first of a "
                           "partial target are zero-filled)");
  }

  // ---- Coverage: every target element of every target device written exactly once ----
  struct Access {
    std::int64_t device;  // target mesh index
    std::uint32_t op;
  };

  // The ops of `a` grouped by device, in op order; device i's are [start[i], start[i + 1]).
  static std::vector<std::uint32_t> by_device(const std::vector<Access>& a, std::int64_t n,
                                              std::vector<std::size_t>& start) {
    start.assign(static_cast<std::size_t>(n) + 1, 0);
    for (const Access& x : a) ++start[static_cast<std::size_t>(x.device) + 1];
    for (std::size_t i = 1; i < start.size(); ++i) start[i] += start[i - 1];
    std::vector<std::size_t> at(start.begin(), start.end() - 1);
    std::vector<std::uint32_t> out(a.size());
    for (const Access& x : a) out[at[static_cast<std::size_t>(x.device)]++] = x.op;
    return out;
  }

  void coverage() {
    const std::int64_t n = dst_.mesh().size();
    std::vector<std::size_t> ws, rs;
    const auto w = by_device(writes_, n, ws), r = by_device(reads_, n, rs);
    budget_ = kBaseWork + kWorkPerWrite * static_cast<std::int64_t>(writes_.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      device(i, std::span(w).subspan(ws[k], ws[k + 1] - ws[k]),
             std::span(r).subspan(rs[k], rs[k + 1] - rs[k]));
    }
  }

  const Box& box_of(std::uint32_t op) const { return p_.ops()[op].box; }
  int phase_of(std::uint32_t op) const { return p_.ops()[op].phase; }

  void spend(std::int64_t work, int dev) {
    work_ += work;
    if (work_ > budget_)
      throw ValidationError("plan.ops", "the boxes written on device " + std::to_string(dev) +
                                            " are too fragmented to verify within the checker's "
                                            "work bound");
  }

  [[noreturn]] void overlap(std::uint32_t a, std::uint32_t b, int dev) const {
    if (a > b) std::swap(a, b);
    throw ValidationError(op_field(b), "writes " + brief(intersect(box_of(a), box_of(b))) +
                                           " of device " + std::to_string(dev) + ", which " +
                                           op_field(a) + " also writes");
  }

  [[noreturn]] void unwritten(std::uint32_t op, int dev) const {
    throw ValidationError(op_field(op) + ".from_dst",
                          "device " + std::to_string(dev) + " forwards " + brief(box_of(op)) +
                              " from its target buffer before all of it is written (in a phase "
                              "before " +
                              std::to_string(phase_of(op)) + ")");
  }

  // Target device `i`: `w` the ops writing it, `r` the ops forwarding from its target buffer.
  // Every box lies in its tile (check_op), so the boxes tile it exactly when they are pairwise
  // disjoint and their volumes add up to the tile's.
  void device(std::int64_t i, std::span<const std::uint32_t> w, std::span<const std::uint32_t> r) {
    const Box& t = tile(dst_, dst_tiles_, i);
    const int dev = dst_.mesh().device(i);
    const std::int64_t volume = t.volume();
    // Unsigned, capped at volume + 1: enough to tell, and no overflow (a volume may be 2^63 - 1).
    const auto whole = static_cast<std::uint64_t>(volume);
    std::uint64_t sum = 0;
    for (auto op : w)
      sum = std::min(sum + static_cast<std::uint64_t>(box_of(op).volume()), whole + 1);
    if (sum < whole)
      throw ValidationError("plan.ops", std::to_string(whole - sum) + " of the " +
                                            std::to_string(volume) + " elements of device " +
                                            std::to_string(dev) + "'s target tile " + brief(t) +
                                            " are never written");
    std::optional<Grid> grid;
    if (w.size() > kFewBoxes) {
      std::vector<const Box*> boxes;
      for (auto op : w) boxes.push_back(&box_of(op));
      for (auto op : r) boxes.push_back(&box_of(op));
      grid.emplace(t, boxes);
      if (grid->cells() > kMaxCells || work_ + grid->cells() > budget_) grid.reset();
    }
    if (grid) {
      spend(grid->cells(), dev);
      grid->allocate();
      for (auto op : w)
        grid->each(box_of(op), [&](std::size_t c) {
          spend(1, dev);
          if (grid->at(c)) overlap(grid->at(c) - 1, op, dev);
          grid->at(c) = op + 1;
        });
      for (auto op : r)
        grid->each(box_of(op), [&](std::size_t c) {
          spend(1, dev);
          const std::uint32_t by = grid->at(c);
          if (!by || phase_of(by - 1) >= phase_of(op)) unwritten(op, dev);
        });
    } else {
      // Sorted by their first dimension's lower bound, a box can meet only the boxes after it
      // that start before it ends there.
      std::vector<std::uint32_t> order(w.begin(), w.end());
      std::sort(order.begin(), order.end(),
                [&](auto a, auto b) { return box_of(a)[0].lo < box_of(b)[0].lo; });
      for (std::size_t a = 0; a < order.size(); ++a)
        for (std::size_t b = a + 1;
             b < order.size() && box_of(order[b])[0].lo < box_of(order[a])[0].hi; ++b) {
          spend(1, dev);
          if (shared(box_of(order[a]), box_of(order[b]))) overlap(order[a], order[b], dev);
        }
      // The boxes being disjoint, a forwarded box is written before it is read when its
      // overlaps with the boxes written in earlier phases add up to it.
      for (auto op : r) {
        spend(static_cast<std::int64_t>(w.size()), dev);
        std::int64_t covered = 0;
        for (auto x : w)
          if (phase_of(x) < phase_of(op)) covered += shared(box_of(x), box_of(op));
        if (covered != box_of(op).volume()) unwritten(op, dev);
      }
    }
    if (sum != whole)  // disjoint boxes inside the tile cannot add up to more than it
      throw ValidationError(
          "plan.ops", "device " + std::to_string(dev) + " has elements written more than once");
  }

  const Plan& p_;
  const Layout& src_;
  const Layout& dst_;
  std::vector<Box> src_tiles_, dst_tiles_;  // by mesh index, computed when first needed
  std::vector<Access> writes_;              // a target device written by an op
  std::vector<Access> reads_;               // a target device forwarding from its target buffer
  std::int64_t work_ = 0, budget_ = 0;
};

}  // namespace plan_check

void check_plan(const Plan& p) { plan_check::PlanChecker(p).run(true); }
void check_plan_ops(const Plan& p) { plan_check::PlanChecker(p).run(false); }

}  // namespace meshcast::detail
