"""reshard / ireshard on numpy arrays and torch tensors, every element checked."""
import numpy as np
import pytest

import meshcast as mc
from conftest import (NUMPY_DTYPES, addend_sum, expected_tile, random_pair, run_reshard, tiles,
                      values)


def check(p, rng, make=lambda a: a, empty=None, dtype=None):
    dt = dtype or NUMPY_DTYPES[p.src.dtype]
    addends = [values(rng, p.src.shape, dt) for _ in range(p.src.addends)]
    full = addend_sum(addends, dt)
    got = run_reshard(p, tiles(p.src, full, addends), make, empty)
    assert set(got) == set(p.dst.devices)
    for d, tile in got.items():
        np.testing.assert_array_equal(tile, expected_tile(p.dst, full, d), err_msg=f"device {d}")


@pytest.mark.parametrize("name", sorted(NUMPY_DTYPES))
def test_random_layouts_every_numpy_dtype(name, rng):
    for _ in range(6):
        src, dst = random_pair(rng, name)
        check(mc.plan(src, dst, strategy=str(rng.choice(["auto", "broadcast", "sendrecv"]))), rng)


@pytest.mark.parametrize("strategy", ["auto", "broadcast", "sendrecv", "allgather"])
def test_random_layouts_strategies(strategy, rng):
    for _ in range(15):
        src, dst = random_pair(rng, "f32", partial=strategy != "allgather")
        check(mc.plan(src, dst, strategy=strategy), rng)


def test_torch_tensors_zero_copy(rng):
    torch = pytest.importorskip("torch")
    for dtype in [torch.bfloat16, torch.float32, torch.int64, torch.float16, torch.bool]:
        for _ in range(4):
            src, dst = random_pair(rng, dtype, partial=dtype != torch.bool)
            p = mc.plan(src, dst)
            full = torch.randint(0, 50, src.shape).to(dtype)
            addends = [full] + [torch.zeros_like(full)] * (src.addends - 1)
            world = max(p.devices) + 1

            def step(comm):
                me = comm.rank
                a = None
                if me in src.mesh:
                    a = addends[src.addend(me)][src.local_box(me)].contiguous()
                b = torch.empty(dst.local_shape(me), dtype=dtype) if me in dst.mesh else None
                ptr = None if b is None else b.data_ptr()
                mc.reshard(p, comm, a, b)
                assert b is None or b.data_ptr() == ptr  # written in place
                return b

            for d, b in enumerate(mc.LocalWorld(world).run(step)):
                if b is None:
                    continue
                want = full[dst.local_box(d)] if dst.addend(d) == 0 else torch.zeros_like(b)
                assert torch.equal(b, want), (d, src, dst)


def test_numpy_destination_written_in_place():
    src = mc.Layout((6, 4), "f64", "2@0-1:S0R")
    dst = mc.Layout((6, 4), "f64", "2@0-1:RS0")
    p = mc.plan(src, dst)
    full = np.arange(24, dtype=np.float64).reshape(6, 4)
    outs = [np.zeros(dst.local_shape(d)) for d in range(2)]

    def step(comm):
        mc.reshard(p, comm, full[src.local_box(comm.rank)].copy(), outs[comm.rank])

    mc.LocalWorld(2).run(step)
    for d in range(2):
        np.testing.assert_array_equal(outs[d], full[dst.local_box(d)])


def test_ireshard_and_rank_plans(rng):
    for _ in range(10):
        src, dst = random_pair(rng, "i32")
        rank_plans = {}
        world = max(set(src.devices) | set(dst.devices)) + 1
        full = values(rng, src.shape, np.int32)
        addends = [full] + [np.zeros_like(full)] * (src.addends - 1)
        src_tiles = tiles(src, full, addends)

        def step(comm):
            me = comm.rank
            rp = mc.plan_rank(src, dst, me)
            b = np.zeros(dst.local_shape(me), np.int32) if me in dst.mesh else None
            h = mc.ireshard(rp, comm, src_tiles.get(me), b)
            while not h.test():
                pass
            h.wait()
            assert h.done
            return b

        for d, b in enumerate(mc.LocalWorld(world).run(step)):
            if b is not None:
                np.testing.assert_array_equal(b, expected_tile(dst, full, d))


def test_groups_and_several_transfers_in_flight():
    src = mc.Layout((8, 8), "f32", "2@2-3:S0R")
    dst = mc.Layout((8, 8), "f32", "2@0-1:RS0")
    p = mc.plan(src, dst)
    full = np.arange(64, dtype=np.float32).reshape(8, 8)

    def step(comm):
        me = comm.rank
        g = comm.group([3, 2, 1, 0])
        a = full[src.local_box(me)].copy() if me in src.mesh else None
        bs = [np.zeros(dst.local_shape(me), np.float32) if me in dst.mesh else None
              for _ in range(3)]
        hs = [mc.ireshard(p, g, a, b) for b in bs]
        for h in reversed(hs):
            h.wait()
        return bs

    for d, bs in enumerate(mc.LocalWorld(4).run(step)):
        for b in bs:
            if b is not None:
                np.testing.assert_array_equal(b, full[dst.local_box(d)])


def test_zero_dimensional_tensors():
    # A 0-d loss summed over 4 addends into every device of another mesh: its tile is passed as
    # a 0-d array or as shape (1,) (the same element); any other shape is refused by name.
    torch = pytest.importorskip("torch")
    p = mc.plan(mc.Layout((), "bf16", "2x2@0-3:+P01"), mc.Layout((), "bf16", "3@2-4:"))

    def step(comm):
        me = comm.rank
        a = torch.tensor(0.5 * (me + 1), dtype=torch.bfloat16) if me < 4 else None
        b = torch.zeros((), dtype=torch.bfloat16) if me >= 2 else None
        mc.reshard(p, comm, a, b)
        one = torch.zeros((1,), dtype=torch.bfloat16) if me >= 2 else None
        mc.reshard(p, comm, a, one)
        comm.barrier()  # a refusal gives the communicator up: every reshard done first
        if me >= 2:  # refused before anything moves: devices 0 and 1 do not take part
            with pytest.raises(ValueError, match=r"^dst: expected shape \(\) .* got \(2,\)"):
                mc.reshard(p, comm, a, torch.zeros((2,), dtype=torch.bfloat16))
        return b, one

    for d, (b, one) in enumerate(mc.LocalWorld(5).run(step)):
        if d >= 2:
            assert b.shape == () and float(b) == 5.0 and float(one[0]) == 5.0


def test_a_zero_dimensional_source_may_be_a_numpy_scalar():
    # The docs' recipe, full[src.local_box(me)], gives a numpy scalar for a 0-d tile: read as
    # a 0-d array; as a target (it cannot be written) refused by name.
    src, dst = mc.Layout((), "f32", "2@0-1:R"), mc.Layout((), "f32", "2@2-3:R")
    p = mc.plan(src, dst)
    full = np.array(5.0, np.float32)

    def step(comm):
        me = comm.rank
        a = full[src.local_box(me)] if src.local_box(me) is not None else None
        b = np.zeros((), np.float32) if me >= 2 else None
        mc.reshard(p, comm, a, b)
        comm.barrier()
        if me >= 2:
            with pytest.raises(TypeError, match="^dst: a numpy scalar cannot be written"):
                mc.reshard(p, comm, None, np.float32(0))
        return None if b is None else float(b)

    assert mc.LocalWorld(4).run(step) == [None, None, 5.0, 5.0]
