"""Bad arguments give ValueError / TypeError naming the argument; no crash, no hang."""
import numpy as np
import pytest

import meshcast as mc

SRC = mc.Layout((4, 6), "f32", "2@0-1:S0R")
DST = mc.Layout((4, 6), "f32", "2@0-1:RS0")
PLAN = mc.plan(SRC, DST)


def good_src(d):
    return np.zeros(SRC.local_shape(d), np.float32)


def good_dst(d):
    return np.zeros(DST.local_shape(d), np.float32)


class OnGpu:
    """A tensor on another device, as DLPack describes one (type 2: CUDA)."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise BufferError("cannot export a CUDA tensor here")


def read_only(d):
    a = good_dst(d)
    a.flags.writeable = False
    return a


CASES = [
    ("src", TypeError, "f64", lambda d: np.zeros(SRC.local_shape(d), np.float64), good_dst),
    ("src", ValueError, "shape", lambda d: np.zeros((3, 6), np.float32), good_dst),
    ("dst", ValueError, "C-contiguous", good_src,
     lambda d: np.zeros(DST.local_shape(d)[::-1], np.float32).T),
    ("dst", ValueError, "read-only", good_src, read_only),
    ("src", ValueError, "cuda", lambda d: OnGpu(), good_dst),
    ("src", TypeError, "list", lambda d: [0.0] * 12, good_dst),
    ("dst", ValueError, "got None", good_src, lambda d: None),
    ("src", TypeError, "float128", lambda d: np.zeros(SRC.local_shape(d), np.longdouble), good_dst),
    ("src", ValueError, "big-endian", lambda d: np.zeros(SRC.local_shape(d), ">f4"), good_dst),
]


@pytest.mark.parametrize("arg, exc, words, make_src, make_dst", CASES,
                         ids=[c[2] for c in CASES])
def test_bad_array_is_named(arg, exc, words, make_src, make_dst):
    # Checked before anything is sent: every device raises, none waits on another.
    def step(comm):
        with pytest.raises(exc) as e:
            mc.reshard(PLAN, comm, make_src(comm.rank), make_dst(comm.rank))
        msg = str(e.value)
        assert msg.startswith(arg + ":") and words in msg and "\n" not in msg, msg
        return True

    assert mc.LocalWorld(2).run(step) == [True, True]


def test_torch_bad_tensors():
    torch = pytest.importorskip("torch")

    def step(comm):
        d = comm.rank
        with pytest.raises(TypeError, match="^src: expected f32"):
            mc.reshard(PLAN, comm, torch.zeros(SRC.local_shape(d), dtype=torch.float64),
                       good_dst(d))
        with pytest.raises(ValueError, match="^dst: tensor is not C-contiguous"):
            mc.reshard(PLAN, comm, good_src(d), torch.zeros(DST.local_shape(d)[::-1]).t())
        with pytest.raises(ValueError, match="^dst: .*requires? grad"):
            mc.reshard(PLAN, comm, good_src(d),
                       torch.zeros(DST.local_shape(d), requires_grad=True))
        with pytest.raises(ValueError, match="^src: .*meta"):
            mc.reshard(PLAN, comm, torch.zeros(SRC.local_shape(d), device="meta"), good_dst(d))
        return True

    assert mc.LocalWorld(2).run(step) == [True, True]


def test_not_in_mesh_must_be_none():
    src = mc.Layout((4,), "f32", "1@0:R")
    dst = mc.Layout((4,), "f32", "1@1:R")
    p = mc.plan(src, dst)

    def step(comm):
        if comm.rank == 1:
            with pytest.raises(ValueError, match="^src: device 1 holds no tile"):
                mc.reshard(p, comm, np.zeros(4, np.float32), np.zeros(4, np.float32))
        return True

    mc.LocalWorld(2).run(step)


def test_exception_in_one_device_is_reraised_and_others_do_not_hang():
    def step(comm):
        if comm.rank == 1:
            raise KeyError("device 1 gave up")
        mc.reshard(PLAN, comm, good_src(comm.rank), good_dst(comm.rank))

    with pytest.raises(KeyError, match="device 1 gave up"):
        mc.LocalWorld(2, timeout=30).run(step)


def test_comm_used_after_run():
    comms = mc.LocalWorld(1).run(lambda comm: comm)
    with pytest.raises(ValueError, match="^comm: its session has ended"):
        comms[0].rank


def test_wrong_comm_and_plan_types():
    def step(comm):
        with pytest.raises(TypeError, match="^comm:"):
            mc.reshard(PLAN, object(), None, None)
        with pytest.raises(TypeError, match="^plan:"):
            mc.reshard("plan", comm, None, None)
        return True

    mc.LocalWorld(1).run(step)


def test_bad_world_arguments():
    with pytest.raises(ValueError, match="^size"):
        mc.LocalWorld(0)
    with pytest.raises(ValueError, match="^timeout"):
        mc.LocalWorld(2, timeout=-1)
