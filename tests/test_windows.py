"""NOTE [Windows of stages] (solvers/windows.py). No torch."""
from __future__ import annotations

import random
import time

import pytest

from solvers import simulate, solve, windows
from solvers.milp import MilpOptions, Program
from solvers.stages import Stages
from tests.problems import autodiff_problem


def _program(problem, budget):
    return Program(Stages(problem), budget)


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
