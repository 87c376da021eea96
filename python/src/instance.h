// The C++ object behind a Python instance of a bound class, found without pybind11's registry.
#pragma once

#include <pybind11/pybind11.h>

namespace meshcast::python {

namespace py = pybind11;

// The T that `h` wraps when h's type is exactly the bound class T, else nullptr (a subclass,
// another type, or an instance whose __init__ failed): the caller falls back to
// py::isinstance / cast. Each of those looks T up by typeid in pybind11's registry, a hash of
// the type's name; a reshard from Python did five such lookups per call.
template <class T>
T* instance_of(py::handle h) {
  static const py::detail::type_info* const info = py::detail::get_type_info(typeid(T));
  if (!info || !h || Py_TYPE(h.ptr()) != info->type) return nullptr;
  const auto vh =
      reinterpret_cast<py::detail::instance*>(h.ptr())->get_value_and_holder(info, false);
  return vh ? vh.template value_ptr<T>() : nullptr;
}

}  // namespace meshcast::python
