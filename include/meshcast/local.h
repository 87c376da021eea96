// The in-process backend: one thread per device, data copied directly between the threads'
// buffers (one copy per receiver, strided boxes included). Needs no launcher.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "meshcast/communicator.h"
#include "meshcast/plan.h"

namespace meshcast {

class LocalWorld {
 public:
  // A world of `size` devices, ids 0..size-1. With node_segment_bytes > 0 every device also
  // maps a node-memory segment of that size (Communicator::node_segment), so that the blocking
  // collectives run their shared-memory algorithm here too; by default they send (one copy per
  // transfer here already). A wait that sees no progress of any device for `timeout_seconds` (no
  // copy anywhere in the world, no device arriving at a barrier: a wait of its own goes on
  // longer while others progress) fails with a CommError naming the device it waits on; a wait
  // on a device whose function has returned, or that run() was not given, fails at once. `size` is
  // at most limits().devices, and size x node_segment_bytes at most limits().buffer_bytes
  // (ValidationError).
  explicit LocalWorld(int size, std::size_t node_segment_bytes = 0, double timeout_seconds = 60);
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const;
  // Runs fn(comm) on one thread per device of `devices` (all when empty; each at most once; at
  // most limits().local_threads) and joins them. If a thread throws, the others' pending waits fail
  // with CommError naming it, and the first exception is rethrown here. A device not in
  // `devices` never runs: a wait on it fails at once ("is not running"), and barriers count
  // only the devices run.
  void run(const std::function<void(Communicator&)>& fn, const std::vector<int>& devices = {});

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace meshcast
