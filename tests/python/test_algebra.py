"""Mesh, Layout, Topology and Plan as Python values."""
import json

import numpy as np
import pytest

import meshcast as mc
from conftest import NUMPY_DTYPES, random_layout


def test_mesh_forms_agree():
    assert mc.Mesh("2x2@[0,2,4,6]") == mc.Mesh((2, 2), [0, 2, 4, 6])
    m = mc.Mesh("2x4@8-15")
    assert m.shape == (2, 4) and m.devices == list(range(8, 16)) and m.size == 8
    assert 9 in m and 3 not in m
    assert np.int64(9) in m  # any integer; anything else is simply not in it
    assert 2**40 + 9 not in m and -2**70 not in m and "9" not in m and None not in m
    assert str(m) == "2x4@8-15" and eval(repr(m), {"meshcast": mc}) == m


def test_layout_tiles_cover_the_tensor_once(rng):
    # Property: over random layouts, the devices' boxes (one replica each) tile the tensor.
    for _ in range(200):
        shape = tuple(int(x) for x in rng.integers(0, 7, int(rng.integers(1, 4))))
        layout = random_layout(rng, shape, "f32", 8, partial=True)
        count = np.zeros(shape, np.int64)
        seen = set()
        for d in layout.devices:
            box = layout.local_box(d)
            assert tuple(s.stop - s.start for s in box) == layout.local_shape(d)
            key = (tuple((s.start, s.stop) for s in box), layout.addend(d))
            if key not in seen:
                seen.add(key)
                count[box] += 1
        assert (count == layout.addends).all(), layout


def test_layout_outside_mesh_is_none():
    l = mc.Layout((4, 6), "f32", "2@[3,5]:S0R")
    assert l.local_box(0) is None and l.local_shape(0) is None and l.addend(0) is None
    assert l.local_box(5) == (slice(2, 4), slice(0, 6))


@pytest.mark.parametrize("name", sorted(NUMPY_DTYPES))
def test_dtype_names(name):
    a = mc.Layout(4, name, "2:S0")
    b = mc.Layout(4, NUMPY_DTYPES[name], "2:S0")
    c = mc.Layout(4, np.dtype(NUMPY_DTYPES[name]), "2:S0")
    assert a == b == c and a.dtype == name
    assert a.numpy_dtype == np.dtype(NUMPY_DTYPES[name])


def test_torch_dtypes():
    torch = pytest.importorskip("torch")
    assert mc.Layout(4, torch.bfloat16, "2:S0").dtype == "bf16"
    assert mc.Layout(4, torch.float16, "2:S0").dtype == "f16"
    assert mc.Layout(4, torch.bool, "2:S0").dtype == "bool"
    assert mc.Layout(4, "bf16", "2:S0").numpy_dtype is None
    # A string spelled like a torch dtype is not one (neither is numpy's "float32" a torch one).
    for text in ("torch.float32", "torch.bfloat16"):
        with pytest.raises(TypeError, match=f"^dtype: '{text}' is not a dtype"):
            mc.Layout(4, text, "2:S0")


@pytest.mark.parametrize("args, field, exc", [
    (((4,), "f32", "2:S0S0"), "layout", ValueError),
    (((4,), "f33", "2:S0"), "dtype", TypeError),
    (((4,), np.float128, "2:S0"), "dtype", TypeError),
    (((4,), "f32", "2@0-2:S0"), "mesh", ValueError),
    (("4x", "f32", "2:S0"), "shape", TypeError),
    (((4, 4), "f32", "2:S0"), "layout", ValueError),
])
def test_layout_errors_name_the_field(args, field, exc):
    with pytest.raises(exc) as e:
        mc.Layout(*args)
    assert field in str(e.value).split(":")[0] or str(e.value).startswith(field), str(e.value)
    assert "\n" not in str(e.value)


