"""NOTE [HiGHS in a child process], NOTE [A portfolio of seeds] and NOTE [HiGHS prints
regardless] (solvers/highs.py). No torch."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from solvers import SolverError
from solvers import highs
from solvers.mip import MipResult, solve_mip
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


def test_every_seed_solves_like_this_process(monkeypatch):
    """Three children with seeds 0-2 on a program they close: its optimum, as here."""
    program = Program(Stages(chain(10)), 100 + 10 + 4 * 10)
    here = highs._highs_here(program.mip, 10.0, None, 1e-9)
    monkeypatch.setattr(highs, "CHILD_MIN_VARS", 0)
    monkeypatch.setattr(highs, "seeds", lambda: 3)
    child = solve_mip(program.mip, "highs", 10.0, None, 1e-9)
    assert child.status == "optimal"
    assert child.objective == pytest.approx(here.objective, rel=1e-12)


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


def _by_seed(mip, time_limit_s, start, rel_gap, relax=False, improved=None, seed=0):
    """Seed 0 ends at its limit with 9 (bound 3); seed 1 finds 6, then ends with 7 (bound 4),
    as if its last report were worse; seed 2 sends 8 (bound 5) and stalls."""
    n = mip.num_vars
    if seed == 0:
        return MipResult("feasible", [0.0] * n, 9.0, 3.0)
    if seed == 1:
        improved([1.0] * n, 6.0, 2.0)
        return MipResult("feasible", [2.0] * n, 7.0, 4.0)
    improved([3.0] * n, 8.0, 5.0)
    time.sleep(60)


def test_the_portfolio_keeps_the_best_solution_and_the_best_bound(monkeypatch):
    mip = _mip()
    monkeypatch.setattr(highs, "CHILD_MIN_VARS", 0)
    monkeypatch.setattr(highs, "_highs_here", _by_seed)
    monkeypatch.setattr(highs, "seeds", lambda: 3)
    start = time.monotonic()
    res = solve_mip(mip, "highs", 0.5)
    assert time.monotonic() - start < 0.5 + highs.CHILD_GRACE_S + 2.0  # seed 2 killed
    assert (res.status, res.objective, res.bound) == ("feasible", 6.0, 5.0)
    assert res.values == [1.0] * mip.num_vars


@pytest.mark.parametrize("proved", ["optimal", "infeasible"])
def test_a_proof_ends_the_portfolio(monkeypatch, proved):
    def backend(mip, time_limit_s, start, rel_gap, relax=False, improved=None, seed=0):
        if seed != 1:
            improved([0.0] * mip.num_vars, 9.0, 1.0)
            time.sleep(60)
        if proved == "optimal":
            return MipResult("optimal", [1.0] * mip.num_vars, 8.0, 8.0)
        return MipResult("infeasible", None, None, None)
    monkeypatch.setattr(highs, "CHILD_MIN_VARS", 0)
    monkeypatch.setattr(highs, "_highs_here", backend)
    monkeypatch.setattr(highs, "seeds", lambda: 3)
    start = time.monotonic()
    res = solve_mip(_mip(), "highs", 30.0)
    assert time.monotonic() - start < 10.0  # not the others' 30 s
    if proved == "optimal":
        assert (res.status, res.objective, res.bound) == ("optimal", 8.0, 8.0)
    else:
        assert (res.status, res.values) == ("infeasible", None)


def test_the_relaxation_runs_once(monkeypatch):
    def backend(mip, time_limit_s, start, rel_gap, relax=False, improved=None, seed=0):
        return MipResult("feasible", [float(seed)] * mip.num_vars, -float(seed), None)
    monkeypatch.setattr(highs, "CHILD_MIN_VARS", 0)
    monkeypatch.setattr(highs, "_highs_here", backend)
    monkeypatch.setattr(highs, "seeds", lambda: 3)
    mip = _mip()
    assert solve_mip(mip, "highs", 5.0).objective == -2.0  # seeds 0-2, the best
    assert highs.solve(mip, 5.0, None, 0.0, relax=True).objective == 0.0  # seed 0 alone


@pytest.mark.parametrize("cores, ranks, seeds", [
    (1, None, 1), (2, None, 1), (7, None, 1), (8, None, 2), (16, None, 4), (64, None, 4),
    (16, "2", 2), (16, "8", 1), (64, "4", 4), (16, "", 4)])
def test_one_seed_per_four_cores_at_most_four(monkeypatch, cores, ranks, seeds):
    """Shared among the processes torchrun started on the machine (LOCAL_WORLD_SIZE)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    if ranks is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
    assert highs.seeds() == seeds


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
