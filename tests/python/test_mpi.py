"""Processes: mpirun with mpi4py, and ranks started the way launchers start them (UCX)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import mpirun

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from free_port import free_port  # noqa: E402


def master_port():
    """A MASTER_PORT whose successor, where meshcast listens, is free (below the ephemeral range)."""
    return str(free_port(pair=True) - 1)
WORKER = os.path.join(HERE, "mpi_worker.py")

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


def env_with_path():
    return {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.mark.parametrize("ranks", [2, 5])
def test_mpi4py(ranks):
    pytest.importorskip("mpi4py")
    r = mpirun(ranks, WORKER, "mpi4py", "40", str(ranks), env=env_with_path())
    assert r.returncode == 0, r.stdout + r.stderr
    # mpirun may join the ranks' lines: count the reports, not the lines.
    assert sorted(re.findall(r"rank (\d+) ok 40", r.stdout)) == [str(k) for k in range(ranks)]


def test_one_rank_failing_ends_the_job():
    pytest.importorskip("mpi4py")
    r = mpirun(2, WORKER, "mpi4py", "2", "3", "fail", env=env_with_path(), timeout=120)
    assert r.returncode != 0
    assert "rank 1 gives up" in r.stderr and "CommError" in r.stderr, r.stderr[-2000:]


def markers(box):
    """Script lines: mark(name) leaves a file in `box`; wait_for(name) waits (60 s at most) for
    one another rank left, so that ranks go in a set order, not by sleeps a busy machine upsets."""
    return (
        "import os, time\n"
        f"box = {str(box)!r}\n"
        "def mark(name):\n"
        "    open(os.path.join(box, name), 'w').close()\n"
        "def wait_for(name):\n"
        "    end = time.monotonic() + 60\n"
        "    while not os.path.exists(os.path.join(box, name)) and time.monotonic() < end:\n"
        "        time.sleep(0.05)\n")


def attach_after(tmp_path, before, timeout):
    """A script whose ranks run `before` (Python lines, r is the rank), then from_mpi4py with
    `timeout`, printing 'rank R attached' or 'rank R after S s: ERROR' (and marking 'failed.R')."""
    script = tmp_path / "attach.py"
    script.write_text(
        "import sys, time\n" + markers(tmp_path) +
        "import meshcast as mc\n"
        "from mpi4py import MPI\n"
        "r = MPI.COMM_WORLD.rank\n" + before +
        "t = time.monotonic()\n"
        "try:\n"
        f"    mc.from_mpi4py(MPI.COMM_WORLD, timeout={timeout})\n"
        "    print(f'rank {r} attached', flush=True)\n"
        "except mc.CommError as e:\n"
        "    print(f'rank {r} after {time.monotonic() - t:.0f} s: {e}', flush=True)\n"
        "    mark(f'failed.{r}')\n")
    return str(script)


@pytest.mark.parametrize("ranks, before, timeout, failing", [
    # Rank 0 exits without calling from_mpi4py: the others' duplicate of the communicator never
    # completes, and their timeout ends it with a CommError instead of a hang.
    (3, "if r == 0:\n    sys.exit(0)\n", 2, (1, 2)),
    # Rank 0 gives up attaching (rank 1 is late) and ends; the duplicate completes for rank 1 as
    # rank 0's MPI finalizes, and rank 1 used to wait for ever in the transport's first blocking
    # collective. Now its attach fails within its timeout as well.
    (2, "if r == 1:\n    wait_for('failed.0')\n", 1.5, (0, 1)),
])
def test_a_rank_that_does_not_attach_in_time_is_waited_for_within_the_timeout(
        tmp_path, ranks, before, timeout, failing):
    pytest.importorskip("mpi4py")
    r = mpirun(ranks, attach_after(tmp_path, before, timeout), env=env_with_path(), timeout=120)
    for k in failing:
        assert re.search(rf"rank {k} after [1-9] s: comm: not every rank of the communicator "
                         rf"attached within {timeout:.3f} s", r.stdout), r.stdout + r.stderr


def test_a_peer_that_comes_after_a_failed_discover_writes_into_nothing_freed(tmp_path):
    # Rank 0's discover times out in its first exchange; rank 1 comes after it failed and sends
    # into it.
    # The receives rank 0 had posted (into memory its unwinding freed) are cancelled first: it
    # used to abort with a corrupted heap ("malloc(): unaligned tcache chunk detected").
    pytest.importorskip("mpi4py")
    script = tmp_path / "late_discover.py"
    script.write_text(
        markers(tmp_path) +
        "import meshcast as mc\n"
        "from mpi4py import MPI\n"
        "comm = mc.from_mpi4py(MPI.COMM_WORLD, timeout=2)\n"
        "if comm.rank == 1:\n"
        "    wait_for('failed.0')\n"
        "try:\n"
        "    mc.Topology.discover(comm)\n"
        "except mc.CommError as e:\n"
        "    print(f'rank {comm.rank} failed: {e}', flush=True)\n"
        "    mark(f'failed.{comm.rank}')\n"
        "junk = [bytearray(64) for _ in range(20000)]\n"
        "MPI.COMM_WORLD.Barrier()\n"
        "junk = [bytearray(64) for _ in range(20000)]\n"
        "print(f'rank {comm.rank} survived', flush=True)\n")
    r = mpirun(2, str(script), env=env_with_path(), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 0 failed: device 1" in r.stdout, r.stdout + r.stderr
    for k in (0, 1):
        assert f"rank {k} survived" in r.stdout, r.stdout + r.stderr


def test_a_call_after_mpi_finalize_is_refused_not_the_job_ended(tmp_path):
    # MPI ends the job at any call made after MPI_Finalize: meshcast asks first and raises, and
    # lets an operation still in flight go without a call (rank 0's, which rank 1 never joins).
    pytest.importorskip("mpi4py")
    script = tmp_path / "finalized.py"
    script.write_text(
        "import gc, numpy as np, meshcast as mc\n"
        "from mpi4py import MPI\n"
        "r = MPI.COMM_WORLD.rank\n"
        "comm = mc.from_mpi4py(MPI.COMM_WORLD, timeout=10)\n"
        "comm.barrier()\n"
        "A, B = mc.Layout((4096,), 'f32', '1@0:R'), mc.Layout((4096,), 'f32', '1@1:R')\n"
        "h = mc.ireshard(mc.plan(A, B), comm, np.ones(4096, np.float32), None) if r == 0 else None\n"
        "MPI.Finalize()\n"
        "calls = [comm.barrier, lambda: mc.from_mpi4py(MPI.COMM_WORLD)] + ([h.wait] if h else [])\n"
        "for call in calls:\n"
        "    try:\n"
        "        call()\n"
        "        print(f'rank {r} returned', flush=True)\n"
        "    except ValueError as e:\n"
        "        print(f'rank {r}: {e}', flush=True)\n"
        "del h\n"
        "gc.collect()\n"
        "print(f'rank {r} ends: {comm!r}', flush=True)\n")
    r = mpirun(2, str(script), env=env_with_path(), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for k, calls in ((0, 3), (1, 2)):
        assert len(re.findall(rf"rank {k}: comm: MPI was finalized", r.stdout)) == calls, r.stdout
        assert f"rank {k} ends: <meshcast.Comm rank {k} of 2, mpi>" in r.stdout, r.stdout


def test_the_device_waited_on_is_named_before_others_that_are_silent(tmp_path):
    # Device 2 waits on device 1, stalled; device 0, in no transfer, answers no liveness check
    # either: the timeout names device 1, device 0 only after it. Both stall until device 2 has
    # failed (a marker file, not a sleep a busy machine outlasts).
    pytest.importorskip("mpi4py")
    script = tmp_path / "stall.py"
    script.write_text(
        "import numpy as np\n" + markers(tmp_path) +
        "import meshcast as mc\n"
        "from mpi4py import MPI\n"
        "c = mc.from_mpi4py(MPI.COMM_WORLD, timeout=2)\n"
        "me = c.rank\n"
        "p = mc.plan(mc.Layout((4,), 'f32', '1@1:R'), mc.Layout((4,), 'f32', '1@2:R'))\n"
        "if me != 2:\n"
        "    wait_for('failed.2')\n"
        "try:\n"
        "    mc.reshard(p, c, np.ones(4, np.float32) if me == 1 else None,\n"
        "               np.zeros(4, np.float32) if me == 2 else None)\n"
        "except mc.CommError as e:\n"
        "    print(f'rank {me} failed: {e}', flush=True)\n"
        "if me == 2:\n"
        "    mark('failed.2')\n")
    r = mpirun(3, str(script), env=env_with_path(), timeout=120)
    # The wait is the timeout or more (a busy machine polls late), to a tenth of a second.
    assert re.search(r"rank 2 failed: device 1: no progress for [\d.]+ s and no answer to a "
                     r"liveness check", r.stdout), r.stdout + r.stderr


@pytest.mark.parametrize("how", ["mpi4py", "env-ucx"])
@pytest.mark.parametrize("case, words", [
    ("short", "sent 4016 bytes where 4020 were expected"),
    # MPI and UCX fail a longer message as truncated ("MPI_ERR_TRUNCATE: message truncated").
    ("long", "sent more than the 4012 bytes expected")])
def test_a_message_of_another_length_than_expected_is_refused(how, case, words):
    if how == "mpi4py":
        pytest.importorskip("mpi4py")
        r = mpirun(2, WORKER, how, "1", "3", case, env=env_with_path(), timeout=120)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
    else:
        port = master_port()
        codes, outs = launch(2, lambda k: {"RANK": str(k), "WORLD_SIZE": "2", "LOCAL_RANK": str(k),
                                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
                             how=how, cases="1", extra=[case])
        out = "".join(o + e for o, e in outs)
        assert codes == [0, 0], out
    assert f"rank 1 failed: device 0: {words}" in out, out


def test_ranks_that_run_different_plans_fail_naming_what_differs():
    pytest.importorskip("mpi4py")
    r = mpirun(2, WORKER, "mpi4py", "1", "3", "disagree", env=env_with_path(), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    # Each case: both ranks fail, one of them (whichever checked first) naming the difference.
    assert "dtype: device 1 reshards i32 where this device reshards f32" in r.stdout or \
        "dtype: device 0 reshards f32 where this device reshards i32" in r.stdout, r.stdout
    assert "src: device 1 has another source layout than this device's 2@0-1:S0R" in r.stdout or \
        "src: device 0 has another source layout than this device's 2@0-1:RS0" in r.stdout, r.stdout
    for k in (0, 1):
        for case in ("dtype", "swapped"):
            assert f"rank {k} {case} failed" in r.stdout, r.stdout


def launch(ranks, variables, how="env-ucx", cases="20", extra=()):
    """Starts `ranks` processes with each one's variables(rank) (as a launcher would)."""
    procs = []
    for k in range(ranks):
        env = dict(os.environ, **env_with_path(), **variables(k))
        for v in [v for v in env if v.startswith(("OMPI_", "PMIX_", "MESHCAST_"))]:
            if v not in variables(k):
                del env[v]
        procs.append(subprocess.Popen([sys.executable, WORKER, how, cases, "7", *extra], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    return [p.returncode for p in procs], outs


def test_torchrun_variables():
    port = master_port()
    codes, outs = launch(3, lambda k: {"RANK": str(k), "WORLD_SIZE": "3", "LOCAL_RANK": str(k),
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
    assert codes == [0, 0, 0], outs
    assert [o[0].strip() for o in outs] == [f"rank {k} ok 20" for k in range(3)]


def test_slurm_variables_with_rendezvous():
    port = master_port()
    codes, outs = launch(2, lambda k: {"SLURM_PROCID": str(k), "SLURM_NTASKS": "2",
                                       "SLURM_LOCALID": str(k), "SLURM_JOB_ID": "4242",
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
    assert codes == [0, 0], outs


def test_missing_variable_is_named():
    codes, outs = launch(1, lambda k: {"RANK": "0", "WORLD_SIZE": "2",
                                       "MASTER_ADDR": "127.0.0.1"}, cases="1")
    assert codes == [1]
    err = outs[0][1].strip().splitlines()[-1]
    assert "MASTER_PORT" in err and err.startswith("meshcast._meshcast.ValidationError"), err


def test_a_rank_that_ends_is_not_taken_for_one_in_a_barrier():
    # Its session's closing barrier is not the program's: the others' barrier fails, naming it.
    port = master_port()
    # The barrier's timeout is short; the rendezvous is not (a busy machine started rank 0's
    # Python more than 3 s after rank 2's).
    codes, outs = launch(3, lambda k: {"RANK": str(k), "WORLD_SIZE": "3", "LOCAL_RANK": str(k),
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                                       "WORKER_TIMEOUT": "3", "MESHCAST_RENDEZVOUS_TIMEOUT": "60"},
                         cases="1", extra=["leave"])
    assert codes[0] == 3 and codes[2] == 3, outs
    for k in (0, 2):
        assert f"rank {k} barrier failed: device 1" in outs[k][0], outs[k]


def test_a_rank_whose_call_was_refused_is_named_by_its_peer(tmp_path):
    # Rank 1's reshard is refused before it starts and it goes on to a barrier: the refusal gave
    # its communicator up, so rank 0 fails naming it, and rank 1's barrier fails too.
    port = master_port()
    # Both wait long: rank 0 is to fail on rank 1's notice, not on its own timeout. Rank 0 starts
    # its rendezvous once rank 1 connects (a busy machine started rank 1's Python late).
    ready = str(tmp_path / "ready.1")
    codes, outs = launch(2, lambda k: {"RANK": str(k), "WORLD_SIZE": "2", "LOCAL_RANK": str(k),
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                                       "WORKER_TIMEOUT": "30",
                                       ("WORKER_AFTER" if k == 0 else "WORKER_READY"): ready},
                         cases="1", extra=["refuse"])
    assert codes == [3, 3], outs
    assert "rank 1 refused: dst: expected shape (4,)" in outs[1][0], outs[1]
    assert "an earlier call gave this communicator up" in outs[1][0], outs[1]
    assert re.search(r"rank 0 failed: device 1: failed: dst: expected shape \(4,\)", outs[0][0]), outs[0]


def test_mpirun_without_a_rendezvous_names_master_addr():
    codes, outs = launch(1, lambda k: {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                                       "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, cases="1")
    assert codes == [1]
    err = outs[0][1].strip().splitlines()[-1]
    assert "ValidationError: MASTER_ADDR: not set: openmpi: rank 0 of 2" in err, err


def test_the_rendezvous_waits_for_the_timeout_given():
    codes, outs = launch(1, lambda k: {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                       "MASTER_PORT": master_port(), "WORKER_TIMEOUT": "2"},
                         cases="1")
    assert codes == [1]
    err = outs[0][1].strip().splitlines()[-1]
    assert "within 2 s" in err, err


def rank_head(timeout):
    """The start of a rank's script, `how` (mpi4py or env) given: say(), comm and me."""
    return (
        # A line in one write: mpirun passes on each rank's writes as they come, and print()'s
        # pieces from two ranks interleaved ('rank 1:rank 0 dropped it').
        "say = lambda line: (sys.stdout.write(line + '\\n'), sys.stdout.flush())\n"
        "if how == 'mpi4py':\n"
        "    from mpi4py import MPI\n"
        f"    comm = mc.from_mpi4py(MPI.COMM_WORLD, timeout={timeout})\n"
        "else:\n"
        f"    comm = mc.from_env(timeout={timeout})\n"
        "me = comm.rank\n")


DROP = (
    "import sys, numpy as np, meshcast as mc\n"
    "how, action = sys.argv[1], sys.argv[2]\n" + rank_head(20) +
    "A = mc.Layout((65536, 8), 'f32', '2@0-1:S0R')\n"
    "B = mc.Layout((65536, 8), 'f32', '2@0-1:RS0')\n"
    "a = np.ones(A.local_shape(me), np.float32)\n"
    "b = np.zeros(B.local_shape(me), np.float32)\n"
    "def start():\n"
    "    if action == 'sync':\n"
    "        return mc.isync(mc.plan_sync([('w', A, B)], me), comm, {'w': a}, {'w': b})\n"
    "    return mc.ireshard(mc.plan(A, B), comm, a, b)\n"
    "if me == 0:\n"
    "    h = start()\n"
    "    if action == 'raise':\n"
    "        raise RuntimeError('left in flight')\n"
    "    del h\n"
    "    del a, b\n"
    "    say('rank 0 dropped it')\n"
    "else:\n"
    "    try:\n"
    # Started after rank 0 gave up (a busy machine), it fails at its start: rank 0's notice.
    "        start().wait()\n"
    "        say(f'rank 1 done {bool((b == 1).all())}')\n"
    "    except mc.CommError as e:\n"
    "        say(f'rank 1: {e}')\n")


def check_dropped(codes, outs, action):
    rank0 = 1 if action == "raise" else 0  # its traceback, not a signal
    assert codes == [rank0, 0], outs
    assert action == "raise" or "rank 0 dropped it" in outs[0], outs
    assert re.search(r"rank 1 done True|rank 1: device 0: (dropped a transfer|an operation in "
                     r"flight was left unfinished)", outs[1]), outs


@pytest.mark.parametrize("action", ["del", "raise", "sync"])
def test_a_transfer_dropped_in_flight_leaves_no_send_behind_on_mpi(tmp_path, action):
    # MPI cannot cancel a send the peer matched: the drop waits for it to end, so that neither
    # side's MPI still reads or writes the arrays once they are freed (it did, in MPI_Finalize:
    # signal 11 on either rank).
    pytest.importorskip("mpi4py")
    script = tmp_path / "drop.py"
    script.write_text(DROP)
    r = mpirun(2, str(script), "mpi4py", action, env=env_with_path(), timeout=120)
    outs = ["\n".join(line for line in r.stdout.splitlines() if f"rank {k}" in line)
            for k in (0, 1)]
    # mpirun reports the first rank that failed; a signal is named there.
    assert "signal" not in r.stderr, r.stderr
    check_dropped([r.returncode, 0], [o + r.stderr for o in outs], action)


@pytest.mark.parametrize("action", ["del", "sync"])
def test_a_transfer_dropped_in_flight_leaves_no_send_behind_on_ucx(tmp_path, action):
    # UCX packs a strided send from its region as it goes: a cancelled send the peer matched
    # kept calling back into a freed region (signal 11 in the drop itself).
    script = tmp_path / "drop.py"
    script.write_text(DROP)
    codes, outs = ucx_ranks(2, script, "env", action)
    check_dropped(codes, outs, action)


def ucx_ranks(ranks, script, *args):
    """Runs `script` with `args` as `ranks` processes of a meshcast rendezvous (from_env, ucx):
    their exit codes, and each one's stdout and stderr together."""
    port = str(free_port())
    procs = []
    for k in range(ranks):
        env = dict(os.environ, **env_with_path(), MESHCAST_RENDEZVOUS=f"127.0.0.1:{port}",
                   MESHCAST_SIZE=str(ranks), MESHCAST_RANK=str(k), MESHCAST_LAUNCHER="meshcast")
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    return [p.returncode for p in procs], [o[0] + o[1] for o in outs]


REFUSE = (
    "import os, sys, time, numpy as np, meshcast as mc\n"
    "how, box = sys.argv[1], sys.argv[2]\n" + rank_head(20) +
    # Steps apart by files, not by the communicator (whose barrier would hear the notice itself):
    # every device's step is over before any starts the next.
    "def all_done(step):\n"
    "    open(os.path.join(box, f'{step}.{me}'), 'w').close()\n"
    "    end = time.monotonic() + 60\n"
    "    while time.monotonic() < end and not all(\n"
    "            os.path.exists(os.path.join(box, f'{step}.{k}')) for k in range(4)):\n"
    "        time.sleep(0.02)\n"
    "    time.sleep(0.5)  # the notice, sent before the refusal returned, is in\n"
    # 64 floats: small enough that MPI and UCX complete the senders' sends at once.
    "A, B = mc.Layout((64,), 'f32', '2@0-1:S0'), mc.Layout((64,), 'f32', '2@2-3:R')\n"
    "s = mc.plan_sync([('w', A, B)], me)\n"
    "for step in range(3):\n"
    "    a = {'w': np.ones(A.local_shape(me), np.float32)} if me in A.mesh else {}\n"
    "    shape = (3,) if me == 2 and step == 0 else B.local_shape(me)\n"
    "    b = {'w': np.zeros(shape, np.float32)} if me in B.mesh else {}\n"
    "    try:\n"
    "        mc.sync(s, comm, a, b)\n"
    "        say(f'rank {me} step {step} ok')\n"
    "    except (mc.CommError, ValueError) as e:\n"
    "        say(f'rank {me} step {step} {type(e).__name__}: {e}')\n"
    "    all_done(step)\n")


@pytest.mark.parametrize("how", ["mpi4py", "env"])
def test_a_refusal_reaches_the_peers_whose_sends_completed_at_once(tmp_path, how):
    # Device 2 refuses step 0's destination. The senders' small sends complete eagerly, so that
    # step 0 may end well for them; each later step of every device fails naming device 2 (they
    # went on for ever, step after step, beside a peer that had given the communicator up).
    script = tmp_path / "refuse.py"
    script.write_text(REFUSE)
    if how == "mpi4py":
        pytest.importorskip("mpi4py")
        r = mpirun(4, str(script), how, str(tmp_path), env=env_with_path(), timeout=120)
        out = r.stdout + r.stderr
    else:
        _, outs = ucx_ranks(4, script, how, str(tmp_path))
        out = "".join(outs)
    assert "rank 2 step 0 ValueError: dst['w']: expected shape (64,)" in out, out
    for k in range(4):
        for step in (1, 2):
            assert re.search(rf"rank {k} step {step} CommError: device 2: failed: dst\['w'\]",
                             out), out


INTERRUPT = (
    "import os, signal, sys, threading, time, numpy as np, meshcast as mc\n"
    "how, op, box = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "def mark(name):\n"
    "    open(os.path.join(box, name), 'w').close()\n"
    "def await_mark(name):\n"
    "    end = time.monotonic() + 30\n"
    "    while not os.path.exists(os.path.join(box, name)) and time.monotonic() < end:\n"
    "        time.sleep(0.05)\n" + rank_head(60) +
    "A, B = mc.Layout((1024,), 'f32', '1@0:R'), mc.Layout((1024,), 'f32', '1@1:R')\n"
    "a, b = np.full(1024, 1 + 6 * me, np.float32), np.zeros(1024, np.float32)\n"
    "def call():\n"
    "    if op == 'reshard':\n"
    "        mc.reshard(mc.plan(A, B), comm, a if me == 0 else None, b if me == 1 else None)\n"
    "    elif op == 'barrier':\n"
    "        comm.barrier()\n"
    "    else:\n"
    "        mc.all_reduce(comm, a)\n"
    "if me == 0:\n"
    # Ctrl-C half a second into a call that waits on rank 1, which comes only after it.
    "    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
    "    t = time.monotonic()\n"
    "    try:\n"
    "        call()\n"
    "        say('rank 0 was not interrupted')\n"
    "    except KeyboardInterrupt:\n"
    "        say(f'rank 0 KeyboardInterrupt after {time.monotonic() - t:.1f} s')\n"
    "    fresh = [np.zeros(1024, np.float32) for _ in range(20)]\n"
    "    mark('interrupted')\n"
    "    if how == 'mpi4py':\n"
    "        await_mark('told')  # alive while rank 1 reads the notice (mpirun ends the job)\n"
    # Rank 1's 7s, sent once rank 0 gave up, reach none of rank 0's memory as its MPI moves on
    # (the barrier): its requests were cancelled before the call returned (a collective left
    # them posted on scratch it freed, and a fresh array got the 7s).
    "        MPI.COMM_WORLD.Barrier()\n"
    "    say(f'rank 0 memory kept: {bool((a == 1).all()) and not any((f != 0).any() for f in fresh)}')\n"
    "else:\n"
    "    await_mark('interrupted')\n"
    "    try:\n"
    "        call()  # may pass: rank 0 posted its part before the signal\n"
    "        call()\n"
    "        say('rank 1 done')\n"
    "    except mc.CommError as e:\n"
    "        say(f'rank 1: {e}')\n"
    "    t = time.monotonic()\n"
    "    try:\n"
    "        call()\n"
    "        say('rank 1 called again')\n"
    "    except mc.CommError as e:\n"
    "        say(f'rank 1 again after {time.monotonic() - t:.1f} s: {e}')\n"
    "    mark('told')\n"
    "    if how == 'mpi4py':\n"
    "        MPI.COMM_WORLD.Barrier()\n")


@pytest.mark.parametrize("how,op", [("mpi4py", "reshard"), ("mpi4py", "all_reduce"),
                                    ("env", "barrier")])
def test_ctrl_c_ends_a_blocking_call_at_once(tmp_path, how, op):
    # A call on a process communicator blocks with the GIL released; Python runs a signal's
    # handler only once it returns. Its waits check for signals every 50 ms: Ctrl-C raises
    # KeyboardInterrupt within moments, not once the peer arrives (here: never, until then) or
    # the timeout (60 s) passes, and the peer ends with an error naming the device. (Giving up
    # a transfer takes up to 2 s: the peers are told, and a send MPI cannot cancel is waited
    # for.)
    script = tmp_path / "interrupt.py"
    script.write_text(INTERRUPT)
    if how == "mpi4py":
        pytest.importorskip("mpi4py")
        r = mpirun(2, str(script), how, op, str(tmp_path), env=env_with_path(), timeout=120)
        outs = [r.stdout + r.stderr] * 2
        assert r.returncode == 0, outs[0]
    else:
        port = str(free_port())
        procs = []
        for k in range(2):
            env = dict(os.environ, **env_with_path(), MESHCAST_RENDEZVOUS=f"127.0.0.1:{port}",
                       MESHCAST_SIZE="2", MESHCAST_RANK=str(k), MESHCAST_LAUNCHER="meshcast")
            procs.append(subprocess.Popen([sys.executable, str(script), how, op, str(tmp_path)],
                                          env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = ["".join(p.communicate(timeout=120)) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
    assert "rank 0 memory kept: True" in outs[0], outs[0]
    m = re.search(r"rank 0 KeyboardInterrupt after ([0-9.]+) s", outs[0])
    assert m and float(m.group(1)) < 10, outs[0]
    # UCX moves a notice only while the sender progresses: rank 0 ended, which rank 1 sees.
    assert re.search(r"rank 1: device 0: (interrupted by a signal \(its Python handler raised\)|"
                     r"failed: its process \(pid \d+\) ended)", outs[1]), outs[1]
    # The communicator was given up: a later call on it fails at once, not after its timeout.
    m = re.search(r"rank 1 again after ([0-9.]+) s: device 0: .*\(an earlier call gave this "
                  r"communicator up\)", outs[1])
    assert m and float(m.group(1)) < 10, outs[1]
