#pragma once

#include <pybind11/pybind11.h>

namespace meshcast::python {
void bind_sync(pybind11::module_& m);
}  // namespace meshcast::python
