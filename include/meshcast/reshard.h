// Executing a plan: called collectively by every device of the union of the plan's meshes.
#pragma once

#include <cstdint>
#include <vector>

#include "meshcast/communicator.h"
#include "meshcast/plan.h"

namespace meshcast {

// This device's part of the move. `src_local` holds its source tile (row-major, contiguous;
// nullptr when the device is not in the source mesh), `dst_local` receives its destination
// tile (nullptr when not in the target mesh). comm.rank() is the device id. Throws
// ValidationError when a needed buffer is nullptr, CommError when a peer fails.
void reshard(const Plan& plan, Communicator& comm, const void* src_local, void* dst_local);

}  // namespace meshcast
