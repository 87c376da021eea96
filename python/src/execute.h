// Transfers and collectives in flight, as Python holds them.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <vector>

#include "meshcast/collectives.h"
#include "meshcast/reshard.h"

namespace meshcast::python {

namespace py = pybind11;

struct Handle {
  // Declared first, destroyed last: the arrays outlive the operation that writes them.
  std::vector<py::object> keep;
  std::shared_ptr<Topology> topology;
  std::optional<Transfer> transfer;
  std::optional<Collective> collective;
  Handle() = default;
  Handle(Handle&&) = default;
  Handle& operator=(Handle&&) = default;
  // A collective cannot be abandoned the way a transfer is (its peers would wait on it): one
  // dropped unfinished is finished here, so that its buffers are never freed under it.
  ~Handle();
  bool test();
  void wait();
  bool done() const;
};

void bind_execute(py::module_& m);

}  // namespace meshcast::python
