// Integer and text arguments read by hand: pybind11 turns an int out of the C++ type's range into
// a multi-line "incompatible function arguments" TypeError listing every overload, and a cast of
// an object of another type into a RuntimeError; these name the argument in one line instead.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "python/src/bound.h"

namespace meshcast::python {

namespace py = pybind11;

// The name of obj's type, for messages.
inline std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

// An int in [lo, hi]: TypeError for a non-integer, ValueError out of range, naming `arg`.
inline std::int64_t int_arg(py::handle obj, const std::string& arg, std::int64_t lo,
                            std::int64_t hi) {
  if (!PyIndex_Check(obj.ptr()) || PyBool_Check(obj.ptr()))
    throw py::type_error(arg + ": expected an int, got " + type_name(obj));
  const auto i = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!i && PyErr_ExceptionMatches(PyExc_TypeError)) {  // a numpy array of other than one element
    PyErr_Clear();
    throw py::type_error(arg + ": expected an int, got " + type_name(obj));
  }
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow || v < lo || v > hi)
    throw py::value_error(arg + ": " + py::str(i).cast<std::string>().substr(0, 40) +
                          " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "]");
  return v;
}

// An int of C++'s int range (a device id, a root: out of a mesh is the caller's to say).
inline int int32_arg(py::handle obj, const std::string& arg) {
  return static_cast<int>(
      int_arg(obj, arg, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

// A real number (an int, a float, a numpy scalar: anything with __float__ or __index__; not a
// bool, not text), naming `arg` in a TypeError.
inline double float_arg(py::handle obj, const std::string& arg) {
  const auto* number = Py_TYPE(obj.ptr())->tp_as_number;
  const bool real = number && (number->nb_float || number->nb_index);
  if (PyBool_Check(obj.ptr()) || !real || PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()))
    throw py::type_error(arg + ": expected a number, got " + type_name(obj));
  const double v = PyFloat_AsDouble(obj.ptr());
  if (v == -1.0 && PyErr_Occurred()) {  // an int too large for a double, a failing __float__
    PyErr_Clear();
    throw py::value_error(arg + ": not a number in a double's range");
  }
  return v;
}

// True or False, or numpy's (not 0 or 1), naming `arg` in a TypeError.
inline bool bool_arg(py::handle obj, const std::string& arg) {
  if (PyBool_Check(obj.ptr())) return obj.ptr() == Py_True;
  const std::string_view type = Py_TYPE(obj.ptr())->tp_name;  // numpy 1's, numpy 2's
  if (type == "numpy.bool_" || type == "numpy.bool") {
    const int v = PyObject_IsTrue(obj.ptr());
    if (v < 0) throw py::error_already_set();
    return v != 0;
  }
  throw py::type_error(arg + ": expected a bool, got " + type_name(obj));
}

// An int, or a sequence of ints, each in [lo, hi] (argument `arg`, elements `arg[i]`).
inline std::vector<std::int64_t> ints_arg(py::handle obj, const std::string& arg, std::int64_t lo,
                                          std::int64_t hi) {
  // A numpy array has __index__ too (for one element): a sized sequence is read as one.
  const bool sized = PySequence_Check(obj.ptr()) && PyObject_Size(obj.ptr()) >= 0;
  if (!sized) PyErr_Clear();  // (a 0-d array has no length: it is an int)
  if (!sized && PyIndex_Check(obj.ptr()) && !PyBool_Check(obj.ptr()))
    return {int_arg(obj, arg, lo, hi)};
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj) ||
      py::isinstance<py::bytes>(obj))
    throw py::type_error(arg + ": expected a sequence of ints, got " + type_name(obj));
  // Iterated, not indexed up to len(): a __len__ may not be the items' number (nor bound what
  // to reserve), and an iteration ends with the items; past kMaxItems it is refused.
  constexpr std::size_t kMaxItems = std::size_t{1} << 24;
  std::vector<std::int64_t> out;
  for (const py::handle item : obj) {
    if (out.size() == kMaxItems)
      throw py::value_error(arg + ": more than " + std::to_string(kMaxItems) + " items");
    out.push_back(int_arg(item, arg + "[" + std::to_string(out.size()) + "]", lo, hi));
  }
  return out;
}

// A sequence (list, tuple, numpy array) of ints of C++'s int range: device ids. A lone int is a
// TypeError, not a list of one.
inline std::vector<int> int32s_arg(py::handle obj, const std::string& arg) {
  if (!py::isinstance<py::sequence>(obj))
    throw py::type_error(arg + ": expected a sequence of ints, got " + type_name(obj));
  std::vector<int> out;
  for (std::int64_t v :
       ints_arg(obj, arg, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()))
    out.push_back(static_cast<int>(v));
  return out;
}

// A str (or, `path`, an os.PathLike), naming `arg` in a TypeError otherwise.
inline std::string str_arg(py::handle obj, const std::string& arg, bool path = false) {
  if (py::isinstance<py::str>(obj)) {
    Py_ssize_t n = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(obj.ptr(), &n);
    if (!utf8) {  // a lone surrogate: no UTF-8 for it (pybind11's cast raised RuntimeError)
      PyErr_Clear();
      throw py::value_error(arg + ": not valid text (a lone surrogate has no UTF-8)");
    }
    return std::string(utf8, static_cast<std::size_t>(n));
  }
  if (path && py::hasattr(obj, "__fspath__")) {
    const py::object p = py::module_::import("os").attr("fspath")(obj);
    if (py::isinstance<py::str>(p)) return str_arg(p, arg);  // (a lone surrogate: one line)
  }
  throw py::type_error(arg + ": expected " + (path ? "a path (str or os.PathLike)" : "a str") +
                       ", got " + type_name(obj));
}

}  // namespace meshcast::python
