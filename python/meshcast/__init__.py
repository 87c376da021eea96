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

from . import _meshcast
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


def _refusal_gives_up(fn, comm_at):
    """`fn`, a binding whose argument `comm_at` is the communicator of its call, where pybind11
    refuses the arguments before meshcast sees the call (an unknown keyword, an argument missing
    or one too many; every argument's type is meshcast's to check): as any refused call, it
    gives the communicator up, so that the peers fail at once naming this device instead of
    waiting for their timeout, and the TypeError says in one line what was wrong."""
    import functools
    import inspect
    import re

    head = fn.__doc__.splitlines()[0]
    signature = inspect.Signature([
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                          default=None if default else inspect.Parameter.empty)
        for name, default in re.findall(r"(\w+): [\w.]+( = [^,)]+)?", head[:head.index(")")])])
    comm_name = list(signature.parameters)[comm_at]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            if "incompatible function arguments" not in str(e):
                raise
            try:
                signature.bind(*args, **kwargs)
            except TypeError as wrong:
                why = f"{fn.__name__}: {wrong}"
            else:
                raise
            comm = args[comm_at] if len(args) > comm_at else kwargs.get(comm_name)
            _meshcast._give_up(comm, why)
            raise TypeError(why) from None

    return call


for _name, _at in (("reshard", 1), ("ireshard", 1), ("sync", 1), ("isync", 1), ("all_reduce", 0),
                   ("reduce_scatter", 0), ("all_gather", 0), ("broadcast", 0), ("all_to_all", 0),
                   ("sparse_all_reduce", 0)):
    globals()[_name] = _refusal_gives_up(globals()[_name], _at)
Topology.discover = staticmethod(_refusal_gives_up(Topology.discover, 0))
del _name, _at

__all__ = [name for name in dir() if not name.startswith("_")]
