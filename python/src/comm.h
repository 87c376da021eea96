// Communicators and groups as Python sees them: a handle on a C++ Communicator that knows
// whether its session (a LocalWorld thread, an MPI or UCX session) is still there.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <memory>
#include <string>

#include "meshcast/communicator.h"

namespace meshcast::python {

namespace py = pybind11;

class Comm {
 public:
  Comm(Communicator* comm, std::shared_ptr<void> session, std::shared_ptr<std::atomic<bool>> alive)
      : comm_(comm), session_(std::move(session)), alive_(std::move(alive)) {}
  // Throws ValueError("comm: ...") once the session ended (a LocalWorld run returned).
  Communicator& get() const;
  bool alive() const;
  int rank() const { return get().rank(); }
  int size() const { return get().size(); }

 private:
  Communicator* comm_;
  std::shared_ptr<void> session_;  // keeps an MPI / UCX session alive while a handle exists
  std::shared_ptr<std::atomic<bool>> alive_;
};

struct PyGroup {
  Group group;
  Comm comm;
};

// A Comm (its world) or a Group, for the first argument of every collective and transfer.
PyGroup group_arg(py::handle obj, const std::string& arg = "comm");

void bind_comm(py::module_& m);

}  // namespace meshcast::python
