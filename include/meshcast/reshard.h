// Executing a plan: a reshard over a group of devices, blocking or in flight.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshcast/communicator.h"
#include "meshcast/plan.h"

namespace meshcast {

// This device's part of the move, over `group` (the world by default), which holds every device
// of the plan's meshes: every member of the group calls it, in the same order as its other
// operations on the group (a member outside the plan's meshes returns at once). `src_local`
// holds its source tile (row-major, contiguous; nullptr when the device is not in the source
// mesh), `dst_local` receives its destination tile (nullptr when not in the target mesh).
// The plan is this device's part (plan_rank(..., comm.rank(), ...): no device builds the whole
// plan), or the whole plan, of which it executes plan.rank(comm.rank()); devices may mix the two
// forms of one plan. Throws ValidationError when a needed buffer is nullptr, the group misses a
// device of the plan or a RankPlan is another device's, CommError when a peer fails.
void reshard(const RankPlan& plan, const Group& group, const void* src_local, void* dst_local);
void reshard(const RankPlan& plan, Communicator& comm, const void* src_local, void* dst_local);
void reshard(const Plan& plan, const Group& group, const void* src_local, void* dst_local);
void reshard(const Plan& plan, Communicator& comm, const void* src_local, void* dst_local);

// A reshard in flight. test() moves it on as far as it can without blocking (posting each
// phase, as one batch, once the previous one completed) and says whether it finished; wait()
// finishes it. After a failure each later test() and wait() throws it again; done() says only
// that nothing is in flight any more (finished or failed). Progress happens inside these calls, and
// inside any later operation on the same group that needs its tags. It keeps its own copy of the
// device's part of the plan; the communicator and both buffers must outlive it. A failed peer makes
// them throw CommError naming it. Destroying it before it completed abandons the move (the peers
// fail with an error naming this device); a message a peer already took in goes on until it ends
// (MPI and UCX cannot stop it), for up to a second, so that neither side's buffers are read or
// written once the destructor (or the failed wait) returns.
class Transfer {
 public:
  Transfer();
  ~Transfer();
  Transfer(Transfer&&) noexcept;
  Transfer& operator=(Transfer&&) noexcept;
  bool test();
  void wait();
  bool done() const;

  class Executor;  // what a reshard or a sync runs on (lib/exec/executor.h)

 private:
  void give_up() noexcept;
  std::shared_ptr<Executor> exec_;
};

// reshard() started without blocking. Its messages travel on tags the group reserves for it
// (Group::reserve): any number of reshards and collectives may be in flight on the same devices
// at once, and complete in any order.
Transfer ireshard(const RankPlan& plan, const Group& group, const void* src_local, void* dst_local);
Transfer ireshard(const RankPlan& plan, Communicator& comm, const void* src_local, void* dst_local);
Transfer ireshard(const Plan& plan, const Group& group, const void* src_local, void* dst_local);
Transfer ireshard(const Plan& plan, Communicator& comm, const void* src_local, void* dst_local);

// The tags of its group's window (Group::window) that a reshard of a plan of `streams` streams
// (Plan::streams) holds while it is in flight: reshards in flight at once on one group whose tags
// add up to more wait for each other in order, which deadlocks where the oldest cannot complete
// before a later one does.
std::size_t reshard_tags(std::int64_t streams);

// The scratch a reshard of `plan` holds besides the caller's tiles, at its peak: a reduce's root
// receives every other addend of its box into a buffer of its own, all of a phase's at once.
// Of `device` (its largest phase), or of every device together (-1: what one process running
// them all holds, each device's largest phase: they move through the phases apart);
// saturates near 2^62.
std::int64_t reshard_scratch_bytes(const Plan& plan, int device = -1);

}  // namespace meshcast
