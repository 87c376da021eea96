// The executor: walks a plan's ops phase by phase, posting every transfer of a phase (as one
// batch) before waiting on any, so a device never blocks on an order its peers do not share. It
// advances only inside test()/wait() (or when a later operation on its group needs its tags), so
// that a caller can compute while a reshard is in flight.
#include "meshcast/reshard.h"

#include <algorithm>
#include <exception>
#include <map>
#include <unordered_map>
#include <vector>

#include "lib/exec/executor.h"
#include "lib/exec/signatures.h"
#include "lib/support/raised.h"
#include "meshcast/error.h"

namespace meshcast {
namespace {

// The layout's digest: its shape, mesh and spec (16 bits).
std::uint64_t layout_bits(const Layout& l) {
  detail::Fnv f;
  for (auto d : l.shape()) f.add(d);
  f.add(l.str());
  return f.h & 0xffff;
}

// The signature words (lib/exec/signatures.h) this device sends and expects, per peer: the
// dtype (the top 8 bits), the source and target layouts (16 bits each) and the ops the two take
// part in together (24 bits): what both compute alike from plans that agree.
std::pair<detail::PeerSignatures::Words, detail::PeerSignatures::Words> signature_words(
    const RankPlan& plan, int me) {
  const std::uint64_t common = static_cast<std::uint64_t>(plan.src().dtype()) << 56 |
                               layout_bits(plan.src()) << 40 | layout_bits(plan.dst()) << 24;
  return detail::signature_words(plan.ops(), me, common, [](detail::Fnv& f, const Op& op) {
    f.add(static_cast<std::int64_t>(op.kind)).add(op.phase).add(op.root).add(op.stream);
    f.add(op.group).add(op.fork).add(op.from_dst ? 1 : 0);
    for (int p : op.peers) f.add(p);
    for (const auto& r : op.box.ranges()) f.add(r.lo).add(r.hi);
  });
}

// A peer's word that is not this device's: names the first part that differs.
[[noreturn]] void differ_from(const RankPlan& plan, int device, std::uint64_t theirs,
                              std::uint64_t mine) {
  const std::string who = "device " + std::to_string(device);
  if ((theirs ^ mine) >> 56) {
    const auto t = static_cast<std::uint8_t>(theirs >> 56);
    if (t > static_cast<std::uint8_t>(DType::c128))
      throw ValidationError("plan", who + " runs another operation than this device's reshard");
    throw ValidationError("dtype", who + " reshards " + to_string(static_cast<DType>(t)) +
                                       " where this device reshards " +
                                       to_string(plan.src().dtype()));
  }
  const auto layout = [&](int shift, const char* field, const char* what, const Layout& mine_l) {
    if (((theirs ^ mine) >> shift) & 0xffff)
      throw ValidationError(field, who + " has another " + what + " layout than this device's " +
                                       mine_l.str() + " of shape " + shape_str(mine_l.shape()));
  };
  layout(40, "src", "source", plan.src());
  layout(24, "dst", "target", plan.dst());
  throw ValidationError("plan", who +
                                    " exchanges other messages with this device than this "
                                    "device's plan says (a plan made with other options or "
                                    "another topology)");
}

struct PendingReduce {
  const Op* op;
  std::vector<std::shared_ptr<void>> staging;  // per contributor (null for the root's own)
  std::vector<Request> reqs;
};

class ReshardExecutor final : public Transfer::Executor {
 public:
  ReshardExecutor(RankPlan part, const Group& group, const void* src, void* dst)
      : Executor(group.comm()),
        plan_(std::move(part)),
        group_(group),
        src_(const_cast<void*>(src)),
        dst_(dst),
        elem_(dtype_size(plan_.src().dtype())) {
    const RankPlan& plan = plan_;
    if (plan.device() != me_)
      throw ValidationError("plan", "is device " + std::to_string(plan.device()) +
                                        "'s part, but this is device " + std::to_string(me_));
    if (plan.src().mesh().contains(me_)) {
      src_tile_ = plan.src().tile_of(me_);
      if (!src_ && !src_tile_.empty())
        throw ValidationError("src_local", "device " + std::to_string(me_) +
                                               " holds a source tile but passed nullptr");
    }
    if (plan.dst().mesh().contains(me_)) {
      dst_tile_ = plan.dst().tile_of(me_);
      if (!dst_ && !dst_tile_.empty())
        throw ValidationError("dst_local", "device " + std::to_string(me_) +
                                               " receives a target tile but passed nullptr");
    }
  }

