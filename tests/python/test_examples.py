"""The examples/ scripts run under mpirun as their docstrings say, and find no wrong element."""
import os
import shutil

import pytest

from conftest import ROOT, mpirun

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


def test_redistribute_grid():
    pytest.importorskip("mpi4py")
    r = mpirun(4, os.path.join(ROOT, "examples", "redistribute_grid.py"), "301", "257")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 wrong elements" in r.stdout


def test_torch_state_dict():
    pytest.importorskip("mpi4py")
    pytest.importorskip("torch")
    r = mpirun(8, os.path.join(ROOT, "examples", "torch_state_dict.py"), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 wrong elements" in r.stdout
