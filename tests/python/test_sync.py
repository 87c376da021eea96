"""Whole-model sync on dicts {name: array}: explicit moves, M2N manifests, casts."""
import json
import pathlib

import numpy as np
import pytest

import meshcast as mc
from conftest import ROOT, expected_tile, random_pair, each_refusal_gives_up, values

torch = pytest.importorskip("torch")


def run_sync(moves, full, world, make_dst, **options):
    """Every device syncs its tiles; returns per device {name: its received tile}."""

    def step(comm):
        me = comm.rank
        plan = mc.plan_sync(moves, me, **options)
        src, dst = {}, {}
        for name, s, d in moves:
            if me in s.mesh:
                tile = full[name] if s.addends == 1 else (
                    full[name] if s.addend(me) == 0 else torch.zeros_like(full[name]))
                src[name] = tile[s.local_box(me)].contiguous()
            if me in d.mesh:
                dst[name] = make_dst(d, me)
        mc.sync(plan, comm, src, dst)
        return dst

    return mc.LocalWorld(world).run(step)


def test_random_moves_one_sync(rng):
    moves, full = [], {}
    for i in range(25):
        src, dst = random_pair(rng, "f32", world=6)
        moves.append((f"t{i}", src, dst))
        full[f"t{i}"] = torch.from_numpy(values(rng, src.shape, np.float32))
    got = run_sync(moves, full, 6, lambda d, me: torch.full(d.local_shape(me), -7.0),
                   max_staging_bytes=256)
    for me, tiles in enumerate(got):
        for name, s, d in moves:
            if me in d.mesh:
                want = expected_tile(d, full[name].numpy(), me)
                np.testing.assert_array_equal(tiles[name].numpy(), want, err_msg=name)


def test_m2n_manifest_with_bf16_cast(tmp_path, rng):
    # A small model in NCCL M2N's model-config form, f32 master weights cast to bf16 on the way.
    h, layers = 16, 2
    config = {"model.embed_tokens.weight": {"shape": [50, h], "dtype": "F32"}}
    for l in range(layers):
        p = f"model.layers.{l}."
        config.update({
            p + "input_layernorm.weight": {"shape": [h], "dtype": "F32"},
            p + "self_attn.q_proj.weight": {"shape": [h, h], "dtype": "F32"},
            p + "self_attn.o_proj.weight": {"shape": [h, h], "dtype": "F32"},
            p + "mlp.up_proj.weight": {"shape": [3 * h, h], "dtype": "F32"},
            p + "mlp.down_proj.weight": {"shape": [h, 3 * h], "dtype": "F32"},
        })
    config["model.norm.weight"] = {"shape": [h], "dtype": "F32"}
    model = tmp_path / "model.json"
    model.write_text(json.dumps(config))
    moves = mc.load_model(str(model), ROOT + "/models/systems/tp2pp2-to-tp2dp2.json", cast="bf16")
    assert len(moves) == len(config)
    assert all(s.dtype == "f32" and d.dtype == "bf16" for _, s, d in moves)
    full = {name: torch.from_numpy(values(rng, s.shape, np.float32)) * 0.37 for name, s, _ in moves}
    got = run_sync(moves, full, 8, lambda d, me: torch.empty(d.local_shape(me), dtype=torch.bfloat16))
    checked = 0
    for me, tiles in enumerate(got):
        for name, s, d in moves:
            if me in d.mesh:
                assert torch.equal(tiles[name], full[name].to(torch.bfloat16)[d.local_box(me)])
                checked += 1
    assert checked == len(moves) * 4  # every generator holds every tensor (dp=2 x tp=2)


def test_sync_errors(rng):
    src = mc.Layout((4, 4), "f32", "2@0-1:S0R")
    dst = mc.Layout((4, 4), "f32", "2@0-1:RS0")
    moves = [("w", src, dst)]

    def refused(call):  # call(comm, plan, a, b)
        def run(comm):
            me = comm.rank
            call(comm, mc.plan_sync(moves, me), torch.zeros(src.local_shape(me)),
                 torch.zeros(dst.local_shape(me)))
        return run

    each_refusal_gives_up([
        (refused(lambda c, p, a, b: mc.sync(p, c, {"w": a, "v": a}, {"w": b})),
         ValueError, r"^src\['v'\]: not a tensor of the sync"),
        (refused(lambda c, p, a, b: mc.sync(p, c, {"w": a}, {})),
         ValueError, r"^dst\['w'\]: device \d holds a tile"),
        (refused(lambda c, p, a, b: mc.isync(p, c, {"w": a.double()}, {"w": b})),
         TypeError, r"^src\['w'\]: expected f32"),
        (refused(lambda c, p, a, b: mc.sync(mc.plan_sync(moves, 1 - c.rank), c, {"w": a},
                                            {"w": b})),
         ValueError, "^plan: device"),
    ])

    def step(comm):
        me = comm.rank
        plan = mc.plan_sync(moves, me)
        a = torch.zeros(src.local_shape(me))
        b = torch.zeros(dst.local_shape(me))
        with pytest.raises(TypeError, match=r"^tensors\[0\]"):
            mc.plan_sync([("w", src)], me)
        with pytest.raises(ValueError, match="dtype"):
            mc.plan_sync([("w", src, mc.Layout((4, 4), "i32", "2@0-1:RS0"))], me)
        h = mc.isync(plan, comm, {"w": a}, {"w": b})
        h.wait()
        return True

    assert mc.LocalWorld(2).run(step) == [True, True]