def test_plan_value():
    src = mc.Layout((64, 32), "f32", "2x2@0-3:S0S1")
    dst = mc.Layout((64, 32), "f32", "4@4-7:RS0")
    p = mc.plan(src, dst, topology="aws-p3.8xlarge", strategy="broadcast")
    assert p.strategy == "broadcast" and p.src == src and p.dst == dst
    # One line per op, named for what it is (here every box has one receiver: a send).
    ops = [line for line in str(p).splitlines() if line.startswith("  [0] ")]
    assert len(ops) == p.stats["ops"] > 0 and all(" send " in line for line in ops), str(p)
    assert p.stats["bytes_moved"] == p.stats["bytes_intra_host"] + p.stats["bytes_network"]
    doc = json.loads(p.json())
    assert doc["strategy"] == "broadcast"
    assert mc.Plan.from_json(p.json()) == p
    # Against anything else: unequal, not a TypeError.
    assert p != None and not (p == 3) and p not in [None, 1] and p.rank(0) != p  # noqa: E711
    pred = p.predict()
    assert pred["seconds"] >= pred["bound_seconds"] > 0 and pred["links"]
    assert p.svg().startswith("<svg") or "<svg" in p.svg()[:200]
    assert p.devices == list(range(8))
    # Per-rank plans are the local rule's parts of the whole plan.
    local = mc.plan(src, dst, topology="aws-p3.8xlarge", strategy="broadcast", balance="local")
    for d in range(8):
        assert mc.plan_rank(src, dst, d, "aws-p3.8xlarge", "broadcast") == local.rank(d)


def test_plan_errors():
    src = mc.Layout((8,), "f32", "2:S0")
    with pytest.raises(ValueError, match="strategy"):
        mc.plan(src, src, strategy="fastest")
    with pytest.raises(ValueError, match="dtype"):
        mc.plan(src, mc.Layout((8,), "f64", "2:S0"))
    with pytest.raises(ValueError, match="topology"):
        mc.plan(src, src, topology="no-such-preset")
    with pytest.raises(TypeError, match="topology"):
        mc.plan(src, src, topology=3)


def test_topology_presets_and_files():
    t = mc.Topology("dgx-a100")
    assert t.name and t.hosts >= 1
    assert mc.Topology("dgx-a100.json").json() == t.json()
    from conftest import ROOT
    assert mc.Topology(ROOT + "/meshes/dgx-a100.json").json() == t.json()
    # A path object wherever a topology is taken, as Topology() takes it.
    import pathlib
    path = pathlib.Path(ROOT) / "meshes" / "dgx-a100.json"
    src, dst = mc.Layout((8,), "f32", "2@0-1:S0"), mc.Layout((8,), "f32", "2@2-3:S0")
    assert mc.plan(src, dst, topology=path).json() == mc.plan(src, dst, topology=t).json()
    # A path object is a file, never a preset: one that names none is an IoError (an OSError).
    for missing in (pathlib.Path("nope.json"), pathlib.Path("dgx-a100")):
        with pytest.raises(mc.IoError):
            mc.Topology(missing)
        with pytest.raises(OSError):
            mc.plan(src, dst, topology=missing)
    assert mc.Topology.from_json(t.json()).json() == t.json()
    assert mc.Topology.from_json(t.json().encode()).json() == t.json()  # a file read as bytes
    assert mc.Topology.single_host().hosts == 1


def test_your_presets_shadow_the_packages_as_in_the_cli(tmp_path, monkeypatch):
    # MESHCAST_TOPOLOGY_PATH comes first (docs/topology.md): a preset of the same name there wins
    # over the package's copy, for a plan and for discover, as it does for the CLI.
    from conftest import ROOT
    text = open(ROOT + "/meshes/dgx-a100.json").read().replace('"dgx-a100"', '"my-dgx"', 1)
    text = text.replace('"nics_per_host": 8', '"nics_per_host": 2', 1)
    assert '"my-dgx"' in text and '"nics_per_host": 2' in text
    (tmp_path / "dgx-a100.json").write_text(text)
    monkeypatch.setenv("MESHCAST_TOPOLOGY_PATH", str(tmp_path))
    assert mc.Topology("dgx-a100").name == "my-dgx"
    src = mc.Layout((8,), "f32", "2@0-1:S0")
    assert '"my-dgx"' in mc.plan(src, mc.Layout((8,), "f32", "2@2-3:S0"), "dgx-a100").json()
    out = mc.LocalWorld(2).run(lambda c: mc.Topology.discover(c, host="a", preset="dgx-a100"))
    assert out[0].nics_per_host == 2
    monkeypatch.delenv("MESHCAST_TOPOLOGY_PATH")
    assert mc.Topology("dgx-a100").name == "dgx-a100"  # the package's own