 private:
  void cancel_all() override {
    signatures_.cancel(comm_);
    for (auto& r : reqs_) comm_.cancel(r);
    for (auto& p : reduces_)
      for (auto& r : p.reqs) comm_.cancel(r);
  }

  // Posts the phases whose predecessors completed; `block`: wait for each instead of testing.
  // True once every op of the plan completed.
  bool advance(bool block) override {
    const auto& ops = plan_.ops();
    const auto differ = [&](int d, std::uint64_t theirs, std::uint64_t mine) {
      differ_from(plan_, d, theirs, mine);
    };
    while (true) {
      if (started_) {
        if (!post_phase(block, differ)) return false;  // the rest of it, where tags are reused
        // A sender's word as it arrives: a sender with another plan is named at once, also
        // where its data would never come (other tags).
        if (!block && !(signatures_.test(comm_, differ), phase_complete())) return false;
        const detail::WaitHook check(comm_, [&] { signatures_.test(comm_, differ); });
        for (auto& r : reduces_) sum(r);
        comm_.wait_all(reqs_);
        reqs_.clear();
        reduces_.clear();
      }
      if (next_ == ops.size()) {
        if (!block) return signatures_.test(comm_, differ);
        signatures_.wait_all(comm_, differ);
        return true;
      }
      started_ = true;
      phase_ = ops[next_].phase;
      held_.clear();  // the last phase completed
    }
  }

  // Posts the ops of the phase from next_ on; false (!block) where one's tag is still held.
  bool post_phase(bool block, const detail::PeerSignatures::Differ& differ) {
    const auto& ops = plan_.ops();
    // Not on a batching transport (NCCL): a request there completes with its whole batch.
    const bool wraps =
        static_cast<std::int64_t>(tags_.length()) < plan_.streams() + 1 && !comm_.caps().batches;
    comm_.begin_batch();
    for (; next_ < ops.size() && ops[next_].phase == phase_; ++next_) {
      const int tag = data_tag(ops[next_].stream);
      if (wraps && !free_tag(tag, block, differ)) {
        comm_.end_batch();
        return false;
      }
      const std::size_t reqs = reqs_.size(), reduces = reduces_.size();
      post(ops[next_], tag, reqs_, reduces_);
      if (wraps) held_[tag] = {reqs, reqs_.size(), reduces_.size() > reduces ? reduces : kNone};
    }
    comm_.end_batch();
    post_words();
    return true;
  }

  // The words, once, on the first tag (the data's are the next ones): after the first phase's
  // data, or before the first wait for a tag.
  void post_words() {
    if (words_posted_) return;
    words_posted_ = true;
    auto [to, from] = signature_words(plan_, me_);
    signatures_.post(comm_, tags_.tag(0), std::move(to), std::move(from));
  }

  // An op's tag: stream + 1 of the run (the words' is its first). A plan of more streams than
  // the run holds reuses its tags other than the words' (a data message on theirs could be
  // taken for a word, or the words for it, where a chain forwards it late).
  int data_tag(std::int64_t stream) const {
    return tags_.tag(1 + static_cast<std::size_t>(stream) %
                             std::max<std::size_t>(1, tags_.length() - 1));
  }

