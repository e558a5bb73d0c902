"""NOTE [HiGHS in a child process] and NOTE [HiGHS prints regardless] (solvers/highs.py).
No torch."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from solvers import SolverError
from solvers import highs
from solvers.mip import solve_mip
from solvers.milp import Program
from solvers.stages import Stages
from tests.problems import chain

pytest.importorskip("highspy")


def _mip(n: int = 6, budget: int = 10**9):
    return Program(Stages(chain(n)), budget).mip


def test_child_process_solves_like_this_one(monkeypatch):
    program = Program(Stages(chain(10)), 100 + 10 + 4 * 10)
    here = highs._highs_here(program.mip, 10.0, None, 1e-9)
    monkeypatch.setattr(highs, "CHILD_MIN_VARS", 0)
    child = solve_mip(program.mip, "highs", 10.0, None, 1e-9)
    assert child.status == here.status == "optimal"
    assert child.objective == pytest.approx(here.objective, rel=1e-12)
    assert program.schedule(child.values) == program.schedule(here.values)


def _stalling(mip, time_limit_s, start, rel_gap, relax=False, improved=None, seed=0):
    """A backend that finds one solution, then never returns (as HiGHS in root separation)."""
    improved([1.0] * mip.num_vars, 7.0, 5.0)
    time.sleep(60)


def test_a_stalled_child_is_killed_and_its_last_solution_kept(monkeypatch):
    mip = _mip()
    monkeypatch.setattr(highs, "CHILD_MIN_VARS", 0)
    monkeypatch.setattr(highs, "_highs_here", _stalling)
    start = time.monotonic()
    res = solve_mip(mip, "highs", 0.5)
    assert time.monotonic() - start < 0.5 + highs.CHILD_GRACE_S + 2.0
    assert (res.status, res.objective, res.bound) == ("feasible", 7.0, 5.0)
    assert res.values == [1.0] * mip.num_vars


def test_a_failing_child_is_reported(monkeypatch):
    def failing(*args, **kwargs):
        raise ValueError("no licence for this")
    monkeypatch.setattr(highs, "CHILD_MIN_VARS", 0)
    monkeypatch.setattr(highs, "_highs_here", failing)
    with pytest.raises(SolverError, match="ValueError: no licence for this"):
        solve_mip(_mip(4), "highs", 5.0)


QUIET_SCRIPT = """
import ctypes
from solvers.highs import _stdout_silenced
print("before", flush=True)
with _stdout_silenced():
    ctypes.CDLL(None).printf(b"HighsMipSolverData::transformNewIntegerFeasibleSolution\\n")
    print("from python")
print("after")
"""


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_what_highs_prints_itself_reaches_no_one(unbuffered):
    """NOTE [HiGHS prints regardless]: a C printf into a piped (fully buffered) stdout while
    HiGHS runs never comes out, not even when the buffer is flushed later; what Python printed
    before and after does."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    out = subprocess.run([sys.executable, "-c", QUIET_SCRIPT], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parent.parent, env=env).stdout
    assert out == "before\nafter\n"
