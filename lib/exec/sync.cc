// The sync executor: a device's local ops and messages, phase by phase. Within a phase it posts
// messages in the plan's order (the same on every device) while the staging they need fits the
// bound and fewer than kMaxInFlight are in flight, and retires them as they complete. The
// earliest message not yet complete anywhere can always be posted by all its devices (what they
// hold in flight is earlier, hence complete), so the window cannot deadlock; two messages that
// share a tag (streams beyond the group's window) are never in flight together on a device, so
// chains of different messages never meet.
#include "meshcast/sync.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <unordered_set>

#include "lib/exec/executor.h"
#include "lib/exec/signatures.h"
#include "lib/support/text.h"
#include "meshcast/error.h"

namespace meshcast {
namespace {

constexpr std::size_t kMaxInFlight = 64;

// Staging ranges start at multiples of this: a reduce's addends are read as floats and doubles
// (and by GPU kernels), whatever odd-sized message sits before them.
constexpr std::int64_t kAlign = 64;
// (Rounded down where rounding up would pass 2^63: a bound of max_staging_bytes near it.)
std::int64_t aligned(std::int64_t n) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  return n > kMax - (kAlign - 1) ? kMax / kAlign * kAlign : (n + kAlign - 1) / kAlign * kAlign;
}

// First-fit ranges of one staging buffer, kept by the communicator from sync to sync: a fresh
// allocation per message (or per sync) pays its page faults every time, which was most of a
// sync's time on the local backend.
class Arena {
 public:
  void reset(std::int64_t bytes) {
    free_.clear();
    if (bytes > 0) free_[0] = bytes;
  }
  // An offset of n free bytes, or -1.
  std::int64_t take(std::int64_t n) {
    if (n == 0) return 0;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < n) continue;
      const std::int64_t at = it->first, rest = it->second - n;
      free_.erase(it);
      if (rest > 0) free_[at + n] = rest;
      return at;
    }
    return -1;
  }
  void give(std::int64_t at, std::int64_t n) {
    if (n == 0) return;
    auto next = free_.lower_bound(at);
    if (next != free_.end() && next->first == at + n) {  // merge with the range after
      n += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {  // and the one before
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        prev->second += n;
        return;
      }
    }
    free_[at] = n;
  }

 private:
  std::map<std::int64_t, std::int64_t> free_;  // offset -> length
};

// A batch of posts (one NCCL group), closed however the posting ends.
class Batch {
 public:
  explicit Batch(Communicator& c) : c_(c) { c_.begin_batch(); }
  ~Batch() { c_.end_batch(); }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

 private:
  Communicator& c_;
};

struct Pending {
  const SyncPlan::Message* msg;
  std::vector<Request> reqs;
  char* staging = nullptr;   // in the arena
  std::int64_t at = 0;       // its offset there
  std::int64_t staged = 0;   // its bytes there (aligned), counted against the bound
  std::int64_t chained = 0;  // a chain's own staging, counted too
  int tag = 0;
};

