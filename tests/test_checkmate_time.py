"""Checkmate's baseline within its time limit: building its program counts (on DenseNet-121 it
took 30 s of a 30 s limit, then the solve ran on to 110 s). No torch."""
from __future__ import annotations

import random
import time

import pytest

from solvers import Status, simulate, solve
from solvers.checkmate_program import CheckmateProgram, OutOfTime
from tests.problems import autodiff_problem, chain, diamonds


@pytest.mark.parametrize("problem", [chain(8), diamonds(2), autodiff_problem(9, random.Random(3))],
                         ids=lambda p: p.name)
def test_a_program_rebudgeted_is_the_program_built_at_that_budget(problem):
    low = solve(problem, 10**12, "milp").min_feasible_bytes
    high = solve(problem, 10**12, "store_all").peak_bytes
    for budget in (problem.fixed_bytes - 1, low - 1, low, high):
        built = CheckmateProgram(problem, budget)
        moved = CheckmateProgram(problem, high if budget != high else low)
        moved.rebudget(budget)
        assert moved.mip.rows == built.mip.rows
        assert moved.mip.trivially_infeasible == built.mip.trivially_infeasible
    assert CheckmateProgram(problem, problem.fixed_bytes - 1).mip.trivially_infeasible


def test_a_program_not_built_by_its_deadline_says_so():
    with pytest.raises(OutOfTime, match="not built within the time limit"):
        CheckmateProgram(chain(4), 10**6, deadline=time.perf_counter() - 1.0)


def test_a_slow_build_keeps_the_solve_to_its_limit(monkeypatch):
    """Each backward stage built in 50 ms: chain(60)'s 60 stages would take 3 s for the
    least-peak program and 3 s more at the budget; the limit is 2 s. At a budget store-all
    meets, its schedule is the answer, on time; below it there is none, and the solve times
    out on time."""
    problem = chain(60)
    slow = CheckmateProgram._correctness_rows

    def correctness_rows(self, q):
        time.sleep(0.05)
        slow(self, q)

    monkeypatch.setattr(CheckmateProgram, "_correctness_rows", correctness_rows)
    store_all = solve(problem, 10**12, "store_all")
    roomy = solve(problem, store_all.peak_bytes, "checkmate", time_limit_s=2.0)
    assert roomy.status is Status.FEASIBLE and roomy.solve_time_s < 2.5
    assert roomy.objective_s == store_all.objective_s
    assert simulate(problem, roomy.schedule).peak_bytes <= store_all.peak_bytes
    assert "not built within the time limit" in roomy.note
    tight = solve(problem, store_all.peak_bytes - 1, "checkmate", time_limit_s=2.0)
    assert tight.status is Status.TIMEOUT and tight.solve_time_s < 2.5
