// The executor: walks a plan's ops phase by phase, posting every transfer of a phase before
// waiting on any, so a device never blocks on an order its peers do not share. It advances only
// inside test()/wait(), so that a caller can compute while a reshard is in flight.
#include "meshcast/reshard.h"

#include <algorithm>

#include "meshcast/error.h"

namespace meshcast {
namespace {

// Tags repeat every 32768 ops (MPI guarantees at least that many); safe because every device
// posts a pair's messages in plan order and messages of one (peer, tag) match in order.
int tag_of(std::size_t op, int base) {
  return static_cast<int>((op + static_cast<std::size_t>(base)) % 32768);
}

struct PendingReduce {
  const Op* op;
  std::vector<std::shared_ptr<void>> staging;  // per contributor (null for the root's own)
  std::vector<Request> reqs;
};

}  // namespace

class Transfer::Executor {
 public:
  Executor(const Plan& plan, Communicator& comm, const void* src, void* dst, int tag_base)
      : plan_(plan),
        comm_(comm),
        tag_base_(tag_base),
        me_(comm.rank()),
        src_(const_cast<void*>(src)),
        dst_(dst),
        elem_(dtype_size(plan.src().dtype())) {
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

  // Posts the phases whose predecessors completed; `block`: wait for each instead of testing.
  // True once every op of the plan completed.
  bool advance(bool block) {
    const auto& ops = plan_.ops();
    while (true) {
      if (started_) {
        if (!block && !phase_complete()) return false;
        for (auto& r : reduces_) finish(r);
        comm_.wait_all(reqs_);
        reqs_.clear();
        reduces_.clear();
      }
      if (next_ == ops.size()) return true;
      started_ = true;
      const int phase = ops[next_].phase;
      for (; next_ < ops.size() && ops[next_].phase == phase; ++next_)
        post(ops[next_], tag_of(next_, tag_base_), reqs_, reduces_);
    }
  }

 private:
  Region src_region(const Box& b) const {
    require(src_tile_.contains(b) && src_tile_.rank(), "source");
    return Region::of(src_, elem_, src_tile_, b);
  }
  Region dst_region(const Box& b) const {
    require(dst_tile_.contains(b) && dst_tile_.rank(), "target");
    return Region::of(dst_, elem_, dst_tile_, b);
  }
  // A plan naming a device for data it does not hold is corrupt: refuse rather than write
  // outside a buffer.
  void require(bool ok, const char* side) const {
    if (!ok)
      throw ValidationError("plan", "device " + std::to_string(me_) +
                                        " is asked for a box outside its " + side + " tile");
  }

  void post(const Op& op, int tag, std::vector<Request>& reqs,
            std::vector<PendingReduce>& reduces) {
    switch (op.kind) {
      case OpKind::Copy:
        if (op.root == me_) comm_.copy(src_region(op.box), dst_region(op.box));
        return;
      case OpKind::Zero:
        if (op.root == me_) comm_.zero(dst_region(op.box));
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
        reqs.push_back(comm_.ibcast(r, op.root, group, tag));
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
  void finish(PendingReduce& p) {
    const Op& op = *p.op;
    const Region d = dst_region(op.box);
    const DType t = plan_.src().dtype();
    for (std::size_t g = 0; g < op.peers.size(); ++g) {
      comm_.wait(p.reqs[g]);
      const Region addend =
          op.peers[g] == me_ ? src_region(op.box) : Region::packed_like(d, p.staging[g].get());
      if (g == 0)
        comm_.copy(addend, d);
      else
        comm_.add(addend, d, t);
    }
  }

  const Plan& plan_;
  Communicator& comm_;
  int tag_base_;
  std::size_t next_ = 0;  // the first op not yet posted
  bool started_ = false;  // a phase is posted (reqs_ and reduces_ belong to it)
  std::vector<Request> reqs_;
  std::vector<PendingReduce> reduces_;
  int me_;
  void* src_;
  void* dst_;
  std::size_t elem_;
  Box src_tile_, dst_tile_;
};

Transfer::Transfer() = default;
// Dropping a transfer in flight gives it up: the peers end with an error instead of waiting, and
// none of them may still read this device's buffers once it returns.
Transfer::~Transfer() { give_up(); }
Transfer::Transfer(Transfer&&) noexcept = default;
Transfer& Transfer::operator=(Transfer&& other) noexcept {
  give_up();
  exec_ = std::move(other.exec_);
  comm_ = other.comm_;
  return *this;
}

void Transfer::give_up() noexcept {
  if (!exec_) return;
  try {
    comm_->abandon("device " + std::to_string(comm_->rank()),
                   "dropped a reshard before it completed");
  } catch (...) {  // best effort, as abandon() itself is
  }
  exec_.reset();
}

bool Transfer::step(bool block) {
  if (!exec_) return true;
  try {
    if (!exec_->advance(block)) return false;
  } catch (const std::exception& e) {
    // Every device then reports the device that failed, at once.
    comm_->abandon_for(e);
    exec_.reset();
    throw;
  }
  exec_.reset();
  return true;
}

bool Transfer::test() { return step(false); }
void Transfer::wait() { step(true); }

Transfer ireshard(const Plan& plan, Communicator& comm, const void* src_local, void* dst_local,
                  int tag_base) {
  Transfer t;
  const int me = comm.rank();
  if (!plan.src().mesh().contains(me) && !plan.dst().mesh().contains(me)) return t;
  t.comm_ = &comm;
  try {
    t.exec_ = std::make_unique<Transfer::Executor>(plan, comm, src_local, dst_local, tag_base);
  } catch (const std::exception& e) {
    comm.abandon_for(e);
    throw;
  }
  t.test();  // posts the first phase
  return t;
}

void reshard(const Plan& plan, Communicator& comm, const void* src_local, void* dst_local) {
  ireshard(plan, comm, src_local, dst_local).wait();
}

}  // namespace meshcast
