#include "python/src/plan.h"

#include <pybind11/operators.h>
#include <pybind11/stl.h>
#include <sys/stat.h>

#include <climits>
#include <limits>
#include <sstream>

#include "lib/support/text.h"
#include "meshcast/cost.h"
#include "meshcast/discover.h"
#include "meshcast/error.h"
#include "python/src/array.h"
#include "python/src/comm.h"
#include "python/src/instance.h"
#include "python/src/ints.h"
#include "python/src/tile.h"

namespace meshcast::python {
namespace {

// f()'s result, computed without the GIL: a plan of millions of ops takes seconds to price,
// print or parse, and the program's other Python threads go on meanwhile.
template <typename F>
auto released(F&& f) {
  py::gil_scoped_release release;
  return f();
}

py::tuple to_tuple(const std::vector<std::int64_t>& v) {
  py::tuple t(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) t[i] = v[i];
  return t;
}

Shape shape_arg(py::handle obj) {
  return ints_arg(obj, "shape", std::numeric_limits<std::int64_t>::min(),
                  std::numeric_limits<std::int64_t>::max());
}

Strategy strategy_arg(const std::string& s) { return parse_strategy(s, "strategy"); }

// A JSON document: a str, or bytes (a file read in binary mode).
std::string json_text_arg(py::handle text) {
  return py::isinstance<py::bytes>(text) ? text.cast<std::string>() : str_arg(text, "text");
}

// A Layout argument, naming `arg` in a one-line TypeError otherwise.
const Layout& layout_arg(py::handle obj, const std::string& arg) {
  if (!py::isinstance<Layout>(obj))
    throw py::type_error(arg + ": expected a meshcast.Layout, got " + type_name(obj));
  return obj.cast<const Layout&>();
}

py::dict stats_dict(const Plan& p) {
  const PlanStats& s = p.stats();
  py::dict d;
  d["ops"] = p.ops().size();
  d["phases"] = p.phases();
  d["bytes_moved"] = s.bytes_moved;
  d["bytes_local"] = s.bytes_local;
  d["bytes_intra_host"] = s.bytes_intra_host;
  d["bytes_network"] = s.bytes_network;
  d["predicted_seconds"] = s.predicted_seconds;
  d["search_truncated"] = s.search_truncated;
  return d;
}

py::dict prediction_dict(const Prediction& pr) {
  py::dict d;
  d["seconds"] = pr.seconds;
  d["bound_seconds"] = pr.bound_seconds;
  py::list links;
  for (const LinkLoad& l : pr.links) {
    py::dict x;
    x["name"] = l.name;
    x["network"] = l.network;
    x["bytes"] = l.bytes;
    x["seconds"] = l.seconds;
    links.append(x);
  }
  d["links"] = links;
  return d;
}

// pickle's reduction at every protocol: a new object whose __setstate__ takes __getstate__'s
// state (py::pickle's). Below protocol 2 pickle would otherwise rebuild it by copyreg, which
// pybind11 types cannot take: it ended the interpreter (std::terminate).
py::tuple reduce_by_state(const py::object& self) {
  return py::make_tuple(py::module_::import("copyreg").attr("__newobj__"),
                        py::make_tuple(py::type::of(self)), self.attr("__getstate__")());
}

// Item `i` of a pickled state of `size` items (a ValueError naming `type` otherwise).
template <typename T>
T pickled(const py::tuple& state, std::size_t i, std::size_t size, const char* type) {
  if (state.size() != size)
    throw py::value_error(std::string(type) + ": a pickled state of " + std::to_string(size) +
                          " items was expected, got " + std::to_string(state.size()));
  try {
    return state[i].cast<T>();
  } catch (const py::cast_error&) {  // (pybind11's own is a RuntimeError)
    throw py::value_error(std::string(type) + ": item " + std::to_string(i) +
                          " of the pickled state has the wrong type");
  }
}

}  // namespace

// A preset name or a file (str), or a file (os.PathLike: a path, even one without a '/' or that
// names no file, which a str would take for a preset).
Topology named_topology(py::handle obj, const char* field) {
  const std::string text = str_arg(obj, field, true);
  return py::isinstance<py::str>(obj) ? Topology::resolve(text) : Topology::load(text);
}

Topology topology_arg(py::handle obj) {
  if (obj.is_none()) return Topology::single_host();
  if (py::isinstance<Topology>(obj)) return obj.cast<Topology>();
  if (py::isinstance<py::str>(obj) || py::hasattr(obj, "__fspath__"))  // as Topology(...) takes
    return named_topology(obj, "topology");
  throw py::type_error(
      "topology: expected None, a Topology, a file path (str or os.PathLike) or "
      "a preset name, got " +
      type_name(obj));
}

namespace {

// The topology a saved plan names: `given`, which must be it, else the preset of that name
// (the first in Topology::preset_dirs(), a file there that does not load an error as such), else
// none (a file only its maker has). Read back on the default single host, a plan made on a
// cluster priced and drew itself as if all on one host.
std::optional<Topology> saved_topology(const Plan& p, std::optional<Topology> given) {
  const std::string& name = p.topology();
  if (given) {
    if (given->name() != name)
      throw ValidationError("topology", "the plan was made on " + detail::quote(name) + ", not " +
                                            detail::quote(given->name()));
    return given;
  }
  if (name == Topology::single_host().name()) return Topology::single_host();
  // A name, never a path (a directory of that name beside the program is no topology).
  if (name.empty() || name.front() == '.' || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    return std::nullopt;
  for (const std::string& d : Topology::preset_dirs()) {
    const std::string file = d + "/" + name + ".json";
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    Topology t = Topology::load(file);          // a preset that does not load: its error, as such
    if (t.name() != name) return std::nullopt;  // the file holds another topology
    return t;
  }
  return std::nullopt;
}

const Topology& own_topology(const PyPlan& p) {
  if (!p.topology)
    throw ValidationError("topology", "the plan names " + detail::quote(p.plan.topology()) +
                                          ", which is no preset here: pass the Topology");
  return *p.topology;
}

}  // namespace

py::object local_shape(const Layout& layout, py::handle device_obj) {
  const int device = int32_arg(device_obj, "device");
  if (!layout.mesh().contains(device)) return py::none();
  return to_tuple(tile_shape(layout, device));
}

// The shape the user gave: () for a 0-d tensor.
py::tuple shape_of(const Layout& l) { return l.scalar() ? py::tuple() : to_tuple(l.shape()); }

void bind_plan(py::module_& m) {
  py::class_<Mesh>(m, "Mesh", R"doc(
An N-D grid over distinct device ids, row-major. Mesh("2x4@8-15"), Mesh("2x2@[0,2,4,6]"),
or Mesh(shape=(2, 4), devices=range(8, 16)).
)doc")
      .def(py::init([](py::handle text) { return Mesh::parse(str_arg(text, "text"), "mesh"); }),
           py::arg("text"))
      .def(py::init([](py::object shape, py::object devices) {
             auto shape_v = ints_arg(shape, "shape", std::numeric_limits<std::int64_t>::min(),
                                     std::numeric_limits<std::int64_t>::max());
             std::vector<int> ids;
             for (auto d : ints_arg(devices, "devices", std::numeric_limits<int>::min(),
                                    std::numeric_limits<int>::max()))
               ids.push_back(static_cast<int>(d));
             return Mesh(std::move(shape_v), std::move(ids), "mesh");
           }),
           py::arg("shape"), py::arg("devices"))
      .def_property_readonly("shape", [](const Mesh& x) { return to_tuple(x.shape()); })
      .def_property_readonly("devices", [](const Mesh& x) { return x.devices(); })
      .def_property_readonly("size", &Mesh::size)
      .def_property_readonly("ndim", &Mesh::ndim)
      .def("__contains__",
           [](const Mesh& x, py::handle id) {
             // Any object: one that is not an integer, or out of int's range, is not there.
             if (!PyIndex_Check(id.ptr())) return false;
             const auto i = py::reinterpret_steal<py::object>(PyNumber_Index(id.ptr()));
             int overflow = 0;
             const long long v = i ? PyLong_AsLongLongAndOverflow(i.ptr(), &overflow) : -1;
             if (!i || overflow || (v == -1 && PyErr_Occurred())) return PyErr_Clear(), false;
             return v >= INT_MIN && v <= INT_MAX && x.contains(static_cast<int>(v));
           })
      .def("__str__", &Mesh::str)
      .def("__repr__", [](const Mesh& x) { return "meshcast.Mesh('" + x.str() + "')"; })
      .def(py::self == py::self)
      .def("__hash__", [](const Mesh& x) { return py::hash(py::str(x.str())); })
      .def("__reduce__", &reduce_by_state)
      .def(py::pickle([](const Mesh& x) { return py::make_tuple(x.str()); },
                      [](const py::tuple& t) {
                        return Mesh::parse(pickled<std::string>(t, 0, 1, "Mesh"), "mesh");
                      }));

  py::class_<Layout>(m, "Layout", R"doc(
A sharded tensor: global shape, dtype and "MESH:SPEC", e.g.
Layout((1024, 1024), "f32", "2x4@0-7:S0R"). dtype: "f16", "bf16", "f32", "f64", "i8" ...
"c128", a numpy dtype or a torch dtype. A spec has one token per dimension: R (whole) or S
and the mesh axes splitting it (S0, S01); "+P1" marks a pending sum over axis 1. A 0-d
tensor: shape (), spec "" or "R" (every device holds its one element).
)doc")
      .def(py::init([](py::object shape, py::object dtype, py::handle text) {
             return Layout::parse(shape_arg(shape), to_dtype(dtype, "dtype"),
                                  str_arg(text, "layout"), "layout");
           }),
           py::arg("shape"), py::arg("dtype"), py::arg("layout"))
      .def_property_readonly("shape", &shape_of)
      .def_property_readonly("dtype", [](const Layout& l) { return to_string(l.dtype()); })
      .def_property_readonly(
          "numpy_dtype", [](const Layout& l) { return numpy_dtype(l.dtype()); },
          "The numpy dtype of the elements (None for bf16).")
      .def_property_readonly("mesh", &Layout::mesh)
      .def_property_readonly("spec", [](const Layout& l) { return l.spec().str(); })
      .def_property_readonly("nbytes", &Layout::bytes, "Bytes of the whole tensor.")
      .def_property_readonly("devices", [](const Layout& l) { return l.mesh().devices(); })
      .def("local_shape", &local_shape, py::arg("device"),
           "The shape of the tile `device` holds; None when it is not in the mesh.")
      .def(
          "local_box",
          [](const Layout& l, py::handle device_obj) -> py::object {
            const int device = int32_arg(device_obj, "device");
            if (!l.mesh().contains(device)) return py::none();
            const Box b = l.tile_of(device);
            if (l.scalar()) return py::tuple();
            py::tuple t(b.ndim());
            for (std::size_t i = 0; i < b.ndim(); ++i)
              t[i] = py::slice(py::int_(b[i].lo), py::int_(b[i].hi), py::none());
            return t;
          },
          py::arg("device"), R"doc(
The part of the global tensor `device` holds, as a tuple of slices (global[layout.local_box(d)]
is its tile); None when it is not in the mesh.
)doc")
      .def_property_readonly("addends", &Layout::partial_groups,
                             "Addends of a pending sum (+P axes): 1 for a complete tensor.")
      .def(
          "addend",
          [](const Layout& l, py::handle device) -> py::object {
            const auto index = l.mesh().index_of(int32_arg(device, "device"));
            if (!index) return py::none();
            return py::int_(l.partial_group(*index));
          },
          py::arg("device"), R"doc(
Which addend of a pending sum `device` holds (0 .. addends-1; the tensor is the sum of the
addends' tiles); None when it is not in the mesh.
)doc")
      .def("__str__", &Layout::str)
      .def("__repr__",
           [](const Layout& l) {
             return "meshcast.Layout(" + py::repr(shape_of(l)).cast<std::string>() + ", '" +
                    to_string(l.dtype()) + "', '" + l.str() + "')";
           })
      .def(py::self == py::self)
      .def("__hash__",
           [](const Layout& l) {
             return py::hash(py::make_tuple(shape_of(l), to_string(l.dtype()), l.str()));
           })
      .def("__reduce__", &reduce_by_state)
      .def(py::pickle(
          [](const Layout& l) {
            return py::make_tuple(shape_of(l), to_string(l.dtype()), l.str());
          },
          [](const py::tuple& t) {
            return Layout::parse(shape_arg(pickled<py::object>(t, 0, 3, "Layout")),
                                 to_dtype(t[1], "dtype"), pickled<std::string>(t, 2, 3, "Layout"),
                                 "layout");
          }));

  py::class_<Topology>(m, "Topology", R"doc(
Where devices live: hosts and the link classes between them. Topology("dgx-a100") (a preset
installed with the package: aws-p3.8xlarge, dgx-a100, h100-cluster, gb200-nvl72, ...),
Topology("path/to/file.json") (docs/topology.md), Topology.discover(comm), or
Topology.single_host().
)doc")
      .def(py::init([](py::handle name) { return named_topology(name, "name_or_path"); }),
           py::arg("name_or_path"))
      .def_static("single_host", &Topology::single_host)
      .def_static(
          "from_json", [](py::handle text) { return Topology::from_json(json_text_arg(text)); },
          py::arg("text"))
      .def_static(
          "discover",
          refusal_gives_up<0>(+[](py::handle comm_obj, py::object preset, py::object host,
                                  py::handle probe, py::handle probe_bytes) {
            const Comm* comm = instance_of<Comm>(comm_obj);
            if (!comm)
              throw py::type_error("comm: expected a meshcast Comm, got " + type_name(comm_obj));
            DiscoverOptions o;
            if (!preset.is_none()) o.preset = str_arg(preset, "preset");
            if (!host.is_none()) o.host = str_arg(host, "host");
            o.probe = bool_arg(probe, "probe");
            o.probe_bytes =
                int_arg(probe_bytes, "probe_bytes", 0, std::numeric_limits<std::int64_t>::max());
            Communicator& c = comm->get();
            const Busy call(*comm);
            py::gil_scoped_release release;
            return discover_topology(c, o);
          }),
          py::arg("comm"), py::arg("preset") = py::none(), py::arg("host") = py::none(),
          py::arg("probe") = true, py::arg("probe_bytes") = std::int64_t{4} << 20, R"doc(
The job's topology, found by the job: collective over comm's devices, each returning the same
Topology. Devices are grouped by host name (`host`, else MESHCAST_HOSTNAME, else the machine's
name); link classes come from `preset` (a preset name or file) or, when none is given, from a
short ping-pong probe of probe_bytes (probe=False: placement only).
)doc")
      .def_property_readonly("name", &Topology::name)
      .def_property_readonly("hosts", &Topology::hosts)
      .def_property_readonly("nics_per_host", &Topology::nics_per_host)
      .def(
          "host_of",
          [](const Topology& t, py::handle device) {
            return t.host_of(int32_arg(device, "device"));
          },
          py::arg("device"))
      .def(
          "host_name",
          [](const Topology& t, py::handle host) { return t.host_name(int32_arg(host, "host")); },
          py::arg("host"))
      .def("json", &Topology::to_json)
      .def("__repr__", [](const Topology& t) { return "<meshcast.Topology '" + t.name() + "'>"; })
      .def("__reduce__", &reduce_by_state)
      .def(py::pickle([](const Topology& t) { return py::make_tuple(t.to_json()); },
                      [](const py::tuple& t) {
                        return Topology::from_json(pickled<std::string>(t, 0, 1, "Topology"));
                      }));

  py::class_<RankPlan>(m, "RankPlan", R"doc(
One device's part of a plan, computed alone (meshcast.plan_rank): what each rank of a large job
builds and executes instead of the whole plan.
)doc")
      .def_property_readonly("src", &RankPlan::src)
      .def_property_readonly("dst", &RankPlan::dst)
      .def_property_readonly("device", &RankPlan::device)
      .def_property_readonly("strategy", [](const RankPlan& p) { return to_string(p.strategy()); })
      .def_property_readonly("ops", [](const RankPlan& p) { return p.ops().size(); })
      .def("__str__", [](const RankPlan& p) { return p.str(); })
      .def(py::self == py::self);

  py::class_<PyPlan>(m, "Plan", R"doc(
The operations that move a tensor from one layout to another (from meshcast.plan()). A pure
value: print it, save it (json()), draw it (svg()), execute it many times (reshard()).
)doc")
      .def_property_readonly("src", [](const PyPlan& p) { return p.plan.src(); })
      .def_property_readonly("dst", [](const PyPlan& p) { return p.plan.dst(); })
      .def_property_readonly("strategy",
                             [](const PyPlan& p) { return to_string(p.plan.strategy()); })
      .def_property_readonly("devices", [](const PyPlan& p) { return p.plan.devices(); })
      .def_property_readonly(
          "stats", [](const PyPlan& p) { return stats_dict(p.plan); },
          "ops, phases, bytes_moved, bytes_local, bytes_intra_host, bytes_network, "
          "predicted_seconds, search_truncated.")
      .def(
          "predict",
          [](const PyPlan& p, py::object topology) {
            const Topology t = topology.is_none() ? own_topology(p) : topology_arg(topology);
            const Prediction pr = released([&] { return predict(p.plan, t); });
            return prediction_dict(pr);
          },
          py::arg("topology") = py::none(), R"doc(
The cost model's time on the plan's topology (or `topology`): a dict with seconds,
bound_seconds (the busiest link's bytes / bandwidth) and links (busiest first).
)doc")
      .def(
          "json", [](const PyPlan& p) { return released([&] { return p.plan.to_json(); }); },
          "The plan as one JSON document (Plan.from_json reads it back).")
      .def_static(
          "from_json",
          [](py::handle text_arg, py::object topology) {
            const std::string text = json_text_arg(text_arg);
            std::optional<Topology> t;
            if (!topology.is_none()) t = topology_arg(topology);
            Plan p = released([&] { return Plan::from_json(text); });
            t = saved_topology(p, std::move(t));
            return PyPlan{std::move(p), std::move(t)};
          },
          py::arg("text"), py::arg("topology") = py::none(), R"doc(
The plan a json() wrote. Its topology is `topology` (a Topology, file or preset name, refused
unless it is the one the plan names) or else the preset the plan names, if there is one here;
without it, predict() and svg() ask for one.
)doc")
      .def(
          "svg",
          [](const PyPlan& p) {
            const Topology& t = own_topology(p);
            return released([&] { return plan_svg(p.plan, t); });
          },
          "The plan drawn as SVG text: hosts as boxes, network transfers apart from intra-host "
          "ones.")
      .def(
          "rank",
          [](const PyPlan& p, py::handle device) {
            return p.plan.rank(int32_arg(device, "device"));
          },
          py::arg("device"), "Device `device`'s part of the plan (a RankPlan).")
      .def("__str__", [](const PyPlan& p) { return released([&] { return p.plan.str(); }); })
      .def("__repr__",
           [](const PyPlan& p) {
             return "<meshcast.Plan " + p.plan.src().str() + " -> " + p.plan.dst().str() + ", " +
                    to_string(p.plan.strategy()) + ", " + std::to_string(p.plan.ops().size()) +
                    " ops>";
           })
      // An operator: against anything but a Plan it returns NotImplemented (so == is False).
      .def(
          "__eq__", [](const PyPlan& a, const PyPlan& b) { return a.plan == b.plan; },
          py::is_operator())
      // Pickled as its JSON and its topology's (mpi4py's bcast of a plan made on one rank).
      .def("__reduce__", &reduce_by_state)
      .def(py::pickle(
          [](const PyPlan& p) {
            return py::make_tuple(released([&] { return p.plan.to_json(); }),
                                  p.topology ? py::str(p.topology->to_json()) : py::str());
          },
          [](const py::tuple& t) {
            const std::string plan = pickled<std::string>(t, 0, 2, "Plan");
            const std::string topology = pickled<std::string>(t, 1, 2, "Plan");
            return released([&] {
              return PyPlan{
                  Plan::from_json(plan),
                  topology.empty() ? std::nullopt : std::optional(Topology::from_json(topology))};
            });
          }));

  m.def(
      "plan",
      [](py::handle src_arg, py::handle dst_arg, py::object topology, py::handle strategy,
         py::handle balance) {
        const Layout &src = layout_arg(src_arg, "src"), &dst = layout_arg(dst_arg, "dst");
        PlanOptions o;
        o.strategy = strategy_arg(str_arg(strategy, "strategy"));
        o.balance = parse_balance(str_arg(balance, "balance"), "balance");
        Topology t = topology_arg(topology);
        py::gil_scoped_release release;
        Plan p = meshcast::plan(src, dst, t, o);
        return PyPlan{std::move(p), std::move(t)};
      },
      py::arg("src"), py::arg("dst"), py::arg("topology") = py::none(),
      py::arg("strategy") = "auto", py::arg("balance") = "search", R"doc(
Plans the move of a tensor from layout `src` to layout `dst` (same shape and dtype; meshes may
differ, overlap or be disjoint). topology: None (one host), a Topology, a file or a preset name.
strategy: "auto" (the cheapest by the cost model), "broadcast", "sendrecv" or "allgather".
balance: how senders are chosen, "search" (default), "greedy", "local" or "none".
Returns a Plan; meshcast.reshard(plan, comm, src_array, dst_array) executes it.
)doc");
  m.def(
      "plan_rank",
      [](py::handle src_arg, py::handle dst_arg, py::handle device_arg, py::object topology,
         py::handle strategy) {
        const Layout &src = layout_arg(src_arg, "src"), &dst = layout_arg(dst_arg, "dst");
        const int device = int32_arg(device_arg, "device");
        PlanOptions o;
        o.strategy = strategy_arg(str_arg(strategy, "strategy"));
        o.balance = Balance::Local;
        Topology t = topology_arg(topology);
        py::gil_scoped_release release;
        return meshcast::plan_rank(src, dst, device, t, o);
      },
      py::arg("src"), py::arg("dst"), py::arg("device"), py::arg("topology") = py::none(),
      py::arg("strategy") = "auto", R"doc(
Device `device`'s part of plan(src, dst, topology, strategy) with senders chosen by the local
rule, computed without the rest of the plan: in a job of thousands of ranks, each calls
plan_rank(src, dst, comm.rank) and reshard()s it.
)doc");
}

}  // namespace meshcast::python
