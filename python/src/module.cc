// The extension module meshcast._meshcast; python/meshcast/__init__.py re-exports it.
#include <pybind11/pybind11.h>

#include <string>

#include "meshcast/error.h"
#include "python/src/comm.h"
#include "python/src/execute.h"
#include "python/src/plan.h"
#include "python/src/sync.h"

namespace py = pybind11;

PYBIND11_MODULE(_meshcast, m) {
  m.doc() = "meshcast: cross-mesh resharding of sharded tensors (C++ core)";
  // Bad input is a ValueError (its message names the field); a failed peer a RuntimeError;
  // an unreadable file an OSError.
  static py::exception<meshcast::Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<meshcast::ValidationError> validation(m, "ValidationError",
                                                             PyExc_ValueError);
  static py::exception<meshcast::ParseError> parse(m, "ParseError", validation.ptr());
  static py::exception<meshcast::CommError> comm(m, "CommError", error.ptr());
  static py::exception<meshcast::IoError> io(m, "IoError", PyExc_OSError);
  error.attr("__doc__") = "A meshcast failure (base of CommError).";
  validation.attr("__doc__") =
      "Inconsistent input; the message names the field: 'dst.shape: ...' (a ValueError).";
  parse.attr("__doc__") = "Malformed text (a mesh, spec, JSON); names the field.";
  comm.attr("__doc__") = "A peer failed, left or stopped answering; the message names the device.";
  io.attr("__doc__") = "A file that cannot be read or written (an OSError); names the path.";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const meshcast::python::Interrupted& e) {
      e.raise(comm.ptr());
    } catch (const meshcast::ValidationError& e) {
      validation(e.what());
    } catch (const meshcast::ParseError& e) {
      parse(e.what());
    } catch (const meshcast::CommError& e) {
      comm(e.what());
    } catch (const meshcast::IoError& e) {
      io(e.what());
    } catch (const meshcast::Error& e) {
      error(e.what());
    }
  });
  meshcast::python::bind_comm(m);  // first: Topology.discover takes a Comm
  meshcast::python::bind_plan(m);
  meshcast::python::bind_execute(m);
  meshcast::python::bind_sync(m);
  // The classes that hold a device's state (a communicator, a world, an operation in flight, a
  // device's part of a plan) cannot be pickled. pickle refused them at protocol 2 and above, but
  // below it copyreg rebuilt them through a base that pybind11 cannot allocate: std::terminate,
  // past every except and finally. Refused alike at every protocol.
  // (__reduce__ too: called directly, object's went the same way.)
  for (const char* name : {"Comm", "Group", "LocalWorld", "Handle", "RankPlan", "SyncPlan"})
    for (const char* method : {"__reduce_ex__", "__reduce__"})
      m.attr(name).attr(method) = py::cpp_function(
          [name](py::handle, const py::args&) -> py::object {
            throw py::type_error(std::string("cannot pickle a meshcast.") + name + " object");
          },
          py::name(method), py::is_method(m.attr(name)));
}
