#include "python/src/comm.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "lib/support/text.h"
#include "meshcast/bootstrap.h"
#include "meshcast/local.h"
#include "python/src/instance.h"
#include "python/src/ints.h"
#ifdef MESHCAST_HAS_MPI
#include <mpi.h>

#include "meshcast/mpi.h"
#endif
#ifdef MESHCAST_HAS_UCX
#include "meshcast/ucx.h"
#endif
#ifdef MESHCAST_HAS_MPI4PY
#include <mpi4py/mpi4py.h>
#endif

namespace meshcast::python {

namespace {
#ifdef MESHCAST_HAS_MPI
// MPI refuses every call after MPI_Finalize by ending the job: asked before one is made.
const char* mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);  // (callable at any time)
  return finalized ? "comm: MPI was finalized (MPI.Finalize()): no MPI call can follow it; "
                     "finalize after the last meshcast call, or leave it to mpi4py at exit"
                   : nullptr;
}
#endif

// The exception a signal handler raised (type, value, traceback), until raised again. Guarded by
// the GIL; signals reach only the main thread's checks.
PyObject* kept_signal[3] = {nullptr, nullptr, nullptr};
thread_local int quiet = 0;
unsigned long main_thread = 0;  // Python's (threading.main_thread().ident)
}  // namespace

void Interrupted::init() {
  main_thread =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
}

void Interrupted::check(int device) {
  // Python runs signal handlers on its main thread only: another thread's wait has nothing to
  // check, and does not take the GIL (nor a Ctrl-C that is the main thread's).
  if (quiet > 0 || PyThread_get_thread_ident() != main_thread) return;
  py::gil_scoped_acquire gil;
  if (!kept_signal[0]) {
    if (PyErr_CheckSignals() == 0) return;
    PyErr_Fetch(&kept_signal[0], &kept_signal[1], &kept_signal[2]);
  }
  throw Interrupted(device);
}

void Interrupted::raise(PyObject* comm_error) const {
  if (!kept_signal[0]) {
    PyErr_SetString(comm_error, what());
    return;
  }
  PyErr_Restore(kept_signal[0], kept_signal[1], kept_signal[2]);
  kept_signal[0] = kept_signal[1] = kept_signal[2] = nullptr;
}

Interrupted::Quiet::Quiet() { ++quiet; }
Interrupted::Quiet::~Quiet() { --quiet; }

