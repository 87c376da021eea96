// reshard / ireshard and the collectives on arrays: checked against the layout or each other,
// then run with the GIL released, zero-copy.
#include "python/src/execute.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "lib/support/text.h"
#include "meshcast/collectives.h"
#include "meshcast/reshard.h"
#include "meshcast/sparse.h"
#include "python/src/comm.h"
#include "python/src/instance.h"
#include "python/src/ints.h"
#include "python/src/plan.h"
#include "python/src/tile.h"

namespace meshcast::python {
namespace {

// What every entry point needs: the plan's part for this device, checked buffers.
struct Prepared {
  PyGroup group;
  const void* src = nullptr;
  void* dst = nullptr;
  Kept keep;
};

// `shapes`: a Python Plan's cache of tile shapes (none for a RankPlan).
template <class P>
Prepared prepare(const P& plan, py::handle comm, py::handle src, py::handle dst,
                 const PyPlan* shapes) {
  Prepared p{group_arg(comm), nullptr, nullptr, {}};
  const int me = p.group.comm.rank();
  const PyPlan::TileShapes* tiles = nullptr;
  if (shapes) {
    auto [at, fresh] = shapes->tiles.try_emplace(me);
    const auto extents = [&](const Layout& l) {
      return l.mesh().contains(me) ? tile_shape(l, me) : std::vector<std::int64_t>{};
    };
    if (fresh) at->second = {extents(plan.src()), extents(plan.dst())};
    tiles = &at->second;
  }
  const Array a =
      tile_array(src, plan.src(), me, "src", false, p.keep, tiles ? &tiles->first : nullptr);
  const Array b =
      tile_array(dst, plan.dst(), me, "dst", true, p.keep, tiles ? &tiles->second : nullptr);
  check_disjoint(a, "src", b, "dst");
  p.src = a.data;
  p.dst = b.data;
  return p;
}

// A Plan or a RankPlan, as reshard and ireshard take either: f(plan, the Python Plan or null).
template <class F>
auto with_plan(py::handle plan, F&& f) {
  if (const PyPlan* p = instance_of<PyPlan>(plan)) return f(p->plan, p);
  if (const RankPlan* p = instance_of<RankPlan>(plan)) return f(*p, nullptr);
  if (py::isinstance<PyPlan>(plan)) {
    const PyPlan& p = plan.cast<const PyPlan&>();
    return f(p.plan, &p);
  }
  if (py::isinstance<RankPlan>(plan)) return f(plan.cast<const RankPlan&>(), nullptr);
  throw py::type_error("plan: expected a meshcast Plan or RankPlan, got " + type_name(plan));
}

void reshard_py(py::object plan, py::object comm, py::object src, py::object dst) {
  with_plan(plan, [&](const auto& pl, const PyPlan* py_plan) {
    Prepared p = prepare(pl, comm, src, dst, py_plan);
    const Busy call(p.group.comm, p.keep.spans);
    py::gil_scoped_release release;
    reshard(pl, p.group.group, p.src, p.dst);
  });
}

Handle ireshard_py(py::object plan, py::object comm, py::object src, py::object dst) {
  return with_plan(plan, [&](const auto& pl, const PyPlan* py_plan) {
    Prepared p = prepare(pl, comm, src, dst, py_plan);
    const std::vector<MemorySpan> uses = p.keep.spans;
    Handle h(p.group, std::move(p.keep));
    {
      const Busy call(p.group.comm, uses);
      py::gil_scoped_release release;
      h.op->transfer = ireshard(pl, p.group.group, p.src, p.dst);
    }
    return h;
  });
}

// A collective's group and options (the topology kept alive with the handle).
struct Setup {
  PyGroup group;
  CollectiveOptions options;
  std::shared_ptr<Topology> topology;
  Kept keep;
  int n = 0, k = 0;
};

Setup setup(py::handle comm, py::handle algorithm, py::handle topology) {
  Setup s{group_arg(comm), {}, nullptr, {}, 0, 0};
  // Python spells names with underscores; the C++ names use hyphens ("recursive-doubling"), and
  // C++'s message would name both those and its blocking-only shared-memory.
  const std::string given = str_arg(algorithm, "algorithm");
  std::string name = given;
  std::replace(name.begin(), name.end(), '_', '-');
  const char* const names = "auto, ring, recursive_doubling, halving_doubling or hierarchical";
  try {
    s.options.algorithm = parse_algorithm(name, "algorithm");
  } catch (const ParseError&) {
    throw ParseError("algorithm",
                     "unknown algorithm " + detail::quote(given) + " (expected " + names + ")");
  }
  // Every call here runs in flight (then waits unless async_op): C++'s message, "only in the
  // blocking forms", would name forms Python has not.
  if (s.options.algorithm == Algorithm::SharedMemory)
    throw py::value_error(std::string("algorithm: shared_memory is C++'s blocking algorithm only; "
                                      "here: ") +
                          names);
  if (!topology.is_none()) {
    s.topology = std::make_shared<Topology>(topology_arg(topology));
    s.options.topology = s.topology.get();
  }
  s.n = s.group.group.size();
  s.k = s.group.group.index_of(s.group.comm.rank());
  if (s.k < 0)
    throw py::value_error("comm: device " + std::to_string(s.group.comm.rank()) +
                          " is not a member of the group");
  return s;
}

// `b` (the argument `arg`) holds a's dtype, a being the argument `as`.
void same_dtype(const Array& a, const Array& b, const std::string& arg,
                const std::string& as = "send") {
  if (a.dtype != b.dtype)
    throw py::type_error(arg + ": expected " + to_string(a.dtype) + " elements (as " + as +
                         "), got " + to_string(b.dtype));
}

void expect_elements(const Array& a, std::int64_t n, const std::string& arg,
                     const std::string& why) {
  if (a.elements() != n)
    throw py::value_error(arg + ": expected " + std::to_string(n) + " elements (" + why +
                          "), got " + std::to_string(a.elements()) + " (shape " +
                          shape_text(a.shape) + ")");
}

// Member k's piece of n elements split over `members` (meshcast's uneven split).
std::int64_t piece(std::int64_t count, int members, int k) {
  return (k + 1) * count / members - k * count / members;
}

py::object finish(Setup& s, Collective c, bool async_op) {
  if (async_op) {
    Handle h(s.group, std::move(s.keep));
    h.topology = std::move(s.topology);
    h.op->collective = std::move(c);
    return py::cast(std::move(h));
  }
  {
    const Busy call(s.group.comm);
    py::gil_scoped_release release;
    c.wait();
  }
  return py::none();
}

py::object all_reduce_py(py::object comm, py::object send, py::object recv, py::handle op,
                         py::handle algorithm, py::object topology, py::handle async_op_arg) {
  const bool async_op = bool_arg(async_op_arg, "async_op");
  Setup s = setup(comm, algorithm, topology);
  const ReduceOp rop = parse_reduce_op(str_arg(op, "op"), "op");
  Array a = collective_array(send, "send", recv.is_none(), s.keep);
  Array b = recv.is_none() ? a : collective_array(recv, "recv", true, s.keep);
  same_dtype(a, b, "recv");
  expect_elements(b, a.elements(), "recv", "as many as send");
  if (a.data != b.data) check_disjoint(a, "send", b, "recv");
  Collective c;
  {
    const Busy call(s.group.comm, s.keep.spans);
    py::gil_scoped_release release;
    c = iall_reduce(s.group.group, a.data, b.data, a.elements(), a.dtype, rop, s.options);
  }
  return finish(s, std::move(c), async_op);
}

py::object reduce_scatter_py(py::object comm, py::object send, py::object recv, py::handle op,
                             py::handle algorithm, py::object topology, py::handle async_op_arg) {
  const bool async_op = bool_arg(async_op_arg, "async_op");
  Setup s = setup(comm, algorithm, topology);
  const ReduceOp rop = parse_reduce_op(str_arg(op, "op"), "op");
  Array a = collective_array(send, "send", false, s.keep);
  Array b = collective_array(recv, "recv", true, s.keep);
  same_dtype(a, b, "recv");
  expect_elements(b, piece(a.elements(), s.n, s.k), "recv",
                  "member " + std::to_string(s.k) + "'s piece of send's " +
                      std::to_string(a.elements()) + " over " + std::to_string(s.n));
  check_disjoint(a, "send", b, "recv");
  Collective c;
  {
    const Busy call(s.group.comm, s.keep.spans);
    py::gil_scoped_release release;
    c = ireduce_scatter(s.group.group, a.data, b.data, a.elements(), a.dtype, rop, s.options);
  }
  return finish(s, std::move(c), async_op);
}

py::object all_gather_py(py::object comm, py::object send, py::object recv, py::handle algorithm,
                         py::object topology, py::handle async_op_arg) {
  const bool async_op = bool_arg(async_op_arg, "async_op");
  Setup s = setup(comm, algorithm, topology);
  Array b = collective_array(recv, "recv", true, s.keep);
  Array a = collective_array(send, "send", false, s.keep);
  same_dtype(b, a, "send", "recv");
  expect_elements(a, piece(b.elements(), s.n, s.k), "send",
                  "member " + std::to_string(s.k) + "'s piece of recv's " +
                      std::to_string(b.elements()) + " over " + std::to_string(s.n));
  // In place is send = this member's piece of recv, nothing else that overlaps.
  const auto own = static_cast<const char*>(b.data) +
                   s.k * b.elements() / s.n * static_cast<std::int64_t>(dtype_size(b.dtype));
  if (a.data != own) check_disjoint(a, "send", b, "recv");
  Collective c;
  {
    const Busy call(s.group.comm, s.keep.spans);
    py::gil_scoped_release release;
    c = iall_gather(s.group.group, a.data, b.data, b.elements(), a.dtype, s.options);
  }
  return finish(s, std::move(c), async_op);
}

py::object broadcast_py(py::object comm, py::object buf, py::handle root_obj,
                        py::handle async_op_arg) {
  const bool async_op = bool_arg(async_op_arg, "async_op");
  const int root = int32_arg(root_obj, "root");
  Setup s = setup(comm, py::str("auto"), py::none());
  if (!s.group.group.contains(root))
    throw py::value_error("root: device " + std::to_string(root) + " is not in the group");
  Array a = collective_array(buf, "buf", root != s.group.comm.rank(), s.keep);
  Collective c;
  {
    const Busy call(s.group.comm, s.keep.spans);
    py::gil_scoped_release release;
    c = ibroadcast(s.group.group, root, a.data, a.elements(), a.dtype, s.options);
  }
  return finish(s, std::move(c), async_op);
}

std::vector<std::int64_t> counts_arg(py::handle obj, const Array& a, int n, const std::string& arg,
                                     const std::string& of) {
  if (obj.is_none()) {
    if (a.elements() % n != 0)
      throw py::value_error(arg + ": " + of + "'s " + std::to_string(a.elements()) +
                            " elements do not split evenly over " + std::to_string(n) +
                            " members; give " + arg);
    return std::vector<std::int64_t>(static_cast<std::size_t>(n), a.elements() / n);
  }
  // A sequence of ints, each in [0, elements] (a TypeError or ValueError naming arg[k]).
  auto counts = ints_arg(obj, arg, 0, a.elements());
  if (static_cast<int>(counts.size()) != n)
    throw py::value_error(arg + ": expected " + std::to_string(n) +
                          " counts (one per member), got " + std::to_string(counts.size()));
  std::int64_t total = 0;
  bool over = false;  // (summed only while within elements: no overflow)
  for (std::int64_t c : counts) {
    over = over || c > a.elements() - total;
    if (!over) total += c;
  }
  if (over || total != a.elements())
    throw py::value_error(
        arg + ": counts add up to " +
        (over ? "more than " + std::to_string(a.elements()) : std::to_string(total)) + ", " + of +
        " has " + std::to_string(a.elements()) + " elements");
  return counts;
}

py::object all_to_all_py(py::object comm, py::object send, py::object recv, py::object send_counts,
                         py::object recv_counts, py::handle async_op_arg) {
  const bool async_op = bool_arg(async_op_arg, "async_op");
  Setup s = setup(comm, py::str("auto"), py::none());
  Array a = collective_array(send, "send", false, s.keep);
  Array b = collective_array(recv, "recv", true, s.keep);
  same_dtype(a, b, "recv");
  check_disjoint(a, "send", b, "recv");
  auto sc = counts_arg(send_counts, a, s.n, "send_counts", "send");
  auto rc = counts_arg(recv_counts, b, s.n, "recv_counts", "recv");
  Collective c;
  {
    const Busy call(s.group.comm, s.keep.spans);
    py::gil_scoped_release release;
    c = iall_to_allv(s.group.group, a.data, sc, b.data, rc, a.dtype, s.options);
  }
  return finish(s, std::move(c), async_op);
}

std::string sparse_all_reduce_py(py::object comm, py::object grad, py::object out,
                                 py::handle method_arg, py::object topology) {
  const std::string method = str_arg(method_arg, "method");
  Setup s = setup(comm, py::str("auto"), topology);
  Array g = collective_array(grad, "grad", false, s.keep);
  Array o = collective_array(out, "out", true, s.keep);
  if (g.dtype != DType::f32 || g.shape.size() != 2)
    throw py::type_error("grad: expected a 2-D f32 array (rows x width), got " +
                         to_string(g.dtype) + " of shape " + shape_text(g.shape));
  if (o.dtype != DType::f32 || o.shape != g.shape)
    throw py::value_error("out: expected an f32 array of grad's shape " + shape_text(g.shape) +
                          ", got " + to_string(o.dtype) + " of shape " + shape_text(o.shape));
  check_disjoint(g, "grad", o, "out");
  const SparseMethod m = parse_sparse_method(method, "method");
  const Busy call(s.group.comm, s.keep.spans);
  py::gil_scoped_release release;
  const auto* values = static_cast<const float*>(g.data);
  SparseRows rows = SparseRows::from_dense({values, static_cast<std::size_t>(g.elements())},
                                           g.shape[0], g.shape[1]);
  return to_string(sparse_all_reduce(
      s.group.group, rows, {static_cast<float*>(o.data), static_cast<std::size_t>(o.elements())}, m,
      s.options));
}

// The C++ baseline of bench/python_reshard.py: `iters` reshards of the same plan and buffers in
// one C++ loop (the arguments checked once), seconds per reshard.
double reshard_loop(py::object plan, py::object comm, py::object src, py::object dst, int iters) {
  if (iters < 1) throw py::value_error("iters: must be >= 1");
  return with_plan(plan, [&](const auto& pl, const PyPlan* py_plan) {
    Prepared p = prepare(pl, comm, src, dst, py_plan);
    const Busy call(p.group.comm, p.keep.spans);
    py::gil_scoped_release release;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) reshard(pl, p.group.group, p.src, p.dst);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  });
}

}  // namespace

