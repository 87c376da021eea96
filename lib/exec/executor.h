// What every operation behind a Transfer (a reshard, a sync) shares: failures handed to the
// peers and kept, so that the operation throws them again wherever it is driven from; dropping
// it in flight; starting it on a group. Internal to lib/exec/.
#pragma once

#include <exception>
#include <memory>
#include <vector>

#include "meshcast/communicator.h"
#include "meshcast/reshard.h"

namespace meshcast {

class Transfer::Executor : public InFlight {
 public:
  explicit Executor(Communicator& comm) : comm_(comm), me_(comm.rank()) {}
  void set_tags(const TagBlock& tags) { tags_ = tags; }

  // advance() that hands a failure to the peers (Communicator::abandon_for) and keeps it.
  bool step(bool block);
  Communicator& comm() const { return comm_; }
  bool done() const override { return finished_ || failure_; }
  void finish() override { step(true); }
  void poll() override {
    if (!stepping_) step(false);
  }
  // Gives up: no peer reads or writes this device's buffers once it returns.
  void drop() noexcept;

  // Starts `exec` (null: this device has no part) on `group`: every member reserves `streams`
  // tags, so that the group's sequence stays the same everywhere, and posts what it can.
  static Transfer start(std::shared_ptr<Executor> exec, const Group& group, std::size_t streams);

 protected:
  // Posts what it can; `block`: wait until everything completed. True once it has.
  virtual bool advance(bool block) = 0;
  // Cancels every request in flight (drop(), and after a failure).
  virtual void cancel_all() = 0;
  // Copies, fills and sums on this device's memory, queued (a GPU transport's stream) ahead of
  // the transfers posted after them: step() settles them before the transfer completes.
  Transport& local() { return comm_.transport(); }

  Communicator& comm_;
  const int me_;
  TagBlock tags_;

 private:
  void cancel_quietly() noexcept;  // cancel_all(), its failure swallowed
  void wait_cancelled() noexcept;  // a bounded wait for what the peers had already matched

  bool finished_ = false;
  bool stepping_ = false;  // step() is on the stack: poll() leaves it alone
  std::exception_ptr failure_;
};

namespace detail {
// Throws ValidationError("group") unless the group holds this device and every device of `meshes`.
void check_members(const Group& group, const std::vector<const Mesh*>& meshes);
}  // namespace detail

}  // namespace meshcast