  // Where the run's tags are reused, two ops of a phase that share one are never in flight
  // together on this device, as in the sync's executor: a chain forwards its chunks as they
  // arrive, after a direct send of a later op on the same tag to the same receiver went out,
  // which took the chain's receive (the receiver posts in plan order). Whether what holds `tag`
  // completed; `block`: waits for it (the peers' words checked meanwhile). Every device waits
  // only on ops earlier in plan order, so the earliest op not complete can always be posted by
  // all of its devices.
  bool free_tag(int tag, bool block, const detail::PeerSignatures::Differ& differ) {
    const auto it = held_.find(tag);
    if (it == held_.end()) return true;
    post_words();  // a peer running another plan is named while this device waits
    std::vector<Request*> holding;
    for (std::size_t i = it->second.reqs; i < it->second.reqs_end; ++i)
      holding.push_back(&reqs_[i]);
    if (it->second.reduce != kNone)
      for (auto& r : reduces_[it->second.reduce].reqs) holding.push_back(&r);
    if (!block) {
      signatures_.test(comm_, differ);
      for (Request* r : holding)
        if (!comm_.test(*r)) return false;
    } else {
      const detail::WaitHook check(comm_, [&] { signatures_.test(comm_, differ); });
      for (Request* r : holding) comm_.wait(*r);
    }
    held_.erase(it);
    return true;
  }

  Region src_region(const Box& b) const {
    require(b, src_tile_, "source");
    return Region::of(src_, elem_, src_tile_, b);
  }
  Region dst_region(const Box& b) const {
    require(b, dst_tile_, "target");
    return Region::of(dst_, elem_, dst_tile_, b);
  }
  // A plan naming a device for data it does not hold is corrupt: refuse rather than write
  // outside a buffer. So is an empty box (a hand-built RankPlan's): it would write nothing
  // where the plan promised the box.
  void require(const Box& b, const Box& tile, const char* side) const {
    if (b.empty())
      throw ValidationError(
          "plan", "device " + std::to_string(me_) + " is asked for an empty box " + b.str());
    if (!tile.contains(b) || !tile.ndim())
      throw ValidationError("plan", "device " + std::to_string(me_) +
                                        " is asked for a box outside its " + side + " tile");
  }

  void post(const Op& op, int tag, std::vector<Request>& reqs,
            std::vector<PendingReduce>& reduces) {
    switch (op.kind) {
      case OpKind::Copy:
        if (op.root == me_) local().copy(src_region(op.box), dst_region(op.box));
        return;
      case OpKind::Zero:
        if (op.root == me_) local().zero(dst_region(op.box));
        return;
      case OpKind::Multicast: {
        const bool receiver = std::find(op.peers.begin(), op.peers.end(), me_) != op.peers.end();
        if (op.root != me_ && !receiver) return;
        const Region r = op.root == me_ ? (op.from_dst ? dst_region(op.box) : src_region(op.box))
                                        : dst_region(op.box);
        if (op.peers.size() == 1) {
          reqs.push_back(op.root == me_ ? comm_.isend(r, op.peers[0], tag)
                                        : comm_.irecv(r, op.root, tag));
          return;
        }
        std::vector<int> group{op.root};
        group.insert(group.end(), op.peers.begin(), op.peers.end());
        reqs.push_back(comm_.ibcast(r, op.root, group, tag, op.group, op.fork));
        return;
      }
      case OpKind::Reduce:
        if (op.root == me_) {
          PendingReduce p{&op, {}, {}};
          for (int c : op.peers) {
            p.staging.emplace_back();
            p.reqs.emplace_back();
            if (c == me_) continue;
            const Region d = dst_region(op.box);  // validates the box before staging it
            p.staging.back() = comm_.scratch(d.bytes());
            p.reqs.back() = comm_.irecv(Region::packed_like(d, p.staging.back().get()), c, tag);
          }
          reduces.push_back(std::move(p));
        } else if (std::find(op.peers.begin(), op.peers.end(), me_) != op.peers.end()) {
          reqs.push_back(comm_.isend(src_region(op.box), op.root, tag));
        }
        return;
    }
  }

  bool phase_complete() {
    for (auto& r : reqs_)
      if (!comm_.test(r)) return false;
    for (auto& p : reduces_)
      for (auto& r : p.reqs)
        if (r.valid() && !comm_.test(r)) return false;
    return true;
  }