Handle::Handle(PyGroup g, Kept arrays)
    : keep(std::move(arrays.objects)), group(std::move(g)), op(std::make_shared<Pending>()) {
  group->comm.life().track(op, std::move(arrays.spans));
}

Handle::~Handle() {
  // Moved from, waited for, or ended with its communicator (Life::end): nothing in flight. (Not
  // op->done(): another thread's call may be stepping the operation meanwhile.)
  if (!op || !group || adopted || op->observed || !group->comm.alive()) return;
  const PyGroup held = *group;  // the session, until the communicator is free again
  Life& life = held.comm.life();
  auto orphan = std::make_shared<Handle>(std::move(*this));
  orphan->adopted = true;
  std::function<void()> drop = [orphan] { orphan->drop(); };
  if (life.adopt_if_busy(drop)) return;
  drop();
  life.leave();  // (with any drop adopted meanwhile)
}  // the arrays, then the session, go with the communicator free

void Handle::drop() {
  if (group->comm.life().unusable()) Life::let_go(*op);
  if (op->done()) return;
  const Interrupted::Quiet quiet;
  py::gil_scoped_release release;
  if (op->collective) {
    try {
      op->collective->wait();
    } catch (const std::exception&) {  // a failed peer: nothing is in flight any more
    }
  }
  // Abandons it: the peers fail naming this device (it waits up to a second for what they
  // already matched).
  op->transfer.reset();
}