namespace {

// A process session (MPI or UCX over a bootstrap) that Python closes at exit before the host
// program tears MPI down: handles stay valid objects, their use then raises.
struct Session {
  std::unique_ptr<Bootstrap> bootstrap;  // TCP rendezvous of a UCX session
  std::shared_ptr<void> transport;       // the MpiSession / UcxSession
#ifdef MESHCAST_HAS_MPI
  MpiSession* mpi = nullptr;  // the transport, when it is MPI
  bool attached = false;      // over the caller's communicator (from_mpi4py)
#endif
  Communicator* comm = nullptr;
  std::shared_ptr<Life> life = std::make_shared<Life>();
  ~Session() { close(false); }
  // `dying`: the interpreter ends on an uncaught exception.
  void close(bool dying) {
    if (!transport) return;
    if (life->alive()) life->end(*comm);
    comm->set_interrupt(nullptr);  // (no call of another thread is left: end() waited for it)
#ifdef MESHCAST_HAS_MPI
    // Freeing an MPI window or communicator is collective: one rank alone (its Comm collected,
    // or this process dying of an error) would wait forever on the others. An attached session
    // leaves them to the host program's MPI_Finalize; a dying process skips finalizing (mpirun
    // then ends the job instead of hanging in it).
    if (mpi && (attached || dying)) mpi->on_failure();
#endif
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
  c->set_interrupt([device = c->rank()] { Interrupted::check(device); });
  auto life = s->life;
  return Comm(c, std::move(s), std::move(life));
}

// At interpreter exit (atexit), before MPI is finalized (mpi4py does it after every atexit
// handler) and before module teardown would destroy sessions in arbitrary order.
void close_sessions() {
  const bool dying = py::hasattr(py::module_::import("sys"), "last_value");
  std::lock_guard lock(sessions_mutex);
  for (auto& w : sessions)
    if (auto s = w.lock()) s->close(dying);
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

double timeout_arg(py::handle obj) {
  const double timeout = float_arg(obj, "timeout");
  if (!(timeout > 0 && timeout <= 1e6))
    throw py::value_error("timeout: must be in (0, 1e6] seconds, got " + std::to_string(timeout));
  return timeout;
}

Comm from_mpi4py(py::object comm, py::handle timeout_obj) {
  const double timeout = timeout_arg(timeout_obj);
#if defined(MESHCAST_HAS_MPI4PY) && defined(MESHCAST_HAS_MPI)
  if (import_mpi4py() < 0) throw py::error_already_set();
  auto mpi = py::module_::import("mpi4py.MPI");
  if (!py::isinstance(comm, mpi.attr("Comm")))
    throw py::type_error("comm: expected an mpi4py.MPI.Comm, got " + type_name(comm));
  MPI_Comm* handle = PyMPIComm_Get(comm.ptr());
  if (!handle) throw py::error_already_set();
  // Before asking it anything: MPI refuses every question to MPI_COMM_NULL.
  if (*handle == MPI_COMM_NULL) throw py::value_error("comm: MPI.COMM_NULL");
  if (const char* why = mpi_finalized()) throw py::value_error(why);
  if (comm.attr("Is_inter")().cast<bool>())
    throw py::value_error("comm: an intercommunicator; pass an intracommunicator");
  register_close_at_exit();
  auto s = std::make_shared<Session>();
  std::shared_ptr<MpiSession> session;
  {
    py::gil_scoped_release release;  // collective: the other ranks may take a while
    session = MpiSession::attach(handle, mpi_options(timeout));
  }
  s->comm = &session->world();
  s->mpi = session.get();
  s->life->set_unusable(&mpi_finalized);
  s->attached = true;
  s->transport = session;
  return open(std::move(s));
#else
  (void)comm;
  throw py::type_error(
      "comm: this build of meshcast has no mpi4py support (built without MPI or without "
      "mpi4py's headers)");
#endif
}

Comm from_env(py::handle backend_obj, py::handle timeout_obj) {
  const std::string backend = str_arg(backend_obj, "backend");
  const double timeout = timeout_arg(timeout_obj);
  auto s = std::make_shared<Session>();
  if (backend == "ucx") {
#ifdef MESHCAST_HAS_UCX
    register_close_at_exit();
    py::gil_scoped_release release;
    std::optional<LaunchEnv> env = LaunchEnv::detect();
    if (!env)
      throw ValidationError("MESHCAST_RENDEZVOUS",
                            "no launcher variables are set (torchrun's RANK, WORLD_SIZE, "
                            "MASTER_ADDR, MASTER_PORT; Slurm's SLURM_PROCID, SLURM_NTASKS; Open "
                            "MPI's OMPI_COMM_WORLD_*; or MESHCAST_RENDEZVOUS, MESHCAST_RANK, "
                            "MESHCAST_SIZE)");
    if (!env->has_rendezvous())  // mpirun: MPI would bootstrap, UCX needs a rendezvous
      throw ValidationError("MASTER_ADDR", "not set: " + env->str() +
                                               ", and the ucx backend needs a rendezvous (set "
                                               "MASTER_ADDR and MASTER_PORT, or "
                                               "MESHCAST_RENDEZVOUS), or use from_env('mpi')");
    // The rendezvous waits as long as the other waits, unless the environment says otherwise.
    if (!std::getenv("MESHCAST_RENDEZVOUS_TIMEOUT")) env->timeout_seconds = timeout;
    s->bootstrap = TcpBootstrap::from_launch(*env);
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
    // One session per process: it initialised MPI and finalizes it at exit, not when a Comm is
    // collected (MPI cannot start again after that).
    static std::shared_ptr<Session> world;
    if (world && world->transport) return Comm(world->comm, world, world->life);
    register_close_at_exit();
    std::shared_ptr<MpiSession> session;
    {
      py::gil_scoped_release release;
      session = std::make_shared<MpiSession>(nullptr, nullptr, mpi_options(timeout));
    }
    s->comm = &session->world();
    s->mpi = session.get();
    s->life->set_unusable(&mpi_finalized);
    s->transport = session;
    world = s;
#else
    throw py::value_error("backend: this build of meshcast has no MPI backend");
#endif
  } else {
    throw py::value_error("backend: expected 'ucx' or 'mpi', got " + detail::quote(backend));
  }
  return open(std::move(s));
}

// LocalWorld.run: fn(comm) on one thread per device, each taking the GIL to run Python and
// releasing it while data moves. Results in rank order; the failing device's exception is
// re-raised (the others' are the CommErrors it caused).
py::list run_local(LocalWorld& world, py::handle fn, py::handle devices_obj) {
  if (!PyCallable_Check(fn.ptr()))
    throw py::type_error("fn: expected a callable, got " + type_name(fn));
  const std::vector<int> devices = int32s_arg(devices_obj, "devices");
  // LocalWorld::run replaces the world's state: a run inside one of its own fns would pull it
  // from under the running threads.
  static std::vector<const LocalWorld*> running;
  if (std::find(running.begin(), running.end(), &world) != running.end())
    throw py::value_error(
        "LocalWorld.run: this world is already running (run() inside its fn, or on another "
        "thread)");
  const int n = world.size();
  std::vector<py::object> results(static_cast<std::size_t>(n));
  running.push_back(&world);
  struct Done {
    const LocalWorld* w;
    ~Done() { running.erase(std::find(running.begin(), running.end(), w)); }
  } done{&world};
  // The devices run on a thread of their own while this one (Python's main thread, where
  // signal handlers run) looks for a Ctrl-C every 50 ms: it is raised in every device still
  // running Python, whose peers then fail naming it, and re-raised here once they all ended.
  // (A device inside a blocking call sees it when the call returns, within its timeout.)
  std::vector<unsigned long> in_fn(static_cast<std::size_t>(n), 0);  // thread ids, by the GIL
  std::exception_ptr failure;
  py::object interrupt, value, trace;  // what the signal handler raised
  {
    py::gil_scoped_release release;
    std::promise<void> ended;
    std::future<void> end = ended.get_future();
    std::thread runner([&] {
      try {
        world.run(
            [&](Communicator& c) {
              py::gil_scoped_acquire gil;
              auto life = std::make_shared<Life>();
              auto& me = in_fn[static_cast<std::size_t>(c.rank())];
              me = PyThread_get_thread_ident();
              try {
                results[static_cast<std::size_t>(c.rank())] = fn(Comm(&c, nullptr, life));
              } catch (py::error_already_set& e) {
                me = 0;
                life->end(c);
                (void)e.what();  // formats the message while this thread holds the GIL
                throw;
              } catch (...) {
                me = 0;
                life->end(c);
                throw;
              }
              me = 0;
              life->end(c);
            },
            devices);
      } catch (...) {
        failure = std::current_exception();
      }
      ended.set_value();
    });
    while (end.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      if (interrupt) continue;
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() == 0) continue;
      PyObject *type = nullptr, *v = nullptr, *tb = nullptr;
      PyErr_Fetch(&type, &v, &tb);
      interrupt = py::reinterpret_steal<py::object>(type);
      value = py::reinterpret_steal<py::object>(v);
      trace = py::reinterpret_steal<py::object>(tb);
      for (const unsigned long t : in_fn)
        if (t != 0) PyThreadState_SetAsyncExc(t, interrupt.ptr());
    }
    runner.join();
  }
  if (interrupt) {
    failure = nullptr;  // (with the GIL: it may hold a Python exception)
    PyErr_Restore(interrupt.release().ptr(), value.release().ptr(), trace.release().ptr());
    throw py::error_already_set();
  }
  if (failure) std::rethrow_exception(failure);
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

bool Pending::done() const {
  return !abandoned && (!transfer || transfer->done()) && (!collective || collective->done());
}

void Life::track(const std::shared_ptr<Pending>& p, std::vector<MemorySpan> spans) {
  std::lock_guard lock(mutex_);
  std::erase_if(pending_, [](const Tracked& t) { return t.op.expired(); });
  pending_.push_back({p, std::move(spans)});
}

void Life::check_free(const std::vector<MemorySpan>& spans) {
  std::lock_guard lock(mutex_);
  for (const Tracked& t : pending_) {
    const auto op = t.op.lock();
    // (Not yet started: the operation being checked is tracked already.)
    if (!op || op->observed || (!op->transfer && !op->collective)) continue;
    for (const MemorySpan& in_flight : t.spans)
      for (const MemorySpan& s : spans)
        if ((s.writes || in_flight.writes) && s.begin < in_flight.end && in_flight.begin < s.end)
          throw py::value_error(s.arg + ": " + (in_flight.writes ? "written" : "read") +
                                " by an operation in flight (its " + in_flight.arg +
                                "): wait() on its handle first");
  }
}

void Life::end(Communicator& comm) {
  const Interrupted::Quiet quiet;
  {
    // The lock without the GIL: a thread that enters a call waits for the lock holding it.
    py::gil_scoped_release release;
    std::unique_lock lock(call_mutex_);
    closing_ = true;
    call_done_.wait(lock, [&] { return !busy_; });
  }
  std::vector<std::shared_ptr<Pending>> live;
  {
    std::lock_guard lock(mutex_);
    for (auto& t : pending_)
      if (auto p = t.op.lock()) live.push_back(std::move(p));
    pending_.clear();
  }
  std::vector<std::function<void()>> orphans;  // let go once the session ended: see below
  {
    std::lock_guard lock(call_mutex_);
    orphans.swap(orphans_);
  }
  const bool unusable = this->unusable();
  bool abandoned = false;
  for (auto& p : live) {
    if (unusable) let_go(*p);
    if (p->done()) continue;
    p->abandoned = true;
    if (!abandoned) {  // the peers fail at once, naming this device, instead of waiting
      comm.abandon(CommError(comm.rank(),
                             "an operation in flight was left unfinished when its "
                             "communicator ended"));
      abandoned = true;
    }
    try {
      if (p->collective) p->collective->wait();  // throws at once after the abandon
    } catch (const std::exception&) {
    }
  }
  for (auto& p : live) {
    p->transfer.reset();
    p->collective.reset();
  }
  alive_.store(false);
  // Their operations ended above; with the session gone they only let go of their arrays. (One
  // adopted since is let go by its dropper: adopt_if_busy keeps none once the session ended.)
  orphans.clear();
  std::lock_guard lock(call_mutex_);
  orphans.swap(orphans_);
}

void Life::let_go(Pending& p) {
  if (p.transfer) (void)new Transfer(*std::exchange(p.transfer, std::nullopt));
  if (p.collective) (void)new Collective(*std::exchange(p.collective, std::nullopt));
}

void Life::enter() {
  if (const char* why = unusable()) throw py::value_error(why);
  for (;;) {
    std::unique_lock lock(call_mutex_);
    if (closing_)
      throw py::value_error(
          "comm: its session is ending (a LocalWorld communicator is valid only "
          "inside run())");
    if (!busy_) {
      busy_ = true;
      return;
    }
    if (!dropping_)
      throw py::value_error(
          "comm: in use by another thread (a communicator serves one call at a time)");
    lock.unlock();
    // A drop ends within the transport's timeout. The GIL is taken back without the lock.
    py::gil_scoped_release release;
    std::unique_lock wait(call_mutex_);
    call_done_.wait(wait, [&] { return !dropping_; });
  }
}

void Life::leave() {
  std::vector<std::function<void()>> made;  // let go below, the communicator free again
  for (;;) {
    std::vector<std::function<void()>> orphans;
    {
      std::lock_guard lock(call_mutex_);
      if (orphans_.empty()) {
        busy_ = dropping_ = false;
        break;
      }
      orphans.swap(orphans_);
    }
    for (auto& drop : orphans) drop();  // this thread holding the communicator still
    std::move(orphans.begin(), orphans.end(), std::back_inserter(made));
  }
  call_done_.notify_all();
}

bool Life::adopt_if_busy(std::function<void()> drop) {
  std::lock_guard lock(call_mutex_);
  if (closing_ || busy_) {
    if (alive_.load()) orphans_.push_back(std::move(drop));
    return true;
  }
  busy_ = dropping_ = true;
  return false;
}

Communicator& Comm::get() const {
  if (!alive())
    throw py::value_error(
        "comm: its session has ended (a LocalWorld communicator is valid only inside run(), an "
        "MPI one until the interpreter exits)");
  return *comm_;
}

PyGroup group_arg(py::handle obj, const char* arg) {
  if (const Comm* c = instance_of<Comm>(obj)) return PyGroup{c->get().world(), *c};
  if (const PyGroup* g = instance_of<PyGroup>(obj)) return *g;
  if (py::isinstance<PyGroup>(obj)) return obj.cast<PyGroup>();
  if (py::isinstance<Comm>(obj)) {
    const Comm& c = obj.cast<const Comm&>();
    return PyGroup{c.get().world(), c};
  }
  throw py::type_error(std::string(arg) + ": expected a meshcast Comm or Group, got " +
                       type_name(obj));
}

void abandon_refused(py::handle comm, const std::exception& e) {
  const auto* err = dynamic_cast<const Error*>(&e);
  if (err && err->kind() == ErrorKind::PeerFailure) return;  // started, and given up already
  if (err && err->agreed()) return;  // every member raises it: none is left waiting
  try {
    const PyGroup g = group_arg(comm);
    if (!g.comm.alive()) return;
    Communicator& c = g.comm.get();
    const CommError why(c.rank(), std::string("failed: ") + e.what());
    const auto give_up = [&c, why] { c.abandon(why); };
    if (g.comm.life().adopt_if_busy(give_up)) return;  // the holder's call gives it up
    struct Leave {
      Life& life;
      ~Leave() { life.leave(); }  // with the GIL, taken back first
    } leave{g.comm.life()};
    const py::gil_scoped_release release;  // an abort lingers up to a second on MPI and UCX
    give_up();
  } catch (...) {  // no communicator to give up
  }
}

void bind_comm(py::module_& m) {
  Interrupted::init();
  // The package's wrappers give up a communicator whose call pybind11 refused
  // (meshcast/__init__.py).
  m.def("_give_up", [](py::handle comm, const std::string& why) {
    abandon_refused(comm, std::runtime_error(why));
  });
  // Both classes first, so that signatures name them (Comm.group returns a Group).
  py::class_<Comm> comm(m, "Comm", R"doc(
One device's endpoint of a job: from LocalWorld.run (threads), from_mpi4py (mpirun) or
from_env (torchrun, Slurm, Open MPI launchers; UCX). Device ids are ranks 0..size-1.
)doc");
  py::class_<PyGroup> group(m, "Group", "Devices of a Comm, in an order that defines their ranks.");
  comm.def_property_readonly("rank", &Comm::rank, "This device's id (0 .. size-1).")
      .def_property_readonly("size", &Comm::size, "Devices in the job.")
      .def_property_readonly(
          "backend", [](const Comm& c) { return c.get().backend(); },
          "The transport: 'local', 'mpi' or 'ucx'.")
      .def(
          "barrier",
          [](const Comm& c) {
            const Busy call(c);
            py::gil_scoped_release release;
            c.get().barrier();
          },
          "Returns once every device of the job called it.")
      .def(
          "group",
          [](const Comm& c, py::handle devices) {
            std::vector<int> ids = int32s_arg(devices, "devices");
            const Busy call(c);
            return PyGroup{c.get().group(std::move(ids)), c};
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

  group.def_property_readonly("devices", [](const PyGroup& g) { return g.group.devices(); })
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
A wait that sees no progress of any device for `timeout` seconds fails with CommError.
)doc")
      .def(py::init([](py::object size, py::handle timeout_obj) {
             const auto n = int_arg(size, "size", std::numeric_limits<int>::min(),
                                    std::numeric_limits<int>::max());
             if (n < 1) throw py::value_error("size: a world needs at least one device");
             const double timeout = timeout_arg(timeout_obj);
             return std::make_unique<LocalWorld>(static_cast<int>(n), 0, timeout);
           }),
           py::arg("size"), py::arg("timeout") = 60.0)
      .def_property_readonly("size", &LocalWorld::size)
      .def("run", &run_local, py::arg("fn"), py::arg("devices") = py::list(), R"doc(
Calls fn(comm) on one thread per device (of `devices`, all by default) and returns their
results in rank order (in the order of `devices` when given). If one raises, the others' waits
fail with CommError naming it, and its exception is re-raised here. A wait on a device not in
`devices` fails at once (it never runs). The comm, and any Handle
started on it, is valid only inside fn: an operation still in flight when fn returns is
abandoned (its peers fail naming the device).
)doc");

  m.def("from_mpi4py", &from_mpi4py, py::arg("comm"), py::arg("timeout") = 60.0, R"doc(
A meshcast Comm over an mpi4py communicator (e.g. MPI.COMM_WORLD), for jobs under mpirun.
Collective: where not every rank calls it within `timeout` seconds, CommError. meshcast works on a duplicate: its messages never meet yours. Device id d is
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