  // Sums the addends into the target in addend order, so every run gives the same bits.
  void sum(PendingReduce& p) {
    const Op& op = *p.op;
    const Region d = dst_region(op.box);
    const DType t = plan_.src().dtype();
    for (std::size_t g = 0; g < op.peers.size(); ++g) {
      comm_.wait(p.reqs[g]);
      const Region addend =
          op.peers[g] == me_ ? src_region(op.box) : Region::packed_like(d, p.staging[g].get());
      if (g == 0)
        local().copy(addend, d);
      else
        local().add(addend, d, t);
    }
  }

  const RankPlan plan_;
  Group group_;           // keeps the group's tags reserved while the reshard is in flight
  std::size_t next_ = 0;  // the first op not yet posted
  bool started_ = false;  // a phase is posted (reqs_ and reduces_ belong to it)
  int phase_ = 0;         // the phase posted, or being posted (next_ in it)
  bool words_posted_ = false;
  std::vector<Request> reqs_;
  std::vector<PendingReduce> reduces_;
  // Per tag reused in this phase: the requests its last op posted, [reqs, reqs_end) of reqs_,
  // and its reduce (an index of reduces_, or kNone).
  static constexpr std::size_t kNone = ~std::size_t{0};
  struct Held {
    std::size_t reqs, reqs_end, reduce;
  };
  std::unordered_map<int, Held> held_;
  detail::PeerSignatures signatures_;
  void* src_;
  void* dst_;
  std::size_t elem_;
  Box src_tile_, dst_tile_;
};

}  // namespace

bool Transfer::Executor::step(bool block) {
  if (failure_) std::rethrow_exception(failure_);
  if (finished_) return true;
  const detail::Raised raised(stepping_);
  try {
    // Its queued local work done before it counts as done: the buffers are the caller's again.
    finished_ = advance(block);
    if (finished_) comm_.transport().settle();
  } catch (const std::exception& e) {
    failure_ = std::current_exception();
    comm_.abandon_for(e);
    // Its queued local work and its transfers end before the caller gets its buffers back.
    cancel_quietly();
    try {
      comm_.transport().settle();
    } catch (...) {  // the failure to report is e
    }
    wait_cancelled();
    throw;
  }
  return finished_;
}

void Transfer::Executor::drop() noexcept {
  if (done()) return;
  // Each step on its own: one that fails must not leave requests posted on the buffers.
  cancel_quietly();
  try {
    comm_.abandon(CommError(me_, "dropped a transfer before it completed"));
    comm_.transport().settle();
  } catch (...) {  // best effort, as abandon() itself is
  }
  wait_cancelled();
  failure_ = std::make_exception_ptr(CommError(me_, "dropped a transfer before it completed"));
}

void Transfer::Executor::cancel_quietly() noexcept {
  try {
    cancel_all();
  } catch (...) {  // best effort: wait_cancelled() still waits for what was cancelled
  }
}

// A transfer the peer matched goes on until it ends (MPI and UCX cannot stop it): waited for a
// while, so that the caller may free the buffers once this returns. The peers, told of the
// abandon, end theirs.
void Transfer::Executor::wait_cancelled() noexcept {
  try {
    (void)comm_.settle_cancelled(Communicator::Clock::now() + std::chrono::seconds(1));
  } catch (...) {
  }
}

Transfer Transfer::Executor::start(std::shared_ptr<Executor> exec, const Group& group,
                                   std::size_t streams) {
  Transfer t;
  t.exec_ = std::move(exec);
  const TagBlock tags = group.reserve(streams, t.exec_);
  if (t.exec_) {
    t.exec_->set_tags(tags);
    t.test();  // posts what it can
  }
  return t;
}

Transfer::Transfer() = default;
// Dropping a transfer in flight gives it up: the peers end with an error instead of waiting, and
// none of them may still read this device's buffers once it returns.
Transfer::~Transfer() { give_up(); }
Transfer::Transfer(Transfer&&) noexcept = default;
Transfer& Transfer::operator=(Transfer&& other) noexcept {
  if (this == &other) return *this;  // giving itself up would abandon the move
  give_up();
  exec_ = std::move(other.exec_);
  return *this;
}

void Transfer::give_up() noexcept {
  if (exec_) exec_->drop();
  exec_.reset();
}

bool Transfer::done() const { return !exec_ || exec_->done(); }

bool Transfer::test() {
  if (!exec_) return true;
  const std::shared_ptr<Executor> e = exec_;
  if (!e->step(false)) {
    e->comm().progress();
    return false;
  }
  exec_.reset();
  return true;
}

// Kept until it finished, as in test(): after a failure every later wait() or test() throws
// it again (a second wait() that returned would say the data arrived).
void Transfer::wait() {
  if (!exec_) return;
  const std::shared_ptr<Executor> e = exec_;
  e->step(true);
  exec_.reset();
}

std::int64_t reshard_scratch_bytes(const Plan& plan, int device) {
  const auto elem = static_cast<double>(dtype_size(plan.src().dtype()));
  // What post() stages for the reduces of each (root, phase); the devices move through the
  // phases apart, so all of them together hold at most each one's peak at once.
  std::map<std::pair<int, int>, double> staged;
  for (const Op& op : plan.ops()) {
    if (op.kind != OpKind::Reduce || (device >= 0 && op.root != device)) continue;
    const auto others =
        std::count_if(op.peers.begin(), op.peers.end(), [&](int p) { return p != op.root; });
    staged[{op.root, op.phase}] +=
        static_cast<double>(others) * static_cast<double>(op.box.volume()) * elem;
  }
  std::map<int, double> peak;
  for (const auto& [at, bytes] : staged) peak[at.first] = std::max(peak[at.first], bytes);
  double total = 0;
  for (const auto& [root, bytes] : peak) total += bytes;
  constexpr double kMost = 4.6e18;  // ~2^62: a caller may add tiles to it
  return static_cast<std::int64_t>(std::min(total, kMost));
}

void detail::check_members(const Group& group, const std::vector<const Mesh*>& meshes) {
  const int me = group.comm().rank();
  if (!group.contains(me))
    throw ValidationError("group", "device " + std::to_string(me) + " is not in the group");
  for (const Mesh* m : meshes)
    for (int d : m->devices())
      if (!group.contains(d))
        throw ValidationError("group",
                              "device " + std::to_string(d) + " of the plan is not in the group");
}

Transfer ireshard(const RankPlan& plan, const Group& group, const void* src_local,
                  void* dst_local) {
  Communicator& comm = group.comm();
  const int me = comm.rank();
  std::shared_ptr<Transfer::Executor> exec;
  try {
    detail::check_members(group, {&plan.src().mesh(), &plan.dst().mesh()});
    if (plan.src().mesh().contains(me) || plan.dst().mesh().contains(me))
      exec = std::make_shared<ReshardExecutor>(plan, group, src_local, dst_local);
  } catch (const std::exception& e) {
    comm.abandon_for(e);
    throw;
  }
  return Transfer::Executor::start(std::move(exec), group, reshard_tags(plan.streams()));
}

// One tag more than the plan's streams: the signatures'.
std::size_t reshard_tags(std::int64_t streams) { return static_cast<std::size_t>(streams) + 1; }

Transfer ireshard(const Plan& plan, const Group& group, const void* src_local, void* dst_local) {
  return ireshard(plan.rank(group.comm().rank()), group, src_local, dst_local);
}

Transfer ireshard(const RankPlan& plan, Communicator& comm, const void* src_local,
                  void* dst_local) {
  return ireshard(plan, comm.world(), src_local, dst_local);
}

Transfer ireshard(const Plan& plan, Communicator& comm, const void* src_local, void* dst_local) {
  return ireshard(plan, comm.world(), src_local, dst_local);
}

void reshard(const RankPlan& plan, const Group& group, const void* src_local, void* dst_local) {
  ireshard(plan, group, src_local, dst_local).wait();
}

void reshard(const RankPlan& plan, Communicator& comm, const void* src_local, void* dst_local) {
  reshard(plan, comm.world(), src_local, dst_local);
}

void reshard(const Plan& plan, const Group& group, const void* src_local, void* dst_local) {
  ireshard(plan, group, src_local, dst_local).wait();
}

void reshard(const Plan& plan, Communicator& comm, const void* src_local, void* dst_local) {
  reshard(plan, comm.world(), src_local, dst_local);
}

}  // namespace meshcast