// A test() or wait() that raised ended its operation as well (what it had posted was cancelled):
// its arrays are the caller's again, not "in flight" (Life::check_free).
bool Handle::test() {
  const Busy call(group->comm);  // raises once the communicator ended
  py::gil_scoped_release release;
  try {
    const bool done =
        (!op->transfer || op->transfer->test()) && (!op->collective || op->collective->test());
    if (done) op->observed = true;  // (the call is the communicator's only one: Busy)
    return done;
  } catch (...) {
    op->observed = true;
    throw;
  }
}

void Handle::wait() {
  const Busy call(group->comm);  // raises once the communicator ended
  py::gil_scoped_release release;
  try {
    if (op->transfer) op->transfer->wait();
    if (op->collective) op->collective->wait();
  } catch (...) {
    op->observed = true;
    throw;
  }
  op->observed = true;
}

bool Handle::done() const { return op->done(); }

void bind_execute(py::module_& m) {
  py::class_<Handle>(m, "Handle", R"doc(
A reshard, sync or collective in flight. test() moves it on without blocking and says whether
it finished; wait() finishes it. Progress happens only inside these calls (and later operations
on the same group). Keeps its arrays and its communicator alive until then. Dropping an
unfinished reshard or sync abandons it (its peers fail with an error naming this device);
dropping an unfinished collective finishes it first. When the communicator ends (its LocalWorld
fn returns, the interpreter exits) anything still in flight is abandoned: done stays False, and
using the handle raises ValueError.
)doc")
      .def("test", &Handle::test)
      .def("wait", &Handle::wait)
      .def_property_readonly("done", &Handle::done);

  const char* reshard_doc = R"doc(
Executes `plan` (a Plan, or this device's RankPlan from plan_rank) on this device.
comm: a Comm or a Group holding every device of the plan; every member calls it, in the same
order as its other operations on the group.
src: this device's tile of plan.src (shape plan.src.local_shape(comm.rank), the layout's
dtype, C-contiguous; a numpy array or a DLPack tensor such as a torch CPU tensor), or None
when the device is not in the source mesh. dst: likewise for plan.dst, writable; it is
written in place (no copy). Raises ValueError/TypeError naming the argument for a wrong
array, and gives the communicator up (its peers fail naming this device: make a new one to go
on); CommError when a peer fails. The GIL is released while data moves.
)doc";
  m.def("reshard", refusal_gives_up<1>(&reshard_py), py::arg("plan"), py::arg("comm"),
        py::arg("src"), py::arg("dst"), reshard_doc);
  m.def("ireshard", refusal_gives_up<1>(&ireshard_py), py::arg("plan"), py::arg("comm"),
        py::arg("src"), py::arg("dst"),
        "reshard() started without blocking: returns a Handle (test(), wait()).");

  m.def("_reshard_loop", refusal_gives_up<1>(&reshard_loop), py::arg("plan"), py::arg("comm"),
        py::arg("src"), py::arg("dst"), py::arg("iters"),
        "Benchmark baseline: `iters` reshards in one C++ loop; seconds per reshard.");

  m.def("all_reduce", refusal_gives_up<0>(&all_reduce_py), py::arg("comm"), py::arg("send"),
        py::arg("recv") = py::none(), py::arg("op") = "sum", py::arg("algorithm") = "auto",
        py::arg("topology") = py::none(), py::arg("async_op") = false, R"doc(
recv = op ("sum" or "max") over the group's members of send, elementwise; recv None: in place
(send must be writable). comm: a Comm (the world) or a Group; every member calls it.
algorithm: "auto" (by the cost model on `topology`), "ring", "recursive_doubling",
"halving_doubling", "hierarchical" (hyphens work too). async_op=True returns a Handle.
)doc");
  m.def("reduce_scatter", refusal_gives_up<0>(&reduce_scatter_py), py::arg("comm"), py::arg("send"),
        py::arg("recv"), py::arg("op") = "sum", py::arg("algorithm") = "auto",
        py::arg("topology") = py::none(), py::arg("async_op") = false, R"doc(
recv = this member's piece of op ("sum" or "max") over the group of send: member k of n gets the
elements [k*N//n, (k+1)*N//n) of N = send's elements.
)doc");
  m.def("all_gather", refusal_gives_up<0>(&all_gather_py), py::arg("comm"), py::arg("send"),
        py::arg("recv"), py::arg("algorithm") = "auto", py::arg("topology") = py::none(),
        py::arg("async_op") = false, R"doc(
recv (N elements) = every member's piece in group order; member k of n sends its piece of
[k*N//n, (k+1)*N//n) elements.
)doc");
  m.def("broadcast", refusal_gives_up<0>(&broadcast_py), py::arg("comm"), py::arg("buf"),
        py::arg("root"), py::arg("async_op") = false,
        "buf of device `root` to every member of the group.");
  m.def("all_to_all", refusal_gives_up<0>(&all_to_all_py), py::arg("comm"), py::arg("send"),
        py::arg("recv"), py::arg("send_counts") = py::none(), py::arg("recv_counts") = py::none(),
        py::arg("async_op") = false, R"doc(
Member j's block k of send goes to member k, blocks packed in group order. Without counts,
send and recv split evenly over the members; with them, send_counts[k] elements go to member
k and recv_counts[j] come from member j.
)doc");
  m.def("sparse_all_reduce", refusal_gives_up<0>(&sparse_all_reduce_py), py::arg("comm"),
        py::arg("grad"), py::arg("out"), py::arg("method") = "auto",
        py::arg("topology") = py::none(), R"doc(
out = the sum over the group of grad, a (rows x width) f32 gradient whose rows are mostly
zero (an embedding table's), moving only the non-zero rows. method: "auto", "dense",
"allgather" or "balanced". Returns the method used.
)doc");
}

}  // namespace meshcast::python