class SyncExecutor final : public Transfer::Executor {
 public:
  SyncExecutor(const SyncPlan& plan, const Group& group, std::span<const void* const> src,
               std::span<void* const> dst)
      : Executor(group.comm()), plan_(plan), group_(group) {
    const auto n = plan.tensors().size();
    if (src.size() != n || dst.size() != n)
      throw ValidationError(src.size() != n ? "src" : "dst",
                            "has " + std::to_string(src.size() != n ? src.size() : dst.size()) +
                                " buffers for " + std::to_string(n) + " tensors");
    if (plan.device() != me_)
      throw ValidationError("plan", "is device " + std::to_string(plan.device()) +
                                        "'s part, but this is device " + std::to_string(me_));
    tensors_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const TensorMove& t = plan.tensors()[i];
      Tensor& x = tensors_[i];
      x.src = const_cast<void*>(src[i]);
      x.dst = dst[i];
      x.src_type = t.src.dtype();
      x.dst_type = t.dst.dtype();
      if (t.src.mesh().contains(me_)) x.src_tile = t.src.tile_of(me_);
      if (t.dst.mesh().contains(me_)) x.dst_tile = t.dst.tile_of(me_);
      const auto field = [&](const char* side) {
        return std::string(side) + "[" + std::to_string(i) + "]";
      };
      if (!x.src && x.src_tile.ndim() && !x.src_tile.empty())
        throw ValidationError(field("src"), detail::quote(t.name, detail::kNameWidth) +
                                                ": device " + std::to_string(me_) +
                                                " holds a source tile but passed nullptr");
      if (!x.dst && x.dst_tile.ndim() && !x.dst_tile.empty())
        throw ValidationError(field("dst"), detail::quote(t.name, detail::kNameWidth) +
                                                ": device " + std::to_string(me_) +
                                                " receives a target tile but passed nullptr");
    }
    // The arena: the bound, or less when this device's messages together need less.
    std::int64_t need = 0;
    for (const auto& m : plan.messages()) need += aligned(staging_of(m));
    arena_bytes_ = std::min(aligned(plan.options().max_staging_bytes), need);
  }

 private:
  struct Tensor {
    void* src = nullptr;
    void* dst = nullptr;
    DType src_type = DType::f32, dst_type = DType::f32;
    Box src_tile, dst_tile;
  };

  bool advance(bool block) override {
    const auto& msgs = plan_.messages();
    const auto differ = [&](int d, std::uint64_t theirs, std::uint64_t mine) {
      differ_from(d, theirs, mine);
    };
    if (!signed_) {  // the words, on the first tag (the messages' are the next ones)
      signed_ = true;
      auto [to, from] = detail::signature_words(
          msgs, me_, plan_.model_digest() << 24, [](detail::Fnv& f, const SyncPlan::Message& m) {
            f.add(m.phase).add(static_cast<std::int64_t>(m.kind)).add(m.root).add(m.group);
            f.add(m.fork);
            f.add(m.stream).add(m.packed ? 1 : 0).add(m.bytes);
            for (int p : m.peers) f.add(p);
            for (const auto& s : m.segments) {
              f.add(s.tensor).add(s.from_dst ? 1 : 0);
              for (const auto& r : s.box.ranges()) f.add(r.lo).add(r.hi);
            }
          });
      signatures_.post(comm_, tags_.tag(0), std::move(to), std::move(from));
      busy_tags_.insert(tags_.tag(0));  // no message on the words' tag while they travel
    }
    // A sender's word as it arrives (also while a wait blocks): another plan is named at once.
    const detail::WaitHook check(comm_, [&] { words_arrived(differ); });
    try {
      return run(block, differ);
    } catch (const CommError& e) {
      // A message of another length may complete before its sender's word is checked: that
      // word, when it comes within a moment and differs, names the cause (another model or plan).
      try {
        if (e.field() == "length")
          signatures_.await_from(comm_, e.device(), differ, std::chrono::milliseconds(500));
      } catch (const ValidationError&) {
        throw;
      } catch (...) {  // the failure to report is the first
      }
      throw;
    }
  }

  // advance()'s loop, with the words posted.
  bool run(bool block, const detail::PeerSignatures::Differ& differ) {
    const auto& msgs = plan_.messages();
    while (true) {
      bool moved = retire();
      words_arrived(differ);
      if (!phase_started_) {
        if (next_ == msgs.size() && next_local_ == plan_.locals().size()) {
          if (!block) return words_done_;
          signatures_.wait_all(comm_, differ);
          return true;
        }
        start_phase();
        moved = true;
      }
      {
        Batch batch(comm_);
        while (next_ < msgs.size() && msgs[next_].phase == phase_ && fits(msgs[next_]) &&
               post(msgs[next_])) {
          ++next_;
          moved = true;
        }
      }
      if (pending_.empty() && (next_ == msgs.size() || msgs[next_].phase != phase_)) {
        phase_started_ = false;  // the phase completed: the next one may read what it wrote
        continue;
      }
      if (moved) continue;
      if (!block) return false;
      if (pending_.empty()) {  // only the words' tag holds the next message back
        signatures_.wait_all(comm_, differ);
        words_arrived(differ);
        continue;
      }
      Pending& p = pending_.front();  // the oldest: the first to free what the next one needs
      for (auto& r : p.reqs)
        if (r.valid()) comm_.wait(r);
    }
  }

  // Checks the words that arrived; once all did, their tag is free for messages.
  void words_arrived(const detail::PeerSignatures::Differ& differ) {
    if (words_done_ || !signatures_.test(comm_, differ)) return;
    words_done_ = true;
    busy_tags_.erase(tags_.tag(0));
  }

  // A peer's word that is not this device's: names the model or the plan.
  [[noreturn]] void differ_from(int device, std::uint64_t theirs, std::uint64_t mine) const {
    const std::string who = "device " + std::to_string(device);
    if ((theirs ^ mine) >> 24)
      throw ValidationError("model", who + " syncs another model than this device's " +
                                         std::to_string(plan_.tensors().size()) +
                                         " tensors (their names, shapes, dtypes or layouts)");
    throw ValidationError("plan", who +
                                      " exchanges other messages with this device than this "
                                      "device's sync plan says (a plan made with other "
                                      "options or another topology)");
  }

  void cancel_all() override {
    signatures_.cancel(comm_);
    for (auto& p : pending_)
      for (auto& r : p.reqs)
        if (r.valid()) comm_.cancel(r);
  }

  // The phase's local ops (copies, zero-fills) run at its start.
  void start_phase() {
    const auto& locals = plan_.locals();
    const auto& msgs = plan_.messages();
    phase_ = next_ < msgs.size() ? msgs[next_].phase : locals[next_local_].op.phase;
    if (next_local_ < locals.size()) phase_ = std::min(phase_, locals[next_local_].op.phase);
    for (; next_local_ < locals.size() && locals[next_local_].op.phase == phase_; ++next_local_) {
      const auto& [t, op] = locals[next_local_];
      Tensor& x = tensors_[static_cast<std::size_t>(t)];
      if (op.root != me_) continue;
      if (op.kind == OpKind::Zero)
        local().zero(dst_region(x, op.box));
      else
        convert(src_region(x, op.box), x.src_type, dst_region(x, op.box), x.dst_type);
    }
    phase_started_ = true;
  }

  void convert(const Region& from, DType from_type, const Region& to, DType to_type) {
    if (from_type == to_type)
      local().copy(from, to);
    else
      local().convert(from, from_type, to, to_type);
  }

  std::int64_t staging_of(const SyncPlan::Message& m) const {
    if (m.kind == OpKind::Reduce)
      return m.root == me_ ? m.bytes * static_cast<std::int64_t>(m.peers.size()) : 0;
    return m.packed ? m.bytes : 0;
  }

  // What a chain allocates for itself: a strided box of a multicast to several receivers is
  // staged by the chain engine (lib/exec/chain.cc), at most the transport's chain_staging_bytes.
  std::int64_t chain_staging_of(const SyncPlan::Message& m) const {
    if (m.packed || m.kind != OpKind::Multicast || m.peers.size() < 2) return 0;
    const auto& s = m.segments[0];
    const Tensor& x = tensors_[static_cast<std::size_t>(s.tensor)];
    const Region r = m.root == me_ && !s.from_dst ? src_region(x, s.box) : dst_region(x, s.box);
    if (r.is_contiguous()) return 0;
    return std::min(m.bytes, static_cast<std::int64_t>(comm_.caps().chain_staging_bytes));
  }

  // Whether m may be posted now: its staging (the arena's and a chain's own) fits the bound
  // beside what is in flight. With nothing in flight it always may (the planner keeps every
  // message's staging within the bound), so the window cannot stall.
  bool fits(const SyncPlan::Message& m) const {
    if (pending_.size() >= kMaxInFlight) return false;
    if (busy_tags_.count(tags_.tag(static_cast<std::size_t>(m.stream) + 1))) return false;
    return pending_.empty() || in_flight_ + aligned(staging_of(m)) + chain_staging_of(m) <=
                                   aligned(plan_.options().max_staging_bytes);
  }

  Region src_region(const Tensor& x, const Box& b) const {
    require(x.src_tile.ndim() && x.src_tile.contains(b), "source");
    return Region::of(x.src, dtype_size(x.src_type), x.src_tile, b);
  }
  Region dst_region(const Tensor& x, const Box& b) const {
    require(x.dst_tile.ndim() && x.dst_tile.contains(b), "target");
    return Region::of(x.dst, dtype_size(x.dst_type), x.dst_tile, b);
  }
  void require(bool ok, const char* side) const {
    if (!ok)
      throw ValidationError("plan", "device " + std::to_string(me_) +
                                        " is asked for a box outside its " + side + " tile");
  }
  // A segment's place in a packed buffer: its box, row-major, in `type`.
  static Region packed(char* base, const Box& box, DType type) {
    Region r;
    r.base = base;
    r.elem_size = dtype_size(type);
    r.extent = box.extents();
    r.offset.assign(r.extent.size(), 0);
    r.count = r.extent;
    return r;
  }

  // Posts m if its staging fits in the arena now; false if not.
  bool post(const SyncPlan::Message& m) {
    Pending p{&m,
              {},
              nullptr,
              0,
              aligned(staging_of(m)),
              chain_staging_of(m),
              tags_.tag(static_cast<std::size_t>(m.stream) + 1)};
    if (p.staged > 0) {
      if (!arena_buf_) {
        arena_buf_ = comm_.kept_scratch(static_cast<std::size_t>(arena_bytes_));
        arena_.reset(arena_bytes_);
      }
      p.at = arena_.take(p.staged);
      if (p.at < 0) {
        if (pending_.empty())
          throw InternalError("sync", "a message needs " + std::to_string(p.staged) +
                                          " bytes of staging, more than the bound of " +
                                          std::to_string(arena_bytes_));
        return false;
      }
      p.staging = static_cast<char*>(arena_buf_.get()) + p.at;
    }
    if (m.kind == OpKind::Reduce)
      post_reduce(m, p);
    else
      post_multicast(m, p);
    busy_tags_.insert(p.tag);
    in_flight_ += p.staged + p.chained;
    pending_.push_back(std::move(p));
    return true;
  }

  void post_multicast(const SyncPlan::Message& m, Pending& p) {
    const bool root = m.root == me_;
    Region r;
    if (!m.packed) {  // one box, sent from and received into the buffers themselves
      const auto& s = m.segments[0];
      const Tensor& x = tensors_[static_cast<std::size_t>(s.tensor)];
      r = root && !s.from_dst ? src_region(x, s.box) : dst_region(x, s.box);
    } else {
      r = Region::contiguous(p.staging, static_cast<std::size_t>(m.bytes));
      if (root) {
        char* at = p.staging;
        for (const auto& s : m.segments) {
          const Tensor& x = tensors_[static_cast<std::size_t>(s.tensor)];
          const Region to = packed(at, s.box, x.dst_type);
          if (s.from_dst)
            local().copy(dst_region(x, s.box), to);
          else
            convert(src_region(x, s.box), x.src_type, to, x.dst_type);
          at += to.bytes();
        }
      }
    }
    if (m.peers.size() == 1) {
      p.reqs.push_back(root ? comm_.isend(r, m.peers[0], p.tag) : comm_.irecv(r, m.root, p.tag));
      return;
    }
    std::vector<int> chain{m.root};
    chain.insert(chain.end(), m.peers.begin(), m.peers.end());
    p.reqs.push_back(comm_.ibcast(r, m.root, chain, p.tag, m.group, m.fork));
  }

  // Contributors send their addend of the box unpacked; the root stages every addend (its own
  // copied) and sums them in addend order once all arrived.
  void post_reduce(const SyncPlan::Message& m, Pending& p) {
    const auto& s = m.segments[0];
    const Tensor& x = tensors_[static_cast<std::size_t>(s.tensor)];
    if (m.root != me_) {
      p.reqs.push_back(comm_.isend(src_region(x, s.box), m.root, p.tag));
      return;
    }
    dst_region(x, s.box);  // validates the box before staging it
    char* at = p.staging;
    for (int c : m.peers) {
      const Region slot = packed(at, s.box, x.src_type);
      if (c == me_)
        local().copy(src_region(x, s.box), slot);
      else
        p.reqs.push_back(comm_.irecv(slot, c, p.tag));
      at += slot.bytes();
    }
  }

  // Retires every message that completed: unpacks what it brought, frees its staging.
  bool retire() {
    bool any = false;
    for (auto it = pending_.begin(); it != pending_.end();) {
      bool complete = true;
      for (auto& r : it->reqs)
        if (r.valid() && !comm_.test(r)) {
          complete = false;
          break;
        }
      if (!complete) {
        ++it;
        continue;
      }
      deliver(*it);
      arena_.give(it->at, it->staged);
      in_flight_ -= it->staged + it->chained;
      busy_tags_.erase(it->tag);
      it = pending_.erase(it);
      any = true;
    }
    return any;
  }

  void deliver(Pending& p) {
    const SyncPlan::Message& m = *p.msg;
    if (m.kind == OpKind::Reduce) {
      if (m.root != me_) return;
      const auto& s = m.segments[0];
      const Tensor& x = tensors_[static_cast<std::size_t>(s.tensor)];
      char* base = p.staging;
      const Region sum = packed(base, s.box, x.src_type);
      for (std::size_t g = 1; g < m.peers.size(); ++g)
        local().add(packed(base + g * sum.bytes(), s.box, x.src_type), sum, x.src_type);
      convert(sum, x.src_type, dst_region(x, s.box), x.dst_type);
      return;
    }
    if (m.root == me_ || !m.packed) return;
    const char* at = p.staging;
    for (const auto& s : m.segments) {
      const Tensor& x = tensors_[static_cast<std::size_t>(s.tensor)];
      const Region from = packed(const_cast<char*>(at), s.box, x.dst_type);
      local().copy(from, dst_region(x, s.box));
      at += from.bytes();
    }
  }

  const SyncPlan plan_;  // the device's part, kept: the caller's may go
  Group group_;          // keeps the group's tags reserved while the sync is in flight
  std::vector<Tensor> tensors_;
  std::int64_t arena_bytes_ = 0;
  std::int64_t in_flight_ = 0;  // staging of the messages in flight (Pending::staged + chained)
  std::shared_ptr<void> arena_buf_;
  Arena arena_;
  std::deque<Pending> pending_;
  std::unordered_set<int> busy_tags_;
  detail::PeerSignatures signatures_;
  bool signed_ = false, words_done_ = false;  // the words posted; all arrived and checked
  std::size_t next_ = 0, next_local_ = 0;
  int phase_ = 0;
  bool phase_started_ = false;
};

}  // namespace

Transfer isync(const SyncPlan& plan, const Group& group, std::span<const void* const> src,
               std::span<void* const> dst) {
  Communicator& comm = group.comm();
  std::shared_ptr<Transfer::Executor> exec;
  try {
    std::vector<const Mesh*> meshes;
    bool mine = false;
    for (const TensorMove& t : plan.tensors()) {
      meshes.push_back(&t.src.mesh());
      meshes.push_back(&t.dst.mesh());
      mine = mine || t.src.mesh().contains(comm.rank()) || t.dst.mesh().contains(comm.rank());
    }
    detail::check_members(group, meshes);
    if (mine) exec = std::make_shared<SyncExecutor>(plan, group, src, dst);
  } catch (const std::exception& e) {
    comm.abandon_for(e);
    throw;
  }
  // One tag more than the plan's streams: the signatures' (lib/exec/signatures.h).
  return Transfer::Executor::start(std::move(exec), group,
                                   static_cast<std::size_t>(plan.streams()) + 1);
}

void sync(const SyncPlan& plan, const Group& group, std::span<const void* const> src,
          std::span<void* const> dst) {
  isync(plan, group, src, dst).wait();
}

}  // namespace meshcast
