// The Python face of the algebra and the planner: Mesh, Layout, Topology, Plan, RankPlan.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "meshcast/plan.h"
#include "python/src/bound.h"

namespace meshcast::python {

namespace py = pybind11;

// A plan with the topology it was planned on (Plan keeps only its name), for predict() and
// svg(): none where a plan read back names a topology that cannot be found here.
struct PyPlan {
  Plan plan;
  std::optional<Topology> topology;
  // Per device, its tile shapes of src and dst, made at its first reshard: every call checks
  // its arrays against them, and computing a tile allocated more than the rest of the checks.
  // Read and written with the GIL held only.
  using TileShapes = std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>;
  mutable std::unordered_map<int, TileShapes> tiles{};
};

// `obj` as a topology: None (one host), a Topology, a file path or a preset name.
Topology topology_arg(py::handle obj);

// The device's local tile shape of `layout`, as a tuple (None outside the mesh).
py::object local_shape(const Layout& layout, py::handle device);

void bind_plan(py::module_& m);

}  // namespace meshcast::python

MESHCAST_PY_INITIALIZED(meshcast::python::PyPlan);
