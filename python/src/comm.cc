#include "python/src/comm.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <mutex>
#include <vector>

#include "meshcast/bootstrap.h"
#include "meshcast/local.h"
#ifdef MESHCAST_HAS_MPI
#include "meshcast/mpi.h"
#endif
#ifdef MESHCAST_HAS_UCX
#include "meshcast/ucx.h"
#endif
#ifdef MESHCAST_HAS_MPI4PY
#include <mpi.h>
#include <mpi4py/mpi4py.h>
#endif

namespace meshcast::python {
namespace {

using Alive = std::shared_ptr<std::atomic<bool>>;

// A process session (MPI or UCX over a bootstrap) that Python may close at exit before the
// host program tears MPI down: handles stay valid objects, their use then raises.
struct Session {
  std::unique_ptr<Bootstrap> bootstrap;  // TCP rendezvous of a UCX session
  std::shared_ptr<void> transport;       // the MpiSession / UcxSession
  Communicator* comm = nullptr;
  Alive alive = std::make_shared<std::atomic<bool>>(true);
  void close() {
    alive->store(false);
    transport.reset();
    bootstrap.reset();
  }
};

std::mutex sessions_mutex;
std::vector<std::weak_ptr<Session>> sessions;

Comm open(std::shared_ptr<Session> s) {
  {
    std::lock_guard lock(sessions_mutex);
    sessions.push_back(s);
  }
  Communicator* c = s->comm;
  Alive alive = s->alive;
  return Comm(c, std::move(s), std::move(alive));
}

// At interpreter exit, before mpi4py's MPI_Finalize (atexit runs last-registered first, and
// this is registered after mpi4py was imported).
void close_sessions() {
  std::lock_guard lock(sessions_mutex);
  for (auto& w : sessions)
    if (auto s = w.lock()) s->close();
  sessions.clear();
}

void register_close_at_exit() {
  static bool done = false;
  if (done) return;
  done = true;
  py::module_::import("atexit").attr("register")(py::cpp_function(&close_sessions));
}

#ifdef MESHCAST_HAS_MPI
MpiOptions mpi_options(double timeout) {
  MpiOptions o;
  o.timeout_seconds = timeout;
  return o;
}
#endif

void check_timeout(double timeout) {
  if (!(timeout > 0 && timeout <= 1e6))
    throw py::value_error("timeout: must be in (0, 1e6] seconds, got " + std::to_string(timeout));
}

Comm from_mpi4py(py::object comm, double timeout) {
  check_timeout(timeout);
#if defined(MESHCAST_HAS_MPI4PY) && defined(MESHCAST_HAS_MPI)
  if (import_mpi4py() < 0) throw py::error_already_set();
  auto mpi = py::module_::import("mpi4py.MPI");
  if (!py::isinstance(comm, mpi.attr("Comm")))
    throw py::type_error("comm: expected an mpi4py.MPI.Comm, got " +
                         py::str(py::type::handle_of(comm).attr("__name__")).cast<std::string>());
  if (comm.attr("Is_inter")().cast<bool>())
    throw py::value_error("comm: an intercommunicator; pass an intracommunicator");
  MPI_Comm* handle = PyMPIComm_Get(comm.ptr());
  if (!handle) throw py::error_already_set();
  if (*handle == MPI_COMM_NULL) throw py::value_error("comm: MPI.COMM_NULL");
  register_close_at_exit();
  auto s = std::make_shared<Session>();
  std::shared_ptr<MpiSession> session;
  {
    py::gil_scoped_release release;  // collective: the other ranks may take a while
    session = MpiSession::attach(handle, mpi_options(timeout));
  }
  s->comm = &session->world();
  s->transport = session;
  return open(std::move(s));
#else
  (void)comm;
  throw py::type_error(
      "comm: this build of meshcast has no mpi4py support (built without MPI or without "
      "mpi4py's headers)");
#endif
}

Comm from_env(const std::string& backend, double timeout) {
  check_timeout(timeout);
  auto s = std::make_shared<Session>();
  if (backend == "ucx") {
#ifdef MESHCAST_HAS_UCX
    py::gil_scoped_release release;
    s->bootstrap = TcpBootstrap::from_env();
    if (!s->bootstrap)
      throw ValidationError("MESHCAST_RENDEZVOUS",
                            "no launcher variables are set (torchrun's RANK, WORLD_SIZE, "
                            "MASTER_ADDR, MASTER_PORT; Slurm's SLURM_PROCID, SLURM_NTASKS; Open "
                            "MPI's OMPI_COMM_WORLD_*; or MESHCAST_RENDEZVOUS, MESHCAST_RANK, "
                            "MESHCAST_SIZE)");
    UcxOptions o;
    o.timeout_seconds = timeout;
    auto session = std::make_shared<UcxSession>(*s->bootstrap, o);
    s->comm = &session->world();
    s->transport = session;
#else
    throw py::value_error("backend: this build of meshcast has no UCX backend");
#endif
  } else if (backend == "mpi") {
#ifdef MESHCAST_HAS_MPI
    register_close_at_exit();
    py::gil_scoped_release release;
    auto session = std::make_shared<MpiSession>(nullptr, nullptr, mpi_options(timeout));
    s->comm = &session->world();
    s->transport = session;
#else
    throw py::value_error("backend: this build of meshcast has no MPI backend");
#endif
  } else {
    throw py::value_error("backend: expected 'ucx' or 'mpi', got '" + backend + "'");
  }
  return open(std::move(s));
}

// LocalWorld.run: fn(comm) on one thread per device, each taking the GIL to run Python and
// releasing it while data moves. Results in rank order; the failing device's exception is
// re-raised (the others' are the CommErrors it caused).
py::list run_local(LocalWorld& world, const py::function& fn, const std::vector<int>& devices) {
  const int n = world.size();
  std::vector<py::object> results(static_cast<std::size_t>(n));
  {
    py::gil_scoped_release release;
    world.run(
        [&](Communicator& c) {
          py::gil_scoped_acquire gil;
          auto alive = std::make_shared<std::atomic<bool>>(true);
          try {
            results[static_cast<std::size_t>(c.rank())] = fn(Comm(&c, nullptr, alive));
          } catch (py::error_already_set& e) {
            alive->store(false);
            (void)e.what();  // formats the message while this thread holds the GIL
            throw;
          }
          alive->store(false);
        },
        devices);
  }
  py::list out;
  if (devices.empty()) {
    for (auto& r : results) out.append(r ? r : py::none());
  } else {
    for (int d : devices) {
      auto& r = results[static_cast<std::size_t>(d)];
      out.append(r ? r : py::none());
    }
  }
  return out;
}

}  // namespace

bool Comm::alive() const { return alive_ && alive_->load(); }

Communicator& Comm::get() const {
  if (!alive())
    throw py::value_error(
        "comm: its session has ended (a LocalWorld communicator is valid only inside run(), an "
        "MPI one until the interpreter exits)");
  return *comm_;
}

PyGroup group_arg(py::handle obj, const std::string& arg) {
  if (py::isinstance<PyGroup>(obj)) return obj.cast<PyGroup>();
  if (py::isinstance<Comm>(obj)) {
    const Comm& c = obj.cast<const Comm&>();
    return PyGroup{c.get().world(), c};
  }
  throw py::type_error(arg + ": expected a meshcast Comm or Group, got " +
                       py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
}

void bind_comm(py::module_& m) {
  py::class_<Comm>(m, "Comm", R"doc(
One device's endpoint of a job: from LocalWorld.run (threads), from_mpi4py (mpirun) or
from_env (torchrun, Slurm, Open MPI launchers; UCX). Device ids are ranks 0..size-1.
)doc")
      .def_property_readonly("rank", &Comm::rank, "This device's id (0 .. size-1).")
      .def_property_readonly("size", &Comm::size, "Devices in the job.")
      .def_property_readonly(
          "backend", [](const Comm& c) { return c.get().backend(); },
          "The transport: 'local', 'mpi' or 'ucx'.")
      .def(
          "barrier",
          [](const Comm& c) {
            Communicator& comm = c.get();
            py::gil_scoped_release release;
            comm.barrier();
          },
          "Returns once every device of the job called it.")
      .def(
          "group",
          [](const Comm& c, std::vector<int> devices) {
            return PyGroup{c.get().group(std::move(devices)), c};
          },
          py::arg("devices"), R"doc(
A group of `devices` (their order gives their ranks in it) with its own message tags. Every
device of the job creates its groups in the same order, members or not (as MPI_Comm_create).
)doc")
      .def("__repr__", [](const Comm& c) {
        if (!c.alive()) return std::string("<meshcast.Comm (session ended)>");
        return "<meshcast.Comm rank " + std::to_string(c.rank()) + " of " +
               std::to_string(c.size()) + ", " + c.get().backend() + ">";
      });

  py::class_<PyGroup>(m, "Group", "Devices of a Comm, in an order that defines their ranks.")
      .def_property_readonly("devices", [](const PyGroup& g) { return g.group.devices(); })
      .def_property_readonly("size", [](const PyGroup& g) { return g.group.size(); })
      .def_property_readonly(
          "rank", [](const PyGroup& g) { return g.group.index_of(g.comm.rank()); },
          "This device's rank in the group, -1 when it is not a member.")
      .def("__repr__", [](const PyGroup& g) {
        std::string s;
        for (int d : g.group.devices()) s += (s.empty() ? "" : ", ") + std::to_string(d);
        return "<meshcast.Group [" + s + "]>";
      });

  py::class_<LocalWorld>(m, "LocalWorld", R"doc(
A world of `size` devices in this process, one thread each (for notebooks and tests).
A wait that sees no progress for `timeout` seconds fails with CommError.
)doc")
      .def(py::init([](int size, double timeout) {
             if (size < 1) throw py::value_error("size: a world needs at least one device");
             check_timeout(timeout);
             return std::make_unique<LocalWorld>(size, 0, timeout);
           }),
           py::arg("size"), py::arg("timeout") = 60.0)
      .def_property_readonly("size", &LocalWorld::size)
      .def("run", &run_local, py::arg("fn"), py::arg("devices") = std::vector<int>{}, R"doc(
Calls fn(comm) on one thread per device (of `devices`, all by default) and returns their
results in rank order. If one raises, the others' waits fail with CommError naming it, and
its exception is re-raised here. The comm is valid only inside fn.
)doc");

  m.def("from_mpi4py", &from_mpi4py, py::arg("comm"), py::arg("timeout") = 60.0, R"doc(
A meshcast Comm over an mpi4py communicator (e.g. MPI.COMM_WORLD), for jobs under mpirun.
Collective. meshcast works on a duplicate: its messages never meet yours. Device id d is
rank d of `comm`. MPI must allow concurrent calls from one thread at a time at least.
)doc");
  m.def("from_env", &from_env, py::arg("backend") = "ucx", py::arg("timeout") = 60.0, R"doc(
A Comm from the variables the launcher set. backend='ucx' (default): a TCP rendezvous, then UCX;
ranks from torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Slurm
(SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), Open MPI (OMPI_COMM_WORLD_*), with MESHCAST_*
as the explicit override. backend='mpi': MPI_Init under mpirun. Collective; a missing or
malformed variable raises ValueError naming it.
)doc");
}

}  // namespace meshcast::python
