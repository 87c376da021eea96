"""One rank of the MPI / launcher tests: random reshards and collectives, every element checked.

Usage: mpi_worker.py mpi4py|env-ucx|env-mpi CASES SEED [fail|leave|refuse|short|long]. Prints "rank R ok N" on
success; any mismatch raises (the rank exits non-zero). WORKER_TIMEOUT: the comm's timeout (s).
WORKER_READY: a file made just before the comm; WORKER_AFTER: one waited for (60 s at most) before
it, so that a rank of a short timeout starts its rendezvous once its peer is already connecting.
"""
import os
import sys
import time

import numpy as np

import meshcast as mc
from conftest import NUMPY_DTYPES, addend_sum, expected_tile, random_pair, tiles, values

how, cases, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if how == "mpi4py":
    from mpi4py import MPI

    comm = mc.from_mpi4py(MPI.COMM_WORLD)
    assert comm.rank == MPI.COMM_WORLD.Get_rank() and comm.size == MPI.COMM_WORLD.Get_size()
else:
    if "WORKER_AFTER" in os.environ:
        end = time.monotonic() + 60
        while not os.path.exists(os.environ["WORKER_AFTER"]) and time.monotonic() < end:
            time.sleep(0.05)
    if "WORKER_READY" in os.environ:
        open(os.environ["WORKER_READY"], "w").close()
    comm = mc.from_env(backend=how.split("-")[1],
                       timeout=float(os.environ.get("WORKER_TIMEOUT", "60")))
me, n = comm.rank, comm.size
rng = np.random.default_rng(seed)  # the same cases on every rank
names = sorted(NUMPY_DTYPES)
for i in range(cases):
    name = names[i % len(names)]
    dt = NUMPY_DTYPES[name]
    src, dst = random_pair(rng, name, world=n)
    addends = [values(rng, src.shape, dt) for _ in range(src.addends)]
    full = addend_sum(addends, dt)
    p = mc.plan_rank(src, dst, me) if i % 2 else mc.plan(src, dst)
    if how == "mpi4py" and i % 4 == 0:  # planned once, sent to every rank (pickled)
        p = MPI.COMM_WORLD.bcast(p if me == 0 else None, root=0)
    a = tiles(src, full, addends).get(me)
    b = np.zeros(dst.local_shape(me), dt) if me in dst.mesh else None
    if i % 3 == 2:
        mc.ireshard(p, comm, a, b).wait()
    else:
        mc.reshard(p, comm, a, b)
    if b is not None:
        np.testing.assert_array_equal(b, expected_tile(dst, full, me), err_msg=f"case {i}")

x = np.full(1000, me + 1, np.int64)
mc.all_reduce(comm, x)
assert (x == n * (n + 1) // 2).all()
g = np.empty(n * 3, np.float32)
mc.all_gather(comm, np.full(3, me, np.float32), g)
assert (g == np.repeat(np.arange(n), 3)).all()
comm.barrier()
print(f"rank {me} ok {cases}", flush=True)

if len(sys.argv) > 4 and sys.argv[4] in ("short", "long"):
    # Rank 1 expects one element more (short) or fewer (long) than rank 0 broadcasts (the
    # transports' path: async_op): MPI and UCX take a shorter message into a larger receive
    # silently and fail a longer one as truncated; both are refused by their length. The root,
    # which receives nothing, returns.
    y = np.ones(1000 + (me if sys.argv[4] == "short" else -me), np.float32)
    try:
        mc.broadcast(comm, y, 0, async_op=True).wait()
        print(f"rank {me} returned", flush=True)
    except mc.CommError as e:
        print(f"rank {me} failed: {e}", flush=True)
    sys.exit(0)

if how == "mpi4py":
    # A handle keeps its communicator: the temporary Comm below is gone before the wait.
    x = np.full(8, me + 1, np.int64)
    h = mc.all_reduce(mc.from_mpi4py(MPI.COMM_WORLD), x, async_op=True)
    h.wait()
    assert (x == n * (n + 1) // 2).all()
    try:
        mc.from_mpi4py(MPI.COMM_NULL)
        raise AssertionError("from_mpi4py took MPI.COMM_NULL")
    except ValueError as e:
        assert str(e) == "comm: MPI.COMM_NULL", e
    if len(sys.argv) > 4 and sys.argv[4] == "fail":
        # One rank fails before a collective: the other's wait fails, nobody hangs at exit.
        quick = mc.from_mpi4py(MPI.COMM_WORLD, timeout=3)
        if me == 1:
            raise ValueError("rank 1 gives up")
        mc.all_reduce(quick, x)

if len(sys.argv) > 4 and sys.argv[4] == "leave":
    # Rank 1 ends without the barrier the others enter: they fail naming it, none passes it.
    if me == 1:
        sys.exit(0)
    try:
        comm.barrier()
    except mc.CommError as e:
        print(f"rank {me} barrier failed: {e}", flush=True)
        sys.exit(3)
    print(f"rank {me} passed the barrier without rank 1", flush=True)

if len(sys.argv) > 4 and sys.argv[4] == "refuse":
    # Rank 1's reshard is refused before it starts (a destination of the wrong shape): that gives
    # its communicator up, so rank 0 fails at once naming rank 1's refusal (its messages to rank
    # 1 must not fill rank 1's next call), and rank 1's barrier fails naming it too.
    p = mc.plan(mc.Layout((4,), "f32", f"{n}:S0"), mc.Layout((4,), "f32", f"{n}:R"))
    try:
        try:
            mc.reshard(p, comm, np.ones(p.src.local_shape(me), np.float32),
                       np.zeros(3 if me == 1 else 4, np.float32))
        except ValueError as e:
            print(f"rank {me} refused: {e}", flush=True)
        comm.barrier()
    except mc.CommError as e:
        print(f"rank {me} failed: {e}", flush=True)
        sys.exit(3)

if len(sys.argv) > 4 and sys.argv[4] == "disagree":  # (mpi4py)
    # Rank 1 runs another plan than rank 0 with messages of the same sizes: i32 for f32 (the
    # same tags), then source and target swapped (other tags). Each fails naming what differs
    # (or the other's failure), at once, not after the timeout (WORKER_TIMEOUT is long).
    f32 = (mc.Layout((8, 8), "f32", "2:S0R"), mc.Layout((8, 8), "f32", "2:RS0"))
    cases = {"dtype": [f32, (mc.Layout((8, 8), "i32", "2:S0R"), mc.Layout((8, 8), "i32", "2:RS0"))],
             "swapped": [f32, f32[::-1]]}
    for name, pairs in cases.items():
        src, dst = pairs[me]
        dt = {"f32": np.float32, "i32": np.int32}[src.dtype]
        try:  # a communicator of its own: a failed reshard leaves its communicator failed
            mc.reshard(mc.plan(src, dst), mc.from_mpi4py(MPI.COMM_WORLD),
                       np.zeros(src.local_shape(me), dt), np.zeros(dst.local_shape(me), dt))
            print(f"rank {me} {name} returned", flush=True)
        except (ValueError, mc.CommError) as e:
            print(f"rank {me} {name} failed: {type(e).__name__}: {e}", flush=True)
    sys.exit(0)
