"""Python reshard vs the C++ reshard on the same plan, buffers and communicator, in one run.

Each size runs `reps` rounds; a round times `iters` calls of meshcast.reshard (Python: argument
checks, DLPack / buffer views, GIL release) and `iters` reshards in one C++ loop
(meshcast._meshcast._reshard_loop: the same C++ calls, arguments checked once), alternating
which goes first. The time of a loop is the slowest device's. Rows print like nccl-tests: the
medians of the rounds' times, and the median of the rounds' ratios python / c++ (each round's
two loops ran back to back, so a slow spell of the machine touches both).

    PYTHONPATH=build/default/python python3 bench/python_reshard.py local [--json FILE]
    mpirun -np 4 ... python3 bench/python_reshard.py mpi [--json FILE]
"""
import argparse
import json
import statistics
import time

import numpy as np

import meshcast as mc

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]


def layouts(nbytes, devices):
    cols = 256 if nbytes >= 256 * 4 * devices else 16
    shape = (nbytes // 4 // cols, cols)
    mesh = f"{devices}@0-{devices - 1}"
    return (mc.Layout(shape, "f32", mesh + ":S0R"), mc.Layout(shape, "f32", mesh + ":RS0"))


def bench(comm, barrier, share, reps, budget):
    """Rows of (size, python seconds, c++ seconds, #wrong) for this device; `share(x)` gives
    every device device 0's x, `barrier()` waits for all."""
    me = comm.rank
    rows = []
    for nbytes in SIZES:
        src, dst = layouts(nbytes, comm.size)
        p = mc.plan(src, dst)
        full = np.arange(np.prod(src.shape), dtype=np.float32).reshape(src.shape)
        a = np.ascontiguousarray(full[src.local_box(me)])
        b = np.zeros(dst.local_shape(me), np.float32)
        barrier()
        mc._meshcast._reshard_loop(p, comm, a, b, 3)  # warm-up
        barrier()
        once = mc._meshcast._reshard_loop(p, comm, a, b, 20)  # calibration
        iters = share(int(min(20000, max(5, budget / max(once, 1e-7)))))
        py, cc = [], []
        for rep in range(reps):
            for which in ((0, 1) if rep % 2 == 0 else (1, 0)):
                barrier()
                if which == 0:
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        mc.reshard(p, comm, a, b)
                    py.append((time.perf_counter() - t0) / iters)
                else:
                    cc.append(mc._meshcast._reshard_loop(p, comm, a, b, iters))
        wrong = int((b != full[dst.local_box(me)]).sum())
        rows.append((nbytes, iters, py, cc, wrong))
    return rows


def report(mode, per_device, out):
    devices = len(per_device)
    print(f"# meshcast Python reshard vs C++ reshard, {mode}, {devices} devices, "
          f"{devices}:S0R -> {devices}:RS0 f32")
    print(f"#{'size':>10} {'iters':>6} {'python(us)':>11} {'c++(us)':>9} {'ratio':>6} "
          f"{'algbw(GB/s)':>11} {'#wrong':>6}")
    rows = []
    for i, nbytes in enumerate(SIZES):
        iters = per_device[0][i][1]
        # A round lasts as long as its slowest device.
        py = [max(d[i][2][r] for d in per_device) for r in range(len(per_device[0][i][2]))]
        cc = [max(d[i][3][r] for d in per_device) for r in range(len(per_device[0][i][3]))]
        wrong = sum(d[i][4] for d in per_device)
        mp, mcc = statistics.median(py), statistics.median(cc)
        ratio = statistics.median(a / b for a, b in zip(py, cc))
        print(f" {nbytes:>10} {iters:>6} {mp * 1e6:>11.2f} {mcc * 1e6:>9.2f} {ratio:>6.3f} "
              f"{nbytes / mp / 1e9:>11.3f} {wrong:>6}")
        rows.append({"bytes": nbytes, "iters": iters, "python_seconds": mp, "cpp_seconds": mcc,
                     "ratio": ratio, "python_rounds": py, "cpp_rounds": cc, "wrong": wrong})
    if out:
        with open(out, "w") as f:
            json.dump({"mode": mode, "devices": devices, "rows": rows}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["local", "mpi"])
    ap.add_argument("--devices", type=int, default=2, help="local: threads (mpi: the job's ranks)")
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--budget", type=float, default=0.02, help="seconds per timed loop")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    if args.mode == "local":
        world = mc.LocalWorld(args.devices)
        shared = {}

        def run(comm):
            def share(x):
                comm.barrier()
                if comm.rank == 0:
                    shared["x"] = x
                comm.barrier()
                return shared["x"]

            return bench(comm, comm.barrier, share, args.reps, args.budget)

        report("in-process (LocalWorld threads)", world.run(run), args.json)
    else:
        from mpi4py import MPI

        w = MPI.COMM_WORLD
        comm = mc.from_mpi4py(w)
        rows = bench(comm, comm.barrier, lambda x: w.bcast(x, root=0), args.reps, args.budget)
        every = w.gather(rows, root=0)
        if comm.rank == 0:
            report("MPI (mpi4py, one process per device)", every, args.json)


if __name__ == "__main__":
    main()