def test_a_model_that_differs_is_named_not_the_lengths_of_its_messages():
    # Device 2 casts tensor "a" to f16 where the others move it as f32: its messages are shorter
    # than the senders', and may complete before the senders' words are checked. The failure is
    # named as the model's on every run, never as a length ("sent 64 bytes where 32 were ...").
    src = mc.Layout((8, 4), "f32", "2@0-1:S0R")
    dst = mc.Layout((8, 4), "f32", "2@2-3:RS0")
    dst16 = mc.Layout((8, 4), "f16", "2@2-3:RS0")

    def step(comm):
        me = comm.rank
        moves = [("a", src, dst16 if me == 2 else dst), ("b", src, dst)]
        plan = mc.plan_sync(moves, me)
        a = {n: np.ones(s.local_shape(me), np.float32) for n, s, _ in moves if me in s.mesh}
        b = {n: np.zeros(d.local_shape(me), np.float16 if d.dtype == "f16" else np.float32)
             for n, _, d in moves if me in d.mesh}
        try:
            mc.sync(plan, comm, a, b)
        except (ValueError, mc.CommError) as e:
            return str(e)
        return "returned"

    for run in range(60):
        outcomes = mc.LocalWorld(4, timeout=10).run(step)
        assert not any("bytes where" in o for o in outcomes), (run, outcomes)
        assert any(o.startswith("model: device") for o in outcomes), (run, outcomes)


def test_predict_sync():
    moves = mc.load_model(ROOT + "/models/gpt2-small.json",
                          ROOT + "/models/systems/tp2pp2-to-tp2dp2.json")
    # Paths as os.PathLike read the same files.
    root = pathlib.Path(ROOT)
    assert mc.load_model(root / "models/gpt2-small.json",
                         root / "models/systems/tp2pp2-to-tp2dp2.json") == moves
    pred = mc.predict_sync(moves, topology="dgx-a100")
    assert pred["predicted_seconds"] > 0 and pred["bytes_moved"] > 0 and pred["busiest_link"]


def test_tensor_names_are_bounded():
    # Every device's part copies the names: one of 30 MB held 3.8 GB over 64 devices.
    (_, src, dst), = mc.load_model(ROOT + "/models/gpt2-small.json",
                                   ROOT + "/models/systems/tp2pp2-to-tp2dp2.json")[:1]
    assert mc.plan_sync([("n" * 1024, src, dst)], 0) is not None
    with pytest.raises(ValueError, match=r"^tensors\[1\]\.name: is 1025 bytes long"):
        mc.plan_sync([("w", src, dst), ("n" * 1025, src, dst)], 0)


def test_forked_chains_and_their_baseline():
    # A trainer of dp 3 beside one generator on host 0 of a NIC-per-device topology: forked
    # chains leave the host through the trainers' NICs; fork=False through the generator's.
    moves = mc.load_model(ROOT + "/models/gpt2-small.json",
                          ROOT + "/models/systems/dp3-to-dp5.json")
    topo = ROOT + "/meshes/emulated-2x4-nic.json"
    forked = mc.predict_sync(moves, topology=topo)
    plain = mc.predict_sync(moves, topology=topo, fork=False)
    assert forked["busiest_link"] == "host mc-host0 nic 0 out"
    assert plain["busiest_link"] == "host mc-host0 nic 3 out"
    assert forked["link_bound_seconds"] < 0.6 * plain["link_bound_seconds"]
    assert mc.plan_sync(moves, 0, topology=topo, fork=False).stats["messages"] > 0
    # A device's part says what it does, not what only the whole sync on its topology prices.
    assert set(mc.plan_sync(moves, 0, topology=topo).stats) == {"tensors", "messages", "boxes",
                                                                "bytes_moved"}
    with pytest.raises(TypeError):
        mc.predict_sync(moves, topology=topo, fork=0)


