// Communicators and groups as Python sees them: a handle on a C++ Communicator that knows
// whether its session (a LocalWorld thread, an MPI or UCX session) is still there, and ends the
// operations still in flight on it before the communicator goes.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "meshcast/collectives.h"
#include "meshcast/communicator.h"
#include "meshcast/error.h"
#include "meshcast/reshard.h"
#include "python/src/bound.h"

namespace meshcast::python {

namespace py = pybind11;

// A signal whose Python handler raised (Ctrl-C: KeyboardInterrupt) while a call of Python's main
// thread on a process communicator blocked with the GIL released: check() runs the handlers
// (Communicator::set_interrupt's check, every 50 ms of a wait), keeps the exception and throws
// Interrupted through the C++ call, which gives up its operation (the peers end at once,
// naming this device: a CommError that says so); the module's exception translator raises the
// kept exception as the call returns to Python. An operation that failed so rethrows it later as
// that CommError.
class Interrupted : public CommError {
 public:
  explicit Interrupted(int device)
      : CommError(device, "interrupted by a signal (its Python handler raised)") {}
  static void init();             // at import: which thread is Python's main one
  static void check(int device);  // with or without the GIL
  // With the GIL: the kept exception as Python's error, or else a CommError of what().
  void raise(PyObject* comm_error) const;
  // No check for the scope on this thread (a drop, a session's end): what it threw would be
  // swallowed there, and the signal with it; the signal stays pending for Python instead.
  class Quiet {
   public:
    Quiet();
    ~Quiet();
    Quiet(const Quiet&) = delete;
    Quiet& operator=(const Quiet&) = delete;
  };
};

// An operation a Python Handle holds: a transfer (reshard, sync) or a collective in flight.
struct Pending {
  std::optional<Transfer> transfer;
  std::optional<Collective> collective;
  bool abandoned = false;  // left unfinished when its communicator ended: never done
  // Its wait() returned, or its test() said True: the same on every device (its completion
  // alone is not: one device's may come before another's asks), so the in-flight check
  // (Life::check_free) counts it until then.
  bool observed = false;
  bool done() const;
};

// Memory an operation uses: [begin, end), written or only read, and the argument it came in.
struct MemorySpan {
  const char* begin;
  const char* end;
  bool writes;
  std::string arg;
};

// A communicator's life: whether it still exists, and the operations started on it. The session
// calls end() before the communicator goes (a LocalWorld thread's fn returned, the interpreter
// exits), so that no operation outlives the communicator it points at.
class Life {
 public:
  bool alive() const { return alive_.load(); }
  // Why the transport can take no call any more (MPI was finalized: MPI would end the job), or
  // null. Every call is then refused (ValueError), and an operation in flight is let go of
  // without a call: its memory is left to the process's end.
  void set_unusable(const char* (*why)()) { unusable_ = why; }
  const char* unusable() const { return unusable_ ? unusable_() : nullptr; }
  // Leaves `p`'s operation to the process's end, untouched (unusable()).
  static void let_go(Pending& p);
  // `spans`: the memory the operation uses until it completed.
  void track(const std::shared_ptr<Pending>& p, std::vector<MemorySpan> spans);
  // Throws ValueError naming the argument when `spans` (an operation about to start) writes
  // memory an operation in flight uses, or uses memory one writes: their order would differ
  // between devices (a blocking call completes first on some), and so would the results.
  void check_free(const std::vector<MemorySpan>& spans);
  // A call on the communicator, which serves one thread: throws ValueError while another
  // thread's call is in flight (two threads' barriers would count as two devices') or once the
  // session is ending; waits (the GIL released) while another thread drops a handle. With the
  // GIL held. leave() first drops the handles adopted meanwhile.
  void enter();
  void leave();
  // Dropping a handle uses the communicator, so `drop` waits for its turn: while another
  // thread's call is in flight (or the session ends) that call makes it as it leaves (end()
  // lets it go: it ends every operation itself), and this returns true. Otherwise the
  // communicator is the caller's, to drop now and then leave(). With the GIL held; `drop`
  // runs no Python, and what it holds goes only once the communicator is free again (a
  // session's last reference ends it, and end() waits for that).
  bool adopt_if_busy(std::function<void()> drop);
  // New calls are refused, a call still in flight on another thread is waited for (the GIL
  // released: it ends by completing or failing, within the transport's timeout), unfinished
  // operations are abandoned (their peers fail with an error naming this device), every
  // operation is destroyed while `comm` exists, and the communicator is marked gone. Called
  // with the GIL held.
  void end(Communicator& comm);

