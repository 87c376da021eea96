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


def _one_line_refusal(fn, name, comm_at=None):
    """`fn`, a binding, where pybind11 refuses the arguments before meshcast sees the call (an
    unknown keyword, an argument missing or one too many; every argument's type is meshcast's to
    check): the TypeError says in one line what was wrong (pybind11's took five, listing the
    overloads and the arguments' reprs), and where argument `comm_at` is the communicator of the
    call it is given up as after any refused call, so that the peers fail at once naming this
    device instead of waiting for their timeout."""
    import functools
    import inspect
    import re

    # One parameter list per overload, from pybind11's docstring ("f(a: T, b: T = x) -> R", or
    # "1. f(a: T) -> R" lines after "Overloaded function."), without self.
    doc = fn.__doc__
    heads = re.findall(r"^\d+\. \w*\((.*\)) ->", doc, re.M) or [doc.splitlines()[0].split("(", 1)[1]]
    signatures = [inspect.Signature([
        inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                          default=None if default else inspect.Parameter.empty)
        for p, default in re.findall(r"(\w+): [\w.]+( = [^,)]+)?", head[:head.index(")")])
        if p != "self"]) for head in heads]
    method = "self: " in heads[0]
    comm_name = None if comm_at is None else list(signatures[0].parameters)[comm_at]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            if not re.search("incompatible (function|constructor) arguments", str(e)):
                raise
            given = args[1:] if method else args
            wrongs = []
            for signature in signatures:
                try:
                    signature.bind(*given, **kwargs)
                except TypeError as wrong:
                    wrongs.append(str(wrong))
                else:
                    raise
            why = f"{name}: " + (wrongs[0] if len(wrongs) == 1 else "expected " + " or ".join(
                f"({', '.join(map(str, s.parameters.values()))})" for s in signatures))
            if comm_at is not None:
                comm = args[comm_at] if len(args) > comm_at else kwargs.get(comm_name)
                _meshcast._give_up(comm, why)
            raise TypeError(why) from None

    return call


for _name, _at in (("reshard", 1), ("ireshard", 1), ("sync", 1), ("isync", 1), ("all_reduce", 0),
                   ("reduce_scatter", 0), ("all_gather", 0), ("broadcast", 0), ("all_to_all", 0),
                   ("sparse_all_reduce", 0), ("plan", None), ("plan_rank", None),
                   ("plan_sync", None), ("predict_sync", None), ("load_model", None),
                   ("from_mpi4py", None), ("from_env", None)):
    globals()[_name] = _one_line_refusal(globals()[_name], _name, _at)
Topology.discover = staticmethod(_one_line_refusal(Topology.discover, "Topology.discover", 0))
# And every constructor, method and static method of the classes.
for _cls in (Mesh, Layout, Topology, Plan, RankPlan, SyncPlan, Comm, Group, LocalWorld, Handle):
    for _name, _value in list(vars(_cls).items()):
        _static = isinstance(_value, staticmethod)
        _fn = _value.__func__ if _static else _value
        if (_name.startswith("_") and _name != "__init__") or type(_fn).__name__ not in (
                "instancemethod", "builtin_function_or_method"):
            continue  # dunders (pybind11's operators, pickling), properties, the wrapped
        _fn = _one_line_refusal(
            _fn, _cls.__name__ if _name == "__init__" else f"{_cls.__name__}.{_name}")
        setattr(_cls, _name, staticmethod(_fn) if _static else _fn)
del _name, _at, _cls, _value, _static, _fn

__all__ = [name for name in dir() if not name.startswith("_")]
