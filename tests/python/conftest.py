"""Shared helpers of the Python suite: random layouts, reference data, runs on a LocalWorld."""
import os
import sys

import numpy as np
import pytest

import meshcast as mc

# Every numeric dtype numpy has (longdouble aside: its size is the platform's), by meshcast name.
NUMPY_DTYPES = {
    "f16": np.float16, "f32": np.float32, "f64": np.float64,
    "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
    "bool": np.bool_, "c64": np.complex64, "c128": np.complex128,
}

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def each_refusal_gives_up(cases, world=2):
    """Each (call(comm), exception, pattern) on a LocalWorld of its own: every device's call is
    refused with it, and the refusal gives the communicator up (a later call fails so)."""
    for call, exc, pattern in cases:
        def step(comm):
            with pytest.raises(exc, match=pattern):
                call(comm)
            with pytest.raises(mc.CommError, match="an earlier call gave this communicator up"):
                comm.barrier()
            return True

        assert mc.LocalWorld(world).run(step) == [True] * world, pattern


def values(rng, shape, dtype):
    """Random values that survive a sum of a few addends exactly in every dtype."""
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.integers(-8, 8, shape) + 1j * rng.integers(-8, 8, shape)).astype(dtype)
    if np.issubdtype(dtype, np.unsignedinteger):
        return rng.integers(0, 30, shape).astype(dtype)
    return rng.integers(-30, 30, shape).astype(dtype)


def addend_sum(addends, dtype):
    """The tensor a pending sum stands for (bool: logical or, as meshcast's sum of bools)."""
    return np.add.reduce(np.stack(addends), axis=0, dtype=dtype)


def random_spec(rng, ndim, mesh_ndim, partial):
    axes = list(rng.permutation(mesh_ndim))
    tokens = []
    for _ in range(ndim):
        k = int(rng.integers(0, 3)) if axes else 0
        k = min(k, len(axes))
        used, axes = axes[:k], axes[k:]
        tokens.append("S" + "".join(str(a) for a in used) if used else "R")
    spec = "".join(tokens)
    if partial and axes and rng.random() < 0.5:
        spec += "+P" + "".join(str(a) for a in sorted(axes[:1]))
    return spec


def random_layout(rng, shape, dtype, world, partial):
    ndim = int(rng.integers(1, 3))
    while True:
        extents = [int(x) for x in rng.integers(1, 4, ndim)]
        if int(np.prod(extents)) <= world:
            break
    devices = [int(d) for d in rng.choice(world, int(np.prod(extents)), replace=False)]
    mesh = "x".join(map(str, extents)) + "@[" + ",".join(map(str, devices)) + "]"
    return mc.Layout(shape, dtype, mesh + ":" + random_spec(rng, len(shape), ndim, partial))


def random_pair(rng, dtype="f32", world=6, partial=True):
    ndim = 0 if rng.random() < 0.1 else int(rng.integers(1, 4))  # now and then a 0-d tensor
    shape = tuple(int(x) for x in rng.integers(1, 8, ndim))
    src = random_layout(rng, shape, dtype, world, partial)
    dst = random_layout(rng, shape, dtype, world, partial)
    return src, dst


def tiles(layout, full, addends):
    """{device: its tile}: the addend it holds of a partial layout, its box of `full` else."""
    out = {}
    for d in layout.devices:
        g = layout.addend(d)
        source = addends[g] if layout.addends > 1 else full
        out[d] = np.ascontiguousarray(source[layout.local_box(d)])
    return out


def expected_tile(layout, full, device):
    """What a target device holds: its box of the value, zeros on addends other than the first."""
    t = np.ascontiguousarray(full[layout.local_box(device)])
    return t if layout.addend(device) == 0 else np.zeros_like(t)


def run_reshard(p, src_tiles, make=lambda a: a, empty=None, world=None):
    """Runs plan `p` on a LocalWorld; returns {device: its dst array as numpy}."""
    dst = p.dst
    empty = empty or (lambda shape: np.full(shape, 0x5A, dtype=NUMPY_DTYPES[dst.dtype]))
    n = world or max(p.devices) + 1

    def step(comm):
        me = comm.rank
        a = make(src_tiles[me]) if me in src_tiles else None
        b = empty(dst.local_shape(me)) if me in dst.mesh else None
        mc.reshard(p, comm, a, b)
        return None if b is None else np.asarray(b)

    return {d: r for d, r in enumerate(mc.LocalWorld(n).run(step)) if r is not None}


@pytest.fixture
def rng(request):
    # One stream per test, named by it: a failure reproduces alone.
    return np.random.default_rng(abs(hash(request.node.nodeid)) % (2**32))


def mpirun(np_, script, *args, env=None, timeout=300):
    """Runs `script` under mpirun with np_ ranks (as root, oversubscribed: CI has 2 cores)."""
    import subprocess

    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_),
           "--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none",
           "-x", "PYTHONPATH",
           sys.executable, script, *args]
    e = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1", **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
