// The Python face of the algebra and the planner: Mesh, Layout, Topology, Plan, RankPlan.
#pragma once

#include <pybind11/pybind11.h>

#include "meshcast/plan.h"

namespace meshcast::python {

namespace py = pybind11;

// A plan with the topology it was planned on (Plan keeps only its name), for predict().
struct PyPlan {
  Plan plan;
  Topology topology;
};

// `obj` as a topology: None (one host), a Topology, a file path or a preset name.
Topology topology_arg(py::handle obj);

// The device's local tile shape of `layout`, as a tuple (None outside the mesh).
py::object local_shape(const Layout& layout, int device);

void bind_plan(py::module_& m);

}  // namespace meshcast::python
