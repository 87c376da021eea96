// Transfers and collectives in flight, as Python holds them.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <vector>

#include "meshcast/topology.h"
#include "python/src/bound.h"
#include "python/src/comm.h"
#include "python/src/tile.h"

namespace meshcast::python {

namespace py = pybind11;

struct Handle {
  // Declared first, destroyed last: the arrays outlive the operation that writes them.
  std::vector<py::object> keep;
  std::shared_ptr<Topology> topology;
  std::optional<PyGroup> group;  // keeps the session alive, and knows when it ended
  std::shared_ptr<Pending> op;   // the session's Life ends it before the communicator goes
  bool adopted = false;          // moved into a drop (~Handle), which ends what is in flight
  // A handle for an operation about to start on `g`, tracked by its communicator's Life with
  // the memory of its arrays.
  Handle(PyGroup g, Kept arrays);
  Handle(Handle&&) = default;
  Handle& operator=(Handle&&) = default;
  // A collective cannot be abandoned the way a transfer is (its peers would wait on it): one
  // dropped unfinished is finished here, so that its buffers are never freed under it. On the
  // communicator's turn (Life::adopt_if_busy): a handle may go on any thread, by the garbage
  // collector too, while the device's own thread is inside a call.
  ~Handle();
  // Ends what is in flight (a collective finished, a transfer abandoned), holding the
  // communicator.
  void drop();
  bool test();
  void wait();
  bool done() const;
};

void bind_execute(py::module_& m);

}  // namespace meshcast::python

MESHCAST_PY_INITIALIZED(meshcast::python::Handle);