 private:
  std::atomic<bool> alive_{true};
  std::mutex mutex_;
  struct Tracked {
    std::weak_ptr<Pending> op;
    std::vector<MemorySpan> spans;
  };
  std::vector<Tracked> pending_;
  std::mutex call_mutex_;
  std::condition_variable call_done_;
  bool busy_ = false, closing_ = false;
  bool dropping_ = false;                       // busy_ with a drop, not a call
  std::vector<std::function<void()>> orphans_;  // adopted drops, for the holder to make
  const char* (*unusable_)() = nullptr;
};

class Comm {
 public:
  Comm(Communicator* comm, std::shared_ptr<void> session, std::shared_ptr<Life> life)
      : comm_(comm), session_(std::move(session)), life_(std::move(life)) {}
  // Throws ValueError("comm: ...") once the session ended (a LocalWorld run returned).
  Communicator& get() const;
  bool alive() const { return life_ && life_->alive(); }
  Life& life() const { return *life_; }
  int rank() const { return get().rank(); }
  int size() const { return get().size(); }

 private:
  Communicator* comm_;
  std::shared_ptr<void> session_;  // keeps an MPI / UCX session alive while a handle exists
  std::shared_ptr<Life> life_;
};

// One call on a communicator for the scope (Life::enter, leave); taken with the GIL held, before
// releasing it.
class Busy {
 public:
  explicit Busy(const Comm& c) : life_(c.life()) {
    c.get();
    life_.enter();
  }
  // A call that starts an operation on `uses`: refused (Life::check_free) once this thread is
  // the communicator's, so that no other call changes the operations in flight meanwhile.
  Busy(const Comm& c, const std::vector<MemorySpan>& uses) : Busy(c) {
    try {
      life_.check_free(uses);
    } catch (...) {
      life_.leave();
      throw;
    }
  }
  ~Busy() { life_.leave(); }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  Life& life_;
};

struct PyGroup {
  Group group;
  Comm comm;
};

// A Comm (its world) or a Group, for the first argument of every collective and transfer.
PyGroup group_arg(py::handle obj, const char* arg = "comm");

// Gives up the communicator of `comm` (a Comm or Group) after a call on it was refused (a wrong
// array, another device's plan, memory of an operation in flight, a second thread's call), as
// C++'s reshard and sync refusals do. Another device may have made the same call unrefused
// (its array None, its plan another): its messages of that call go out regardless and, kept,
// would fill this device's next call (stale or torn tensors, reported as ok), so the peers fail
// naming this device at once instead. While another thread's call holds the communicator, that
// call gives it up as it returns (Life::adopt_if_busy). Nothing when `comm` is no communicator
// or its session ended, for a failure once started (given up already), or for a refusal every
// member raised alike (Error::agreed(): none waits, and the communicator stays usable).
void abandon_refused(py::handle comm, const std::exception& e);

// `f`, a call on the communicator given as its argument I, whose refusal gives that up
// (abandon_refused).
template <std::size_t I, class R, class... A>
auto refusal_gives_up(R (*f)(A...)) {
  return [f](A... a) -> R {
    try {
      return f(a...);
    } catch (const std::exception& e) {
      abandon_refused(std::get<I>(std::forward_as_tuple(a...)), e);
      throw;
    }
  };
}

void bind_comm(py::module_& m);

}  // namespace meshcast::python

MESHCAST_PY_INITIALIZED(meshcast::python::Comm);
MESHCAST_PY_INITIALIZED(meshcast::python::PyGroup);
