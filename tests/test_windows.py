"""NOTE [Windows of stages] (solvers/windows.py) and NOTE [HiGHS in a child process]
(solvers/mip.py). No torch."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from solvers import SolverError, simulate, solve
from solvers import mip as mip_module
from solvers import windows
from solvers.milp import MilpOptions, Program
from solvers.stages import Stages
from tests.problems import autodiff_problem, chain


def _program(problem, budget):
    return Program(Stages(problem), budget)


def test_child_process_solves_like_this_one(monkeypatch):
    p = chain(10)
    program = _program(p, 100 + 10 + 4 * 10)
    here = mip_module._highs_here(program.mip, 10.0, None, 1e-9)
    monkeypatch.setattr(mip_module, "CHILD_MIN_VARS", 0)
    child = mip_module.solve_mip(program.mip, "highs", 10.0, None, 1e-9)
    assert child.status == here.status == "optimal"
    assert child.objective == pytest.approx(here.objective, rel=1e-12)
    assert program.schedule(child.values) == program.schedule(here.values)


def _stalling(mip, time_limit_s, start, rel_gap, relax=False, improved=None):
    """A backend that finds one solution, then never returns (as HiGHS in root separation)."""
    improved([1.0] * mip.num_vars, 7.0, 5.0)
    time.sleep(60)


def test_a_stalled_child_is_killed_and_its_last_solution_kept(monkeypatch):
    program = _program(chain(6), 10**9)
    monkeypatch.setattr(mip_module, "CHILD_MIN_VARS", 0)
    monkeypatch.setattr(mip_module, "_highs_here", _stalling)
    start = time.monotonic()
    res = mip_module.solve_mip(program.mip, "highs", 0.5)
    assert time.monotonic() - start < 0.5 + mip_module.CHILD_GRACE_S + 2.0
    assert (res.status, res.objective, res.bound) == ("feasible", 7.0, 5.0)
    assert res.values == [1.0] * program.mip.num_vars


def test_a_failing_child_is_reported(monkeypatch):
    def failing(*args, **kwargs):
        raise ValueError("no licence for this")
    monkeypatch.setattr(mip_module, "CHILD_MIN_VARS", 0)
    monkeypatch.setattr(mip_module, "_highs_here", failing)
    with pytest.raises(SolverError, match="ValueError: no licence for this"):
        mip_module.solve_mip(_program(chain(4), 10**9).mip, "highs", 5.0)


QUIET_SCRIPT = """
import ctypes
from solvers.mip import _stdout_silenced
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


@pytest.mark.parametrize("seed", range(3))
def test_windows_make_a_schedule_faster_within_the_budget(monkeypatch, seed):
    """From Chen's schedule, windows of two or three stages (the rest fixed) reach a faster
    one that still fits, and never beat the whole program's optimum."""
    monkeypatch.setattr(windows, "MAX_FREE_BINARIES", 12)
    p = autodiff_problem(16, random.Random(seed))
    floor = solve(p, 10**12, "chen_sqrt").min_feasible_bytes
    budget = floor + (solve(p, 10**12, "store_all").peak_bytes - floor) // 4
    start = solve(p, budget, "chen_sqrt").schedule
    program = _program(p, budget)
    assert program.start_values(start) is not None
    refined = windows.refine(program, start, MilpOptions(), time.perf_counter() + 60)
    sim = simulate(p, refined.schedule)
    exact = solve(p, budget, "milp", MilpOptions(rel_gap=1e-9))
    assert refined.windows >= len(windows._windows(program)) > 1
    assert sim.peak_bytes <= budget and sim.time_s == pytest.approx(refined.time_s)
    assert exact.objective_s - 1e-9 <= refined.time_s < simulate(p, start).time_s


@pytest.mark.parametrize("seed", range(3))
def test_windows_lower_the_least_peak(monkeypatch, seed):
    """In the least-peak program a window minimizes the peak with the rest fixed: from Chen's
    least-peak schedule, a lower one that the simulator confirms."""
    monkeypatch.setattr(windows, "MAX_FREE_BINARIES", 12)
    p = autodiff_problem(16, random.Random(seed))
    floor = solve(p, 10**12, "chen_sqrt").min_feasible_bytes
    start = solve(p, floor, "chen_sqrt").schedule
    program = Program(Stages(p), None)
    refined = windows.refine(program, start, MilpOptions(), time.perf_counter() + 60)
    assert simulate(p, refined.schedule).peak_bytes == refined.peak_bytes < floor
