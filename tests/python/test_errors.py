"""Bad arguments give ValueError / TypeError naming the argument; no crash, no hang."""
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import meshcast as mc
from conftest import each_refusal_gives_up

SRC = mc.Layout((4, 6), "f32", "2@0-1:S0R")
DST = mc.Layout((4, 6), "f32", "2@0-1:RS0")
PLAN = mc.plan(SRC, DST)
BOOL_PLAN = mc.plan(mc.Layout((4, 6), "bool", "2@0-1:S0R"), mc.Layout((4, 6), "bool", "2@0-1:RS0"))
MOVES = [("w", SRC, DST)]


class LyingLength:
    """A sequence whose __len__ says `n` but that holds one item, 4."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i < 1:
            return 4
        raise IndexError(i)


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
        # A bool tensor (its memory read through .numpy()) is refused alike.
        with pytest.raises(ValueError, match=r"^dst: tensor is not C-contiguous; pass x\.contiguous"):
            mc.reshard(BOOL_PLAN, comm, torch.zeros(SRC.local_shape(d), dtype=torch.bool),
                       torch.zeros(DST.local_shape(d)[::-1], dtype=torch.bool).t())
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


def test_numbers_of_numpy_are_numbers():
    # (pybind11 took them; the arguments read by hand must too.)
    assert mc.LocalWorld(np.int64(2), timeout=np.float32(5)).run(lambda c: c.rank) == [0, 1]
    assert mc.LocalWorld(2).run(lambda c: c.rank, devices=np.array([1, 0])) == [1, 0]


def test_comm_arguments_are_named_in_one_line():
    def step(comm):
        seen = []
        for make in (lambda: comm.group([0, 2**40]), lambda: comm.group(3),
                     lambda: mc.broadcast(comm, np.ones(4), 2**40),
                     lambda: mc.broadcast(comm, np.ones(4), True),
                     lambda: mc.Topology.discover(comm.group([0, 1]))):
            try:
                make()
                seen.append("accepted")
            except (TypeError, ValueError) as e:
                seen.append(type(e).__name__ + ": " + str(e))
        return seen

    seen = mc.LocalWorld(2, timeout=30).run(step)[0]
    assert [s.split(":")[0:2] for s in seen] == [
        ["ValueError", " devices[1]"], ["TypeError", " devices"], ["ValueError", " root"],
        ["TypeError", " root"], ["TypeError", " comm"]], seen
    assert not any("\n" in s for s in seen), seen


@pytest.mark.parametrize("call, why", [
    (lambda c, x: mc.broadcast(c, x, root=0, algorithm="ring"),
     "broadcast: got an unexpected keyword argument 'algorithm'"),
    (lambda c, x: mc.broadcast(c, x), "broadcast: missing a required argument: 'root'"),
    (lambda c, x: mc.all_reduce(c, x, None, "sum", "auto", None, False, 1),
     "all_reduce: too many positional arguments"),
    (lambda c, x: mc.sync(plan=None, comm=c, src={}), "sync: missing a required argument: 'dst'"),
])
def test_arguments_pybind11_refuses_give_the_communicator_up(call, why):
    # Refused before meshcast saw the call, they gave nothing up: a peer making the right call
    # waited for its timeout, and a barrier after it blamed the peer. Now as any refused call:
    # one line, and the peer fails at once naming device 0.
    def step(comm):
        x = np.ones(4, np.float32)
        try:
            if comm.rank == 0:
                call(comm, x)
            else:
                mc.broadcast(comm, x, root=0)
            return "returned"
        except (TypeError, mc.CommError) as e:
            return f"{type(e).__name__}: {e}"

    seen = mc.LocalWorld(2, timeout=60).run(step)
    assert seen[0] == f"TypeError: {why}", seen
    assert seen[1].startswith(f"CommError: device 0: failed: {why}"), seen


def test_polling_test_on_a_peer_that_returned_fails_at_once():
    # A loop of test() alone learns of it as wait() does (it spun for ever).
    def step(comm):
        if comm.rank == 0:
            return
        h = mc.all_reduce(comm, np.ones(4), async_op=True)
        while not h.test():
            pass

    with pytest.raises(mc.CommError, match="^device 0: returned from its function"):
        mc.LocalWorld(2, timeout=600).run(step)


def test_a_collective_on_a_device_not_run_fails_at_once():
    # run(devices=[1, 3]): devices 0 and 2 never start, so a collective of the whole world
    # cannot complete; it fails at once, naming one of them, instead of after the timeout.
    def step(comm):
        mc.all_reduce(comm, np.ones(4, np.float32))

    t0 = time.monotonic()
    with pytest.raises(mc.CommError, match=r"^device [02]: is not running \(not among the devices"):
        mc.LocalWorld(4, timeout=600).run(step, devices=[1, 3])
    assert time.monotonic() - t0 < 60


def test_collectives_waited_in_different_orders_complete():
    # Started alike everywhere, waited in other orders (and one across a barrier): a device that
    # waits moves the others on, which its peers may be waiting for.
    def step(comm):
        xs = [np.full(1000, comm.rank + i, np.float64) for i in range(3)]
        hs = [mc.all_reduce(comm, x, algorithm="ring", async_op=True) for x in xs]
        for h in (hs if comm.rank == 0 else hs[::-1]):
            h.wait()
        y = np.full(1000, 1.0)
        h = mc.all_reduce(comm, y, algorithm="ring", async_op=True)
        if comm.rank == 0:
            h.wait()
        comm.barrier()
        h.wait()
        return [float(x[0]) for x in xs] + [float(y[0])]

    assert mc.LocalWorld(3, timeout=30).run(step) == [[3.0, 6.0, 9.0, 3.0]] * 3


def test_memory_of_an_operation_in_flight_is_refused_to_the_next():
    # Its order against the next one would differ between devices (a blocking call completes
    # first on some): the devices' results diverged silently. The refusal gives the communicator
    # up: a device whose array is None there makes the same call unrefused.
    refused = re.escape("send: written by an operation in flight (its send): wait() on its "
                        "handle first")
    for make in (lambda comm, x, y: mc.all_reduce(comm, x),
                 lambda comm, x, y: mc.all_reduce(comm, x[2:4], async_op=True),
                 lambda comm, x, y: mc.all_gather(comm, x[:2], y[:4])):  # reads x as h writes it
        def refuse(comm):
            x, y = np.full(10, comm.rank + 1.0), np.zeros(10)
            h = mc.all_reduce(comm, x, async_op=True)
            comm.barrier()  # both started h: the refusal gives the communicator up
            with pytest.raises(ValueError, match=refused):
                make(comm, x, y)
            with pytest.raises(mc.CommError, match="an earlier call gave this communicator up"):
                comm.barrier()
            try:
                h.wait()  # it may have completed before the refusal, or failed with it
            except mc.CommError:
                pass
            return True

        assert mc.LocalWorld(2, timeout=30).run(refuse) == [True, True]

    def step(comm):
        x, y = np.full(10, comm.rank + 1.0), np.zeros(10)
        h = mc.all_reduce(comm, x, async_op=True)
        mc.all_reduce(comm, y)  # other memory: runs
        h.wait()
        mc.all_reduce(comm, x)  # once waited: runs
        return float(x[0])

    assert mc.LocalWorld(2, timeout=30).run(step) == [6.0, 6.0]


def test_exception_in_one_device_is_reraised_and_others_do_not_hang():
    def step(comm):
        if comm.rank == 1:
            raise KeyError("device 1 gave up")
        mc.reshard(PLAN, comm, good_src(comm.rank), good_dst(comm.rank))

    with pytest.raises(KeyError, match="device 1 gave up"):
        mc.LocalWorld(2, timeout=30).run(step)


def test_a_device_that_returns_fails_the_waits_on_it_at_once():
    # Device 0 waits in a barrier device 1 never reaches: named at once, not after the timeout;
    # a device that is only late is named after it.
    def leave(comm):
        if comm.rank == 0:
            comm.barrier()

    with pytest.raises(mc.CommError, match="^device 1: returned from its function"):
        mc.LocalWorld(2, timeout=600).run(leave)

    gave_up = threading.Event()  # device 1 comes once device 0 has given up, not after a sleep

    def late(comm):
        if comm.rank == 1:
            gave_up.wait(60)
        try:
            comm.barrier()
        finally:
            if comm.rank == 0:
                gave_up.set()

    with pytest.raises(mc.CommError, match="^device 1: did not reach the barrier"):
        mc.LocalWorld(2, timeout=0.1).run(late)


def test_comm_used_after_run():
    comms = mc.LocalWorld(1).run(lambda comm: comm)
    with pytest.raises(ValueError, match="^comm: its session has ended"):
        comms[0].rank


def test_one_comm_serves_one_call_at_a_time():
    # Two threads of device 0 in a barrier at once would count as two devices: the second is
    # refused, and no barrier passes before device 1 calls one (once the refusal is seen).
    refused = threading.Event()
    called = []

    def fn(comm):
        if comm.rank == 1:
            refused.wait(60)
            called.append(time.monotonic())
            comm.barrier()
            return None
        errors, passed = [], []

        def call():
            try:
                comm.barrier()
                passed.append(time.monotonic())
            except ValueError as e:
                errors.append(str(e))
                refused.set()

        threads = [threading.Thread(target=call) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors, passed

    errors, passed = mc.LocalWorld(2, timeout=10).run(fn)[0]
    assert errors == ["comm: in use by another thread (a communicator serves one call at a time)"]
    assert len(passed) == 1 and passed[0] >= called[0], (passed, called)


def test_a_call_in_flight_on_another_thread_when_run_returns():
    # The session waits for it (it ends, failing) instead of freeing the communicator under it.
    ended = []

    def loop(comm):
        try:
            while True:
                comm.barrier()
        except (ValueError, mc.CommError) as e:
            ended.append(type(e).__name__)

    def fn(comm):
        t = threading.Thread(target=loop, args=(comm,), daemon=True)
        t.start()
        time.sleep(0.05)
        return comm.rank, t

    threads = [t for _, t in mc.LocalWorld(2, timeout=5).run(fn)]
    for t in threads:
        t.join(10)
    assert len(ended) == 2, ended


def test_wrong_comm_and_plan_types():
    def step(comm):
        with pytest.raises(TypeError, match="^comm:"):
            mc.reshard(PLAN, object(), None, None)
        with pytest.raises(TypeError, match="^plan:"):
            mc.reshard("plan", comm, None, None)
        return True

    mc.LocalWorld(1).run(step)


def test_a_scalar_layout_cannot_be_split():
    with pytest.raises(ValueError, match=r"^layout.spec: spec 'S0' for a 0-d tensor: its spec is "
                                         r"empty or R"):
        mc.Layout((), "i64", "2@0-1:S0")
    with pytest.raises(ValueError, match=r"^layout.spec: spec '' has 0 dimensions but the tensor "
                                         r"has 1"):
        mc.Layout((3,), "i64", "2@0-1:")


def test_bad_world_arguments():
    with pytest.raises(ValueError, match="^size"):
        mc.LocalWorld(0)
    with pytest.raises(ValueError, match="^size: .* exceeds the limit"):
        mc.LocalWorld(2**31 - 1)
    with pytest.raises(ValueError, match="^local devices: 2000 exceeds the limit"):
        mc.LocalWorld(2000).run(lambda comm: None)
    with pytest.raises(ValueError, match="^timeout"):
        mc.LocalWorld(2, timeout=-1)


@pytest.mark.parametrize("make, exc, message", [
    (lambda: mc.LocalWorld(2**40), ValueError, "size: 1099511627776 is out of range"),
    (lambda: mc.LocalWorld("2"), TypeError, "size: expected an int, got str"),
    (lambda: mc.Mesh((2,), [2**31, 1]), ValueError, "devices[0]: 2147483648 is out of range"),
    (lambda: mc.Mesh((2,), [0.5, 1]), TypeError, "devices[0]: expected an int, got float"),
    # A row of a 2-D array: numpy's own TypeError named no argument.
    (lambda: mc.Mesh((2,), np.array([[0], [1]])), TypeError,
     "devices[0]: expected an int, got ndarray"),
    (lambda: mc.Layout((2**63,), "u8", "1:R"), ValueError, "shape[0]: 9223372036854775808 is out"),
    (lambda: mc.Layout("8", "f32", "1:R"), TypeError, "shape: expected a sequence of ints, got str"),
    # Text arguments: pybind11's cast of another type raised RuntimeError.
    (lambda: mc.load_model(5), TypeError, "path: expected a path (str or os.PathLike), got int"),
    (lambda: mc.load_model("m.json", 5), TypeError, "system: expected a path"),
    (lambda: mc.load_model("m.json", cast=16), TypeError, "cast: expected a str, got int"),
    # pybind11's casts of a lone surrogate and of a pickled state's wrong item: RuntimeError.
    (lambda: mc.plan_sync([("a\ud800", mc.Layout((4,), "f32", "1@0:R"),
                            mc.Layout((4,), "f32", "1@1:R"))], 0),
     ValueError, "tensors[0][0]: not valid text"),
    (lambda: mc.Layout((4,), "f\udc80", "1:R"), ValueError, "dtype: not valid text"),
    (lambda: mc.plan(SRC, DST, "\udc80"), ValueError, "topology: not valid text"),
    (lambda: mc.LocalWorld(2).run(lambda c: mc.sync(mc.plan_sync(MOVES, c.rank), c, {
        "\udc80": good_src(c.rank)}, {})), ValueError, "src key: not valid text"),
    (lambda: mc.Mesh.__new__(mc.Mesh).__setstate__((5,)), ValueError,
     "Mesh: item 0 of the pickled state has the wrong type"),
    # numpy reads None as float64: a dtype left out is not taken for one.
    (lambda: mc.Layout((4,), None, "1:R"), TypeError, "dtype: None is not a dtype"),
    (lambda: mc.plan_rank(mc.Layout((4,), "f32", "1@0:R"), mc.Layout((4,), "f32", "1@1:R"), -1),
     ValueError, "device: must be >= 0, got -1"),
    # Arguments that pybind11 converted itself (a multi-line list of overloads, naming nothing).
    (lambda: mc.Layout((8,), "f32", "2:S0").local_shape(2**40), ValueError, "device: 1099511627776"),
    (lambda: mc.Layout((8,), "f32", "2:S0").local_box("0"), TypeError, "device: expected an int"),
    (lambda: mc.Layout((8,), "f32", "2:S0").addend(2**40), ValueError, "device: 1099511627776"),
    (lambda: mc.plan_sync(MOVES, 2**40), ValueError, "device: 1099511627776 is out of range"),
    (lambda: mc.plan_sync(MOVES, 0, max_staging_bytes=1.5), TypeError,
     "max_staging_bytes: expected an int, got float"),
    (lambda: mc.plan_sync(MOVES, 0, bucket_bytes=2**70), ValueError, "bucket_bytes: 1180591620717"),
    (lambda: mc.predict_sync(MOVES, fork=1), TypeError, "fork: expected a bool, got int"),
    (lambda: mc.plan_sync(MOVES, 0).index(3), TypeError, "name: expected a str, got int"),
    (lambda: mc.LocalWorld(2, timeout="1"), TypeError, "timeout: expected a number, got str"),
    (lambda: mc.LocalWorld(2, timeout=True), TypeError, "timeout: expected a number, got bool"),
    (lambda: mc.LocalWorld(2).run(5), TypeError, "fn: expected a callable, got int"),
    (lambda: mc.LocalWorld(2).run(len, devices=[2**40]), ValueError, "devices[0]: 1099511627776"),
    (lambda: mc.LocalWorld(2).run(len, devices=1), TypeError, "devices: expected a sequence"),
    (lambda: mc.plan("x", DST), TypeError, "src: expected a meshcast.Layout, got str"),
    (lambda: mc.plan(SRC, None), TypeError, "dst: expected a meshcast.Layout, got NoneType"),
    (lambda: mc.plan_rank(None, DST, 0), TypeError, "src: expected a meshcast.Layout"),
    (lambda: mc.Plan.from_json(5), TypeError, "text: expected a str, got int"),
    (lambda: mc.Plan.from_json("\ud800"), ValueError, "text: not valid text"),
    # A __len__ that is not the number of items: read as iterated, never reserved by it.
    (lambda: mc.Layout(LyingLength(10**12), "f32", "2@0-1:S0R"), ValueError,
     "layout.spec: spec 'S0R' has 2 dimensions but the tensor has 1"),
    (lambda: mc.Mesh((2,), LyingLength(10**12)), ValueError, "mesh: mesh has 2 devices but 1"),
    # The collectives' options, read before anything else (async_op=1 was taken as True, None
    # as False; a name of another type gave the list of overloads).
    (lambda: mc.all_reduce(None, np.zeros(4), async_op=1), TypeError,
     "async_op: expected a bool, got int"),
    (lambda: mc.all_gather(None, np.zeros(1), np.zeros(4), async_op=None), TypeError,
     "async_op: expected a bool, got NoneType"),
    (lambda: mc.broadcast(None, np.zeros(4), 0, async_op=np.float64(1)), TypeError,
     "async_op: expected a bool"),
    (lambda: mc.all_to_all(None, np.zeros(4), np.zeros(4), async_op=0.0), TypeError,
     "async_op: expected a bool"),
    (lambda: mc.LocalWorld(1).run(
        lambda c: mc.reduce_scatter(c, np.zeros(4), np.zeros(4), op=5)), TypeError,
     "op: expected a str, got int"),
    (lambda: mc.LocalWorld(1).run(lambda c: mc.all_reduce(c, np.zeros(4), algorithm=None)),
     TypeError,
     "algorithm: expected a str, got NoneType"),
    (lambda: mc.sparse_all_reduce(None, np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32),
                                  method=None), TypeError, "method: expected a str"),
    (lambda: mc.plan(mc.Layout((4,), "f32", "1@0:R"), mc.Layout((4,), "f32", "1@1:R"),
                     strategy=None), TypeError, "strategy: expected a str, got NoneType"),
    (lambda: mc.plan(mc.Layout((4,), "f32", "1@0:R"), mc.Layout((4,), "f32", "1@1:R"),
                     balance=0), TypeError, "balance: expected a str, got int"),
    (lambda: mc.plan(mc.Layout((4,), "f32", "1@0:R"), mc.Layout((4,), "f32", "1@1:R")).rank(True),
     TypeError, "device: expected an int, got bool"),
    (lambda: mc.plan(mc.Layout((4,), "f32", "1@0:R"), mc.Layout((4,), "f32", "1@1:R")).rank(2**40),
     ValueError, "device: 1099511627776 is out of range"),
    (lambda: mc.plan_rank(mc.Layout((4,), "f32", "1@0:R"), mc.Layout((4,), "f32", "1@1:R"), 1.0),
     TypeError, "device: expected an int, got float"),
    (lambda: mc.Layout((8,), "f32", None), TypeError, "layout: expected a str, got NoneType"),
    (lambda: mc.Mesh(None), TypeError, "text: expected a str, got NoneType"),
    # A path with a NUL: the OS would read the path up to it, another file than the one named.
    (lambda: mc.load_model("m.json\0x"), ValueError, "model: the path holds a NUL byte"),
    (lambda: mc.Topology("dgx-a100\0x"), ValueError, "topology: the name holds a NUL byte"),
    (lambda: mc.Topology(None), TypeError, "name_or_path: expected a path"),
    (lambda: mc.Topology.from_json(None), TypeError, "text: expected a str, got NoneType"),
    (lambda: mc.Topology("dgx-a100").host_of(2**40), ValueError,
     "device: 1099511627776 is out of range"),
    (lambda: mc.Topology("dgx-a100").host_of(True), TypeError, "device: expected an int, got bool"),
    (lambda: mc.Topology("dgx-a100").host_name(-2**63 - 1), ValueError, "host: "),
    (lambda: mc.sync(mc.plan(mc.Layout((4,), "f32", "1@0:R"), mc.Layout((4,), "f32", "1@1:R")),
                     None, {}, {}), TypeError, "plan: expected a meshcast SyncPlan"),
    (lambda: mc.isync(None, None, {}, {}), TypeError, "plan: expected a meshcast SyncPlan"),
])
def test_out_of_range_ints_are_named_in_one_line(make, exc, message):
    # pybind11's own conversion failed with a multi-line list of overloads.
    with pytest.raises(exc) as e:
        make()
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("counts, exc, message", [
    ("abc", TypeError, "send_counts: expected a sequence of ints, got str"),
    ([1.5, 1, 1.5], TypeError, "send_counts[0]: expected an int, got float"),
    ([4, -1, 0], ValueError, "send_counts[1]: -1 is out of range [0, 4]"),
    ([2, 2, 1], ValueError, "send_counts: counts add up to more than 4, send has 4 elements"),
])
def test_all_to_all_counts_are_named(counts, exc, message):
    # pybind11's cast of the list raised RuntimeError ("Unable to cast"), naming nothing.
    def step(comm):
        with pytest.raises(exc) as e:
            mc.all_to_all(comm, np.zeros(4, np.float32), np.zeros(4, np.float32),
                          send_counts=counts)
        assert str(e.value).startswith(message), str(e.value)
        return True

    assert mc.LocalWorld(3).run(step) == [True] * 3


def test_handles_outliving_their_world_raise_instead_of_crashing():
    a = np.ones(64, np.float32)

    def leave_in_flight(comm):
        b = np.empty(64, np.float32)
        return (mc.all_reduce(comm, a, b, async_op=True),
                mc.ireshard(PLAN, comm, good_src(comm.rank), good_dst(comm.rank)))

    try:
        handles = mc.LocalWorld(2, timeout=10).run(leave_in_flight)
    except mc.CommError:  # the other device abandoned first: also fine, and nothing crashed
        handles = []
    for collective, transfer in handles:
        with pytest.raises(ValueError, match="^comm: its session has ended"):
            collective.wait()
        with pytest.raises(ValueError, match="^comm: its session has ended"):
            transfer.test()
    del handles  # no crash on destruction either


def test_a_handle_dropped_on_another_thread_waits_for_the_call_in_flight():
    # The drop uses the communicator, which device 0's thread is using in all_reduce: it is
    # left to that call, which drops it as it returns (the two at once corrupted the heap, and
    # the abandon ended the all-reduce under way).
    def step(comm):
        ones = np.ones(8, np.float32)
        if comm.rank == 1:
            time.sleep(1.0)  # device 0's transfer stays unfinished, and it waits in all_reduce
        box = [mc.ireshard(PLAN, comm, good_src(comm.rank), good_dst(comm.rank))]
        if comm.rank == 0:
            dropper = threading.Timer(0.3, box.clear)  # the last reference, on another thread
            dropper.start()
        try:
            mc.all_reduce(comm, ones)
            if comm.rank == 0:
                dropper.join()
            else:
                box[0].wait()
            return ones.tolist()
        except mc.CommError as e:  # device 1 may learn of the abandon before its last message
            return str(e)

    got = mc.LocalWorld(2, timeout=10).run(step)
    assert got[0] == [2.0] * 8, got  # device 0's all-reduce ended as it should have
    assert got[1] == [2.0] * 8 or got[1].startswith("device 0: dropped a transfer"), got


@pytest.mark.parametrize("use", [
    lambda: mc.Plan.__new__(mc.Plan).json(),
    lambda: mc.Plan.__new__(mc.Plan).stats,
    lambda: 1 in mc.Mesh.__new__(mc.Mesh),
    lambda: mc.Layout.__new__(mc.Layout).dtype,
    lambda: mc.plan(mc.Layout.__new__(mc.Layout), mc.Layout((4,), "f32", "1@1:R")),
    lambda: mc.Topology.__new__(mc.Topology).name,
    lambda: mc.SyncPlan.__new__(mc.SyncPlan).stats,
    lambda: mc.Handle.__new__(mc.Handle).wait(),
    lambda: mc.Comm.__new__(mc.Comm).rank,
    lambda: mc.LocalWorld.__new__(mc.LocalWorld).run(print),
    # A pickle of a Plan with no state: __new__ and nothing else.
    lambda: __import__("pickle").loads(
        b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x12meshcast._meshcast\x94"
        b"\x8c\x04Plan\x94\x93\x94)\x81\x94.").json(),
])
def test_an_instance_never_initialised_is_refused(use):
    # __new__ alone constructs nothing: methods read memory pybind11 allocated and never
    # filled (Plan.json() crashed the interpreter).
    with pytest.raises(TypeError, match="an instance whose __init__ never ran"):
        use()


def test_an_abandoned_handle_is_not_done():
    # Device 0 never starts its part: device 1's reshard cannot finish, and is abandoned when
    # its fn returns. Its handle said done (nothing was left in it) though nothing arrived.
    def step(comm):
        if comm.rank == 0:
            return None
        b = good_dst(comm.rank)
        b[...] = 0
        return mc.ireshard(PLAN, comm, good_src(comm.rank), b), b

    try:
        out = mc.LocalWorld(2, timeout=10).run(step)
    except mc.CommError:  # device 0 returned first and device 1 learnt it: nothing to look at
        return
    h, b = out[1]
    assert not h.done
    assert not b.any()
    with pytest.raises(ValueError, match="^comm: its session has ended"):
        h.wait()


def test_handle_kept_by_a_raising_device():
    def step(comm):
        h = mc.ireshard(PLAN, comm, good_src(comm.rank), good_dst(comm.rank))
        if comm.rank == 1:
            raise RuntimeError("device 1 stops")  # its traceback keeps h alive
        h.wait()

    with pytest.raises((RuntimeError, mc.CommError)):
        mc.LocalWorld(2, timeout=10).run(step)


def test_arrays_of_a_failed_wait_are_not_in_flight():
    # Device 1 returns without its part once device 0 started the move (which needs device 1's
    # rows); device 0's wait fails. Its arrays are its own again: using them tells of the
    # communicator given up, not of "an operation in flight".
    started = threading.Event()

    def step(comm):
        if comm.rank == 1:
            started.wait(30)
            return None
        dst = good_dst(comm.rank)
        h = mc.ireshard(PLAN, comm, good_src(comm.rank), dst)
        started.set()
        with pytest.raises(mc.CommError):
            h.wait()
        with pytest.raises(mc.CommError, match="gave this communicator up"):
            mc.reshard(PLAN, comm, good_src(comm.rank), dst)
        return True

    assert mc.LocalWorld(2, timeout=5).run(step)[0]


def test_aliased_buffers_are_refused():
    same = mc.plan(mc.Layout((8,), "f32", "2@0-1:S0"), mc.Layout((8,), "f32", "2@[1,0]:S0"))
    moves = [("w", same.src, same.dst), ("v", same.src, same.dst)]
    a, b, x = np.arange(4, dtype=np.float32), np.zeros(4, np.float32), np.zeros(16, np.float32)
    each_refusal_gives_up([
        (lambda comm: mc.reshard(same, comm, a, a), ValueError, "^dst: shares memory with src"),
        (lambda comm: mc.all_reduce(comm, x[:8], x[4:12]), ValueError,
         "^recv: shares memory with send"),
        (lambda comm: mc.all_gather(comm, x[1:9], x), ValueError, "shares memory"),
        # sources may share
        (lambda comm: mc.sync(mc.plan_sync(moves, comm.rank), comm, {"w": a, "v": a},
                              {"w": b, "v": b}),
         ValueError, r"^dst\['(v|w)'\]: shares memory with dst"),
    ])

    def step(comm):
        y = np.zeros(16, np.float32)
        mc.all_reduce(comm, y, y)  # exactly in place is fine
        piece = y[comm.rank * 8:(comm.rank + 1) * 8]
        mc.all_gather(comm, piece, y)  # in place: send is this member's piece of recv
        return True

    assert mc.LocalWorld(2).run(step) == [True, True]


def test_negated_torch_view_is_refused():
    torch = pytest.importorskip("torch")

    def step(comm):
        src = torch._neg_view(torch.ones(SRC.local_shape(comm.rank)))
        with pytest.raises(ValueError, match="^src: tensor has its negative bit set"):
            mc.reshard(PLAN, comm, src, good_dst(comm.rank))
        return True

    assert mc.LocalWorld(2).run(step) == [True, True]


def test_run_arguments():
    w = mc.LocalWorld(2)
    with pytest.raises(ValueError, match="^devices: device 1 is named twice"):
        w.run(lambda c: None, devices=[1, 1])

    def nested(comm):
        with pytest.raises(ValueError, match="already running"):
            w.run(lambda c: None)
        return comm.rank

    assert w.run(nested, devices=[1, 0]) == [1, 0]  # in the order of devices


def test_checks_hold_on_every_call_of_a_plan():
    # A Plan keeps each device's tile shapes after its first reshard; a later call with other
    # arrays is still checked against them, and a device outside a mesh still gets its error.
    outside = mc.plan(mc.Layout((4, 6), "f32", "1@0:RR"), mc.Layout((4, 6), "f32", "1@1:RR"))

    def after_a_reshard(call):
        def run(comm):
            mc.reshard(PLAN, comm, good_src(comm.rank), good_dst(comm.rank))
            comm.barrier()  # the refusal gives the communicator up: both reshards done first
            call(comm, comm.rank)
        return run

    x = np.zeros(24, np.float32)
    each_refusal_gives_up([
        (after_a_reshard(lambda c, d: mc.reshard(PLAN, c, good_src(d),
                                                 np.zeros((5, 5), np.float32))),
         ValueError, "^dst: expected shape"),
        (after_a_reshard(lambda c, d: mc.reshard(PLAN, c, x[:12].reshape(SRC.local_shape(d)),
                                                 x[6:18].reshape(DST.local_shape(d)))),
         ValueError, "^src: shares memory with|^dst: shares memory"),
        (after_a_reshard(lambda c, d: mc.reshard(SRC, c, good_src(d), good_dst(d))),
         TypeError, "^plan: expected a meshcast Plan"),
    ])

    def step(comm):
        d = comm.rank
        mine = np.ones((4, 6), np.float32)
        if d == 0:
            mc.reshard(outside, comm, mine, None)
        else:
            out = np.zeros((4, 6), np.float32)
            mc.reshard(outside, comm, None, out)
            assert (out == 1).all()
        comm.barrier()  # each refusal below gives the communicator up: both reshards first
        if d == 0:
            with pytest.raises(ValueError, match="^dst: device 0 holds no tile"):
                mc.reshard(outside, comm, mine, mine.copy())
        else:
            with pytest.raises(ValueError, match="^src: device 1 holds no tile"):
                mc.reshard(outside, comm, out.copy(), out)
        return True

    assert mc.LocalWorld(2).run(step) == [True, True]


def test_ctrl_c_reaches_a_local_world_whose_devices_run_python():
    # Its devices run on threads of their own; Ctrl-C was seen only once every fn returned
    # (never, for one that loops). Now it is raised in each device running Python and here.
    script = (
        "import os, signal, threading, time\n"
        "import meshcast as mc\n"
        "looped = []\n"
        "def fn(comm):\n"
        "    if comm.rank == 1:\n"
        "        end = time.monotonic() + 60\n"
        "        while time.monotonic() < end:\n"
        "            pass\n"
        "        looped.append(True)\n"
        "    comm.barrier()\n"
        "threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "try:\n"
        "    mc.LocalWorld(2, timeout=120).run(fn)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', looped)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "interrupted []", r.stdout + r.stderr


def test_numpy_bools_are_bools():
    # async_op is read by hand (1 and None were taken as bools); numpy's bool still is one.
    def fn(comm):
        x = np.ones(4)
        h = mc.all_reduce(comm, x, async_op=np.bool_(True))
        h.wait()
        mc.all_reduce(comm, x, async_op=np.bool_(False))
        return float(x[0])
    assert mc.LocalWorld(1).run(fn) == [1.0]


def test_device_state_is_refused_by_pickle_at_every_protocol():
    # Below protocol 2 copyreg rebuilt these through a base pybind11 cannot allocate: the
    # interpreter ended (std::terminate), past every except and finally.
    import pickle

    p = mc.plan(mc.Layout((4, 6), "f32", "2@0-1:S0R"), mc.Layout((4, 6), "f32", "2@0-1:RS0"))

    def step(comm):
        handle = mc.all_reduce(comm, np.ones(4, np.float32), async_op=True)
        handle.wait()
        seen = []
        for obj in (comm, comm.group([0, 1]), handle, p.rank(comm.rank),
                    mc.plan_sync([("w", p.src, p.dst)], comm.rank), mc.LocalWorld(1)):
            for dump in [lambda: obj.__reduce__(), lambda: obj.__reduce_ex__()] + [
                    lambda protocol=protocol: pickle.dumps(obj, protocol)
                    for protocol in range(pickle.HIGHEST_PROTOCOL + 1)]:
                try:
                    dump()
                    seen.append("pickled")
                except TypeError as e:
                    seen.append(str(e).split(" object")[0])
        return seen

    for seen in mc.LocalWorld(2).run(step):
        assert sorted(set(seen)) == [f"cannot pickle a meshcast.{name}" for name in (
            "Comm", "Group", "Handle", "LocalWorld", "RankPlan", "SyncPlan")], seen


def test_arguments_pybind11_refuses_are_one_line_everywhere():
    # Every binding, with or without a communicator: pybind11's own message took five lines.
    for call, why in [
        (lambda: mc.plan(mc.Layout((4,), "f32", "2:S0")), "plan: missing a required argument: 'dst'"),
        (lambda: mc.Layout((4,), "f32"), "Layout: missing a required argument: 'layout'"),
        (lambda: mc.Layout((4,), "f32", "2:S0", spec=1),
         "Layout: got an unexpected keyword argument 'spec'"),
        (lambda: mc.Mesh("2", 3, 4), "Mesh: expected (text) or (shape, devices)"),
        (lambda: mc.LocalWorld(), "LocalWorld: missing a required argument: 'size'"),
        (lambda: mc.plan_sync([]), "plan_sync: missing a required argument: 'device'"),
        (lambda: mc.Plan.from_json(), "Plan.from_json: missing a required argument: 'text'"),
        (lambda: mc.from_env("ucx", 1, 2), "from_env: too many positional arguments"),
        (lambda: PLAN.rank(), "Plan.rank: missing a required argument: 'device'"),
        (lambda: PLAN.predict(bogus=1), "Plan.predict: got an unexpected keyword argument 'bogus'"),
        (lambda: PLAN.src.local_shape(0, 1), "Layout.local_shape: too many positional arguments"),
        (lambda: mc.Topology.from_json(), "Topology.from_json: missing a required argument: 'text'"),
        (lambda: mc.plan_sync([("w", PLAN.src, PLAN.dst)], 0).index(),
         "SyncPlan.index: missing a required argument: 'name'"),
    ]:
        with pytest.raises(TypeError) as e:
            call()
        assert str(e.value) == why
    assert mc.Mesh(shape=(2,), devices=[4, 5]) == mc.Mesh("2@4-5")


def test_what_the_user_typed_is_quoted_on_one_line():
    # Control characters become '?', and long text is cut: a 100 KB dtype was echoed whole.
    for call, error in [
        (lambda: mc.Layout((4,), "f3\n2", "1:R"), TypeError),
        (lambda: mc.Layout((4,), "x" * 100000, "1:R"), TypeError),
        (lambda: mc.from_env("u\ncx"), ValueError),
        (lambda: mc.plan_sync([("a\nb", mc.Layout((2,), "f32", "1:R"), mc.Layout((2,), "f32", "1:R")),
                               ("a\nb", mc.Layout((2,), "f32", "1:R"), mc.Layout((2,), "f32", "1:R"))],
                              0), ValueError),
    ]:
        with pytest.raises(error) as e:
            call()
        assert "\n" not in str(e.value) and len(str(e.value)) < 400, str(e.value)[:400]

    def step(comm):
        src = mc.Layout((4,), "f32", "2@0-1:S0")
        p = mc.plan_sync([("w", src, src)], comm.rank)
        seen = []
        for call in (lambda: mc.sync(p, comm, {"w": np.zeros(2, np.float32),
                                               "x\n" * 5000: np.zeros(2)},
                                     {"w": np.zeros(2, np.float32)}),
                     lambda: mc.all_reduce(comm, np.ones(2), op="a\nb"),
                     lambda: mc.all_reduce(comm, np.ones(2), algorithm="a\nb" * 100)):
            with pytest.raises(ValueError) as e:
                call()
            seen.append(str(e.value))
        return seen

    for seen in mc.LocalWorld(2, timeout=30).run(step):
        assert [m.split(" ")[0] for m in seen] == ["src['" + "x?" * 80 + "...']:", "op:",
                                                 "algorithm:"], seen
        assert not any("\n" in m or len(m) > 200 for m in seen), seen


def test_a_saved_plan_keeps_its_topology():
    # Read back without one, a plan made on a cluster was priced and drawn as if on one host.
    import json
    import pickle

    src = mc.Layout((1 << 20,), "f32", "16@0-15:S0")
    p = mc.plan(src, mc.Layout((1 << 20,), "f32", "16@0-15:R"), topology="dgx-a100")
    back = mc.Plan.from_json(p.json())
    assert back.predict() == p.predict() and back.svg() == p.svg()
    assert mc.Plan.from_json(p.json(), topology=mc.Topology("dgx-a100")).predict() == p.predict()
    with pytest.raises(ValueError, match="^topology: the plan was made on 'dgx-a100', not 'h100"):
        mc.Plan.from_json(p.json(), topology="h100-cluster")
    # A topology only its maker has: asked for, not guessed.
    doc = json.loads(p.json())
    doc["topology"] = "their-cluster"
    theirs = mc.Plan.from_json(json.dumps(doc))
    for saved in (theirs, pickle.loads(pickle.dumps(theirs))):
        with pytest.raises(ValueError, match="^topology: the plan names 'their-cluster'"):
            saved.predict()
        with pytest.raises(ValueError, match="^topology: the plan names 'their-cluster'"):
            saved.svg()
        assert saved.predict(topology="dgx-a100") == p.predict()
    one = mc.plan(src, mc.Layout((1 << 20,), "f32", "16@0-15:R"))
    assert mc.Plan.from_json(one.json()).predict() == one.predict()
    assert mc.Plan.from_json(one.json(), topology=mc.Topology.single_host()).svg() == one.svg()


def test_a_saved_plan_finds_its_topology_by_name_only(tmp_path, monkeypatch):
    # A directory of the topology's name where the program runs is no topology (a path lookup
    # took it for one, failed, and said the preset was missing); a file given by path is one.
    src = mc.Layout((64,), "f32", "16@0-15:S0")
    p = mc.plan(src, mc.Layout((64,), "f32", "16@0-15:R"), topology="dgx-a100")
    mine = tmp_path / "mine.json"
    mine.write_text(mc.Topology("dgx-a100").json())
    (tmp_path / "dgx-a100").mkdir()
    monkeypatch.chdir(tmp_path)
    assert mc.Plan.from_json(p.json()).predict() == p.predict()
    assert mc.Plan.from_json(p.json(), topology=mine).predict() == p.predict()
    assert mc.Plan.from_json(p.json(), topology=str(mine)).predict() == p.predict()