def test_discover_groups_by_host_name():
    def step(comm):
        host = "a" if comm.rank < 2 else "b"
        probed = mc.Topology.discover(comm, host=host, probe_bytes=1 << 16)
        preset = mc.Topology.discover(comm, host=host, preset="dgx-a100")
        return probed.json(), preset, comm.rank

    out = mc.LocalWorld(4).run(step)
    assert len({j for j, _, _ in out}) == 1  # identical on every device
    t = mc.Topology.from_json(out[0][0])
    assert t.hosts == 2 and [t.host_of(d) for d in range(4)] == [0, 0, 1, 1]
    assert t.host_name(1) == "b"
    preset = out[0][1]
    assert preset.nics_per_host == mc.Topology("dgx-a100").nics_per_host
    with pytest.raises(ValueError, match="preset|topology"):
        mc.LocalWorld(1).run(lambda c: mc.Topology.discover(c, preset="no-such"))


def test_discover_refusals_are_alike_on_every_device():
    # Options that differ are refused by agreement: every device raises the same ValidationError
    # and may go on. A device that raised it gave the communicator up, and one still taking the
    # verdict raised CommError instead (about half the runs under mpirun).
    def step(comm):
        got = set()
        for _ in range(10):
            try:
                mc.Topology.discover(comm, host="a",
                                     preset="dgx-a100" if comm.rank == 0 else "aws-p3.8xlarge")
            except Exception as e:
                got.add(f"{type(e).__name__}: {e}")
        comm.barrier()
        return got

    for got in mc.LocalWorld(4).run(step):
        assert len(got) == 1 and next(iter(got)).startswith("ValidationError: "), got


def test_discover_holds_the_probe_buffer_only_on_the_devices_that_probe():
    # 8 devices on one host: 2 ping-pong, so the job's peak is about 2 x 128 MiB, not 8 x.
    import subprocess
    import sys
    code = """import resource, meshcast as mc
mc.LocalWorld(8).run(lambda c: mc.Topology.discover(c, host="a", probe_bytes=128 << 20))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < 600, f"peak {out.stdout.strip()} MiB for 2 probing devices"


def test_values_pickle(rng):
    # Property: random layouts, their meshes and plans (with a topology) come back equal, as
    # mpi4py's bcast of a plan made on one rank needs; a wrong state is a ValueError.
    import pickle

    for _ in range(50):
        shape = tuple(int(x) for x in rng.integers(1, 9, int(rng.integers(1, 4))))
        src = random_layout(rng, shape, "bf16", 8, partial=True)
        dst = random_layout(rng, shape, "bf16", 8, partial=False)
        protocol = int(rng.integers(0, pickle.HIGHEST_PROTOCOL + 1))  # 0 and 1 ended Python
        for v in (src, src.mesh, dst):
            assert pickle.loads(pickle.dumps(v, protocol)) == v
        p = mc.plan(src, dst, topology="dgx-a100")
        back = pickle.loads(pickle.dumps(p, protocol))
        assert back == p and back.predict() == p.predict() and str(back) == str(p)
    topo = mc.Topology("h100-cluster")
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(topo, protocol)).json() == topo.json()
    with pytest.raises(ValueError, match="^Layout: a pickled state of 3 items"):
        mc.Layout.__new__(mc.Layout).__setstate__(("2@0-1:R",))


def test_zero_dimensional_layouts():
    # A 0-d tensor: its one element whole on every device (spec "" or "R"), maybe a pending sum.
    import pickle

    for text in ("2@3-4:", "2@3-4:R", "2x2@3-6:+P1", "2x2@3-6:R+P01"):
        lay = mc.Layout((), "i64", text)
        assert lay.shape == () and lay.nbytes == 8
        assert lay.local_shape(3) == () and lay.local_box(3) == ()
        assert lay.local_shape(0) is None and lay.local_box(0) is None
        assert eval(repr(lay), {"meshcast": mc}) == lay
        assert pickle.loads(pickle.dumps(lay)) == lay
        assert lay != mc.Layout((1,), "i64", str(lay))  # the same element, another shape
        full = np.array(5)
        assert full[lay.local_box(4)] == full
    p = mc.plan(mc.Layout((), "f32", "2@0-1:+P0"), mc.Layout((), "f32", "3@1-3:"))
    assert p.src.shape == () and pickle.loads(pickle.dumps(p)).dst.shape == ()
    assert mc.Plan.from_json(p.json()) == p


def test_stubs_match_the_module():
    # Every public name has a stub and every stub a name: the .pyi cannot drift from the module.
    import ast
    import os

    stub = os.path.join(os.path.dirname(mc.__file__), "__init__.pyi")
    tree = ast.parse(open(stub).read())
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    exported = {n for n in mc.__all__ if not n.startswith("_")}
    assert stubbed == exported
    assert all(getattr(mc, n).__doc__ for n in exported), "every public name has a docstring"