def test_state_dict_with_zero_dimensional_buffers():
    # BatchNorm's num_batches_tracked is a 0-d int64 buffer: a real state_dict syncs whole.
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.Linear(16, 4))
    for _ in range(3):
        model(torch.randn(5, 8)).sum().backward()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    assert state["1.num_batches_tracked"].shape == ()
    moves = [(k, mc.Layout(v.shape, v.dtype, "2@0-1:" + ("S0" + "R" * (v.dim() - 1) if v.dim()
                                                         else "")),
              mc.Layout(v.shape, v.dtype, "2x2@2-5:" + "R" * v.dim())) for k, v in state.items()]
    dtypes = {"f32": torch.float32, "i64": torch.int64}
    got = run_sync(moves, state, 6,
                   lambda d, me: torch.empty(d.local_shape(me), dtype=dtypes[d.dtype]))
    for me in range(2, 6):
        for k, v in state.items():
            assert torch.equal(got[me][k], v), (me, k)


def test_a_device_whose_sync_was_refused_gets_no_stale_tensor():
    # Device 2 gives a destination of the wrong shape at step 0, the right one after; its peers'
    # messages of step 0 go out regardless. They filled its step 1 (step 0's tensor, reported as
    # ok, one step behind). The refusal gives the communicator up now: no device gets a tensor
    # of another step, and every later call fails naming device 2's refusal.
    src = mc.Layout((64,), "f32", "2@0-1:S0")
    dst = mc.Layout((64,), "f32", "2@2-3:R")

    def step(comm):
        me = comm.rank
        plan = mc.plan_sync([("w", src, dst)], me)
        out = []
        for k in range(3):
            a = {"w": np.full(src.local_shape(me), k + 1.0, np.float32)} if me in src.mesh else {}
            shape = (3,) if me == 2 and k == 0 else dst.local_shape(me)
            b = {"w": np.zeros(shape, np.float32)} if me in dst.mesh else {}
            try:
                mc.sync(plan, comm, a, b)
                out.append("ok" if not b or (b["w"] == k + 1).all() else f"wrong at step {k}")
            except ValueError as e:  # a CommError is not one
                out.append(f"refused: {e}")
            except mc.CommError as e:
                out.append(f"failed: {e}")
        return out

    out = mc.LocalWorld(4, timeout=10).run(step)
    assert out[2][0].startswith("refused: dst['w']: expected shape"), out
    for me, steps in enumerate(out):
        assert not any(s.startswith("wrong") for s in steps), (me, steps)
        assert all(s.startswith("failed: device 2: failed: dst['w']") for s in steps[1:]), (me, steps)


def test_names_are_looked_up_by_index():
    # Each of a sync's names was found by a scan: quadratic in the tensors (40,000 took 11 s).
    rng = np.random.default_rng(7)
    lay = mc.Layout((2,), "f32", "1:R")
    names = [f"layers.{i}.w" for i in rng.permutation(3000)]
    p = mc.plan_sync([(n, lay, lay) for n in names], 0)
    assert [p.index(n) for n in names] == list(range(len(names)))
    assert p.index("layers.3000.w") == -1 and p.index("") == -1 and p.index("layers.1.") == -1


def test_a_write_over_an_earlier_long_read_is_refused():
    # Sources may share memory; a target may not overlap any of them. The sweep keeps only the
    # range that reaches furthest: here the first source, past a shorter one that ends sooner.
    long, short = mc.Layout((16,), "f32", "1:R"), mc.Layout((8,), "f32", "1:R")
    moves = [("a", long, long), ("b", short, short), ("c", short, short)]
    big = np.zeros(64, np.float32)

    def step(comm, c_src, c_dst):
        mc.sync(mc.plan_sync(moves, 0), comm, {"a": big[0:16], "b": big[1:9], "c": c_src},
                {"a": big[16:32], "b": big[32:40], "c": c_dst})
        return True

    with pytest.raises(ValueError, match=r"^dst\['c'\]: shares memory with src\['a'\]"):
        mc.LocalWorld(1).run(lambda comm: step(comm, big[40:48], big[12:20]))
    assert mc.LocalWorld(1).run(lambda comm: step(comm, big[2:10], big[40:48])) == [True]


def test_a_zero_dimensional_source_may_be_a_numpy_scalar():
    # full[()] of a 0-d tensor is a numpy scalar: a sync reads it as the collectives and
    # reshard do.
    src, dst = mc.Layout((), "i64", "2@0-1:R"), mc.Layout((), "i64", "2@2-3:R")
    full = np.array(7, np.int64)

    def step(comm):
        me = comm.rank
        p = mc.plan_sync([("steps", src, dst)], me)
        out = {"steps": np.zeros((), np.int64)} if me >= 2 else {}
        mc.sync(p, comm, {"steps": full[()]} if me < 2 else {}, out)
        return int(out["steps"]) if out else None

    assert mc.LocalWorld(4).run(step) == [None, None, 7, 7]
