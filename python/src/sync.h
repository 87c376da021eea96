#pragma once

#include <pybind11/pybind11.h>

#include "python/src/bound.h"

namespace meshcast::python {
void bind_sync(pybind11::module_& m);
}  // namespace meshcast::python
