// Executing a plan: called collectively by every device of the union of the plan's meshes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshcast/communicator.h"
#include "meshcast/plan.h"

namespace meshcast {

// This device's part of the move. `src_local` holds its source tile (row-major, contiguous;
// nullptr when the device is not in the source mesh), `dst_local` receives its destination
// tile (nullptr when not in the target mesh). comm.rank() is the device id. Throws
// ValidationError when a needed buffer is nullptr, CommError when a peer fails.
void reshard(const Plan& plan, Communicator& comm, const void* src_local, void* dst_local);

// A reshard in flight. test() moves it on as far as it can without blocking (posting each
// phase once the previous one completed) and says whether it finished; wait() finishes it.
// Progress happens only inside these calls. The plan, the communicator and both buffers must
// outlive it. A failed peer makes them throw CommError naming it. Destroying it before it
// completed abandons the move (the peers fail with an error naming this device).
class Transfer {
 public:
  Transfer();
  ~Transfer();
  Transfer(Transfer&&) noexcept;
  Transfer& operator=(Transfer&&) noexcept;
  bool test();
  void wait();
  bool done() const { return exec_ == nullptr; }

  class Executor;

 private:
  friend Transfer ireshard(const Plan&, Communicator&, const void*, void*, int);
  bool step(bool block);
  void give_up() noexcept;
  std::unique_ptr<Executor> exec_;
  Communicator* comm_ = nullptr;
};

// reshard() started without blocking. Op i of the plan travels with tag (tag_base + i) % 32768:
// reshards in flight at once between the same devices need disjoint tag ranges (tag_base =
// k * plan.ops().size() for the k-th of them, say), unless every device starts them in the
// same order and none has more than one phase.
Transfer ireshard(const Plan& plan, Communicator& comm, const void* src_local, void* dst_local,
                  int tag_base = 0);

}  // namespace meshcast
