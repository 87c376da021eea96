// Whole-model sync from Python: a list of (name, src, dst) moves, planned per device and run
// on dicts {name: array}.
#include "meshcast/sync.h"

#include <pybind11/stl.h>

#include <set>

#include "lib/support/text.h"
#include "meshcast/manifest.h"
#include "python/src/comm.h"
#include "python/src/execute.h"
#include "python/src/instance.h"
#include "python/src/ints.h"
#include "python/src/plan.h"
#include "python/src/sync.h"
#include "python/src/tile.h"

namespace meshcast::python {
namespace {

std::vector<TensorMove> moves_arg(py::handle obj) {
  std::vector<TensorMove> out;
  if (!py::isinstance<py::sequence>(obj) && !py::isinstance<py::iterable>(obj))
    throw py::type_error("tensors: expected a list of (name, src Layout, dst Layout)");
  std::size_t i = 0;
  for (py::handle item : obj) {
    const std::string arg = "tensors[" + std::to_string(i++) + "]";
    py::tuple t;
    try {
      t = item.cast<py::tuple>();
    } catch (py::cast_error&) {
      throw py::type_error(arg + ": expected a (name, src Layout, dst Layout) tuple");
    }
    if (t.size() != 3 || !py::isinstance<py::str>(t[0]) || !py::isinstance<Layout>(t[1]) ||
        !py::isinstance<Layout>(t[2]))
      throw py::type_error(arg + ": expected a (name, src Layout, dst Layout) tuple");
    out.push_back({str_arg(t[0], arg + "[0]"), t[1].cast<Layout>(), t[2].cast<Layout>()});
  }
  return out;
}

py::list moves_list(const std::vector<TensorMove>& moves) {
  py::list out;
  for (const TensorMove& m : moves) out.append(py::make_tuple(m.name, m.src, m.dst));
  return out;
}

SyncOptions options_arg(py::handle max_staging_bytes, py::handle bucket_bytes,
                        py::handle pack_bytes, py::handle strategy, py::handle fork) {
  constexpr auto kMost = std::numeric_limits<std::int64_t>::max();
  SyncOptions o;  // (plan_sync checks each's range; these read them as ints)
  o.max_staging_bytes = int_arg(max_staging_bytes, "max_staging_bytes", -kMost, kMost);
  o.bucket_bytes = int_arg(bucket_bytes, "bucket_bytes", -kMost, kMost);
  o.pack_bytes = int_arg(pack_bytes, "pack_bytes", -kMost, kMost);
  o.plan.strategy = parse_strategy(str_arg(strategy, "strategy"), "strategy");
  o.plan.fork = bool_arg(fork, "fork");
  return o;
}

// `whole`: predict_sync's, with what only the whole sync priced on its topology says.
py::dict stats_dict(const SyncStats& s, bool whole) {
  py::dict d;
  d["tensors"] = s.tensors;
  d["messages"] = s.messages;
  d["boxes"] = s.boxes;
  d["bytes_moved"] = s.bytes_moved;
  if (!whole) return d;
  d["bytes_network"] = s.bytes_network;
  d["predicted_seconds"] = s.predicted_seconds;
  d["link_bound_seconds"] = s.link_bound_seconds;
  d["busiest_link"] = s.busiest_link;
  return d;
}

// The SyncPlan `obj` is; else a TypeError naming the argument (pybind11's own took four lines).
const SyncPlan& sync_plan_arg(py::handle obj) {
  if (const SyncPlan* p = instance_of<SyncPlan>(obj)) return *p;
  if (py::isinstance<SyncPlan>(obj)) return obj.cast<const SyncPlan&>();
  throw py::type_error("plan: expected a meshcast SyncPlan (from plan_sync), got " +
                       type_name(obj));
}

// Views by tensor index from a dict {name: array}: every tile this device holds (or receives)
// present, nothing else.
std::vector<Array> buffers(const SyncPlan& plan, py::handle obj, const std::string& arg,
                           bool writable, Kept& keep) {
  if (!py::isinstance<py::dict>(obj)) throw py::type_error(arg + ": expected a dict {name: array}");
  py::dict d = py::reinterpret_borrow<py::dict>(obj);
  for (auto item : d) {
    if (!py::isinstance<py::str>(item.first))
      throw py::type_error(arg + ": keys must be tensor names (str)");
    const std::string name = str_arg(item.first, arg + " key");
    if (plan.index(name) < 0)
      throw py::value_error(arg + "[" + detail::quote(name, detail::kNameWidth) +
                            "]: not a tensor of the sync");
  }
  std::vector<Array> out;
  for (const TensorMove& m : plan.tensors()) {
    const Layout& l = writable ? m.dst : m.src;
    py::object a = d.contains(m.name) ? py::object(d[py::str(m.name)]) : py::object(py::none());
    out.push_back(tile_array(a, l, plan.device(),
                             arg + "[" + detail::quote(m.name, detail::kNameWidth) + "]", writable,
                             keep));
  }
  return out;
}

struct Bound {
  PyGroup group;
  std::vector<const void*> src;
  std::vector<void*> dst;
  Kept keep;
};

Bound bind_buffers(const SyncPlan& plan, py::object comm, py::object src, py::object dst) {
  Bound b{group_arg(comm), {}, {}, {}};
  if (plan.device() != b.group.comm.rank())
    throw py::value_error("plan: device " + std::to_string(plan.device()) +
                          "'s part of the sync; this is device " +
                          std::to_string(b.group.comm.rank()));
  const auto reads = buffers(plan, src, "src", false, b.keep);
  const auto writes = buffers(plan, dst, "dst", true, b.keep);
  std::vector<Use> uses;
  for (std::size_t i = 0; i < reads.size(); ++i) {
    uses.push_back({&reads[i],
                    "src[" + detail::quote(plan.tensors()[i].name, detail::kNameWidth) + "]",
                    false});
    uses.push_back({&writes[i],
                    "dst[" + detail::quote(plan.tensors()[i].name, detail::kNameWidth) + "]",
                    true});
  }
  check_disjoint(std::move(uses));
  for (std::size_t i = 0; i < reads.size(); ++i) {
    b.src.push_back(reads[i].data);
    b.dst.push_back(writes[i].data);
  }
  return b;
}

}  // namespace

void bind_sync(py::module_& m) {
  py::class_<SyncPlan>(m, "SyncPlan", R"doc(
One device's part of a whole-model sync (meshcast.plan_sync): its coalesced messages and
local copies. Execute it with meshcast.sync(plan, comm, src_dict, dst_dict).
)doc")
      .def_property_readonly("device", &SyncPlan::device)
      .def_property_readonly("tensors",
                             [](const SyncPlan& p) {
                               std::vector<std::string> names;
                               for (const auto& t : p.tensors()) names.push_back(t.name);
                               return names;
                             })
      .def(
          "index",
          [](const SyncPlan& p, py::handle name) { return p.index(str_arg(name, "name")); },
          py::arg("name"), "The tensor's index, or -1.")
      .def_property_readonly(
          "stats", [](const SyncPlan& p) { return stats_dict(p.stats(), false); },
          "This device's part: tensors, messages, boxes, bytes_moved (the bytes it receives). "
          "predict_sync prices the whole sync (bytes_network, predicted_seconds, ...).")
      .def("__str__", [](const SyncPlan& p) { return p.str(); });

  const auto staging = py::arg("max_staging_bytes") = std::int64_t{64} << 20;
  const auto bucket = py::arg("bucket_bytes") = std::int64_t{0};
  const auto pack = py::arg("pack_bytes") = std::int64_t{64} << 10;
  const auto fork = py::arg("fork") = true;  // a bool, not 0 or 1 (bool_arg)
  m.def(
      "plan_sync",
      [](py::object tensors, py::handle device_obj, py::object topology, py::handle max_staging,
         py::handle bucket_bytes, py::handle pack_bytes, py::handle strategy, py::handle fork) {
        const int device = int32_arg(device_obj, "device");
        auto moves = moves_arg(tensors);
        const Topology t = topology_arg(topology);
        const SyncOptions o = options_arg(max_staging, bucket_bytes, pack_bytes, strategy, fork);
        py::gil_scoped_release release;
        return plan_sync(std::move(moves), device, t, o);
      },
      py::arg("tensors"), py::arg("device"), py::arg("topology") = py::none(), staging, bucket,
      pack, py::arg("strategy") = "auto", fork, R"doc(
Device `device`'s part of moving many tensors at once. tensors: a list of (name, src Layout,
dst Layout) (dst's dtype may be bf16/f16 for an f32 src: cast at the sender), e.g. from
meshcast.load_model(). Boxes between the same sender and receivers are coalesced into
messages of at most bucket_bytes (0: min(4 MiB, max_staging_bytes / 4)); packing memory in
flight stays under max_staging_bytes per device. fork=False: multicast chains never fork at the
root (by default one forks where the sources on its host use more NICs than its receivers
there; meshcast sync --no-fork).
)doc");
  m.def(
      "predict_sync",
      [](py::object tensors, py::object topology, py::handle max_staging, py::handle bucket_bytes,
         py::handle pack_bytes, py::handle strategy, py::handle fork) {
        auto moves = moves_arg(tensors);
        const Topology t = topology_arg(topology);
        const SyncOptions o = options_arg(max_staging, bucket_bytes, pack_bytes, strategy, fork);
        SyncStats stats;
        {
          py::gil_scoped_release release;
          stats = predict_sync(moves, t, o);
        }
        return stats_dict(stats, true);
      },
      py::arg("tensors"), py::arg("topology") = py::none(), staging, bucket, pack,
      py::arg("strategy") = "auto", fork,
      "The whole sync priced by the cost model (a dict: predicted_seconds, link_bound_seconds, "
      "busiest_link, messages, bytes_moved, ...). Plans every device: for planning, not jobs.");
  m.def("sync",
        refusal_gives_up<1>(
            +[](py::handle plan_obj, py::object comm, py::object src, py::object dst) {
              const SyncPlan& plan = sync_plan_arg(plan_obj);
              Bound b = bind_buffers(plan, comm, src, dst);
              const Busy call(b.group.comm, b.keep.spans);
              py::gil_scoped_release release;
              sync(plan, b.group.group, b.src, b.dst);
            }),
        py::arg("plan"), py::arg("comm"), py::arg("src"), py::arg("dst"), R"doc(
Executes this device's part of a sync. src: {name: this device's source tile} for every
tensor whose source mesh holds the device (absent or None otherwise); dst likewise for the
targets, written in place. Arrays are numpy or DLPack (torch CPU) tensors, C-contiguous,
of the layout's dtype and local shape. Every device of the sync calls it. A refused argument
raises ValueError/TypeError and gives the communicator up (its peers fail naming this device).
)doc");
  m.def("isync",
        refusal_gives_up<1>(
            +[](py::handle plan_obj, py::object comm, py::object src, py::object dst) {
              const SyncPlan& plan = sync_plan_arg(plan_obj);
              Bound b = bind_buffers(plan, comm, src, dst);
              const std::vector<MemorySpan> uses = b.keep.spans;
              Handle h(b.group, std::move(b.keep));
              {
                const Busy call(b.group.comm, uses);
                py::gil_scoped_release release;
                h.op->transfer = isync(plan, b.group.group, b.src, b.dst);
              }
              return h;
            }),
        py::arg("plan"), py::arg("comm"), py::arg("src"), py::arg("dst"),
        "sync() started without blocking: returns a Handle (test(), wait()).");
  m.def(
      "load_model",
      [](py::object path, py::object system, py::object cast) {
        const std::string model = str_arg(path, "path", true);
        std::optional<SystemConfig> sys;
        if (!system.is_none()) sys = load_system_config(str_arg(system, "system", true));
        std::optional<DType> c;
        if (!cast.is_none()) c = parse_dtype(str_arg(cast, "cast"), "cast");
        return moves_list(load_model(model, sys ? &*sys : nullptr, c).moves);
      },
      py::arg("path"), py::arg("system") = py::none(), py::arg("cast") = py::none(), R"doc(
The tensors of a model file as [(name, src Layout, dst Layout)]: NCCL M2N's model config with
its system config (`system`; Megatron placement), or meshcast's explicit form. Paths are str or
os.PathLike.
cast: "bf16" or "f16" for the target dtype of f32 tensors.
)doc");
}

}  // namespace meshcast::python
