"""meshcast: cross-mesh resharding of sharded tensors, from Python.

Plan the move of a tensor from one sharded layout to another, then execute it on numpy arrays or
DLPack tensors (torch CPU tensors), zero-copy, over threads (LocalWorld), MPI (from_mpi4py) or
UCX started from the launcher's variables (from_env)::

    import numpy as np, meshcast as mc
    src = mc.Layout((8, 6), "f32", "2@0-1:S0R")
    dst = mc.Layout((8, 6), "f32", "3@0-2:RS0")
    p = mc.plan(src, dst)
    full = np.arange(48, dtype=np.float32).reshape(8, 6)

    def step(comm):
        me = comm.rank
        a = full[src.local_box(me)].copy() if src.local_box(me) else None
        b = np.empty(dst.local_shape(me), np.float32)
        mc.reshard(p, comm, a, b)
        return np.array_equal(b, full[dst.local_box(me)])

    assert all(mc.LocalWorld(3).run(step))

See docs/python.md for the guide.
"""

from ._meshcast import (  # noqa: F401  (the public API)
    CommError,
    Comm,
    Error,
    Group,
    Handle,
    IoError,
    Layout,
    LocalWorld,
    Mesh,
    ParseError,
    Plan,
    RankPlan,
    SyncPlan,
    Topology,
    ValidationError,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    from_env,
    from_mpi4py,
    ireshard,
    isync,
    load_model,
    plan,
    plan_rank,
    plan_sync,
    predict_sync,
    reduce_scatter,
    reshard,
    sparse_all_reduce,
    sync,
)

__version__ = "0.1.0"

__all__ = [name for name in dir() if not name.startswith("_")]
