"""NOTE [The least peak where store-all fits] (solvers/least.py): where store-all fits, "auto"
searches its least peak briefly; below store-all's peak for a quarter of its limit, reporting
no more than the lowest least peak already found for the problem in the process, but searching
from Chen's schedules."""
from __future__ import annotations

import random

import pytest

import solvers
from solvers import least, registry
from solvers.milp import MilpOptions
from tests.problems import autodiff_problem


@pytest.fixture
def programs(monkeypatch):
    """The (least_time_limit_s, least_start, (peak, schedule)) of each least-peak program run
    in the process."""
    least.cache_clear()
    seen = []
    solve = least._solve

    def spy(problem, options):
        found = solve(problem, options)
        seen.append((options.least_time_limit_s, options.least_start, found))
        return found

    monkeypatch.setattr(least, "_solve", spy)
    yield seen
    least.cache_clear()


def test_a_fitting_budget_searches_the_least_peak_briefly(programs):
    problem = autodiff_problem(30, random.Random(3))
    store_all = solvers.solve(problem, 10**12, "store_all").peak_bytes
    fits = solvers.solve(problem, store_all, "auto", time_limit_s=12)
    assert fits.solver == "auto:store_all"
    assert [p[0] for p in programs] == [pytest.approx(12 * registry.AUTO_FITTING_LEAST_SHARE)]
    tight = solvers.solve(problem, store_all - 1, "auto", time_limit_s=12)
    assert [p[0] for p in programs] == [pytest.approx(0.4), pytest.approx(3.0)]
    assert tight.min_feasible_bytes <= fits.min_feasible_bytes


def test_a_later_program_is_given_the_lowest_least_peak_found(programs):
    """Without a profile directory (nothing `known`), the longer program is given the
    schedule the brief one ended at, so the least peak it reports is no higher and the budget
    the brief one named is met."""
    problem = autodiff_problem(30, random.Random(4))
    first = solvers.solve(problem, 10**12, "auto", time_limit_s=12)
    at = solvers.solve(problem, first.min_feasible_bytes, "auto", time_limit_s=12)
    assert len(programs) == 2 and programs[0][1] is None
    assert programs[1][1] == programs[0][2][1]  # the brief program's schedule
    assert at.feasible and at.min_feasible_bytes <= first.min_feasible_bytes


def test_the_program_searches_from_chens_schedules_not_the_known_one(monkeypatch):
    """A known schedule below Chen's least peak is reported where the program finds nothing
    lower, but the program is warm-started from Chen's (from a brief search's schedule it
    stayed there: 324.9 MiB on a ResNet-50 where from Chen's it reached 293.9 MiB)."""
    for seed in range(20):
        problem = autodiff_problem(20, random.Random(seed))
        chen = solvers.solve(problem, 10**12, "chen").min_feasible_bytes
        found = solvers.solve(problem, 10**12, "milp", time_limit_s=5)
        if found.floor_schedule is not None and found.min_feasible_bytes < chen:
            break
    else:
        pytest.fail("no random DAG where the MILP's least peak is below Chen's")
    warm = []
    monkeypatch.setattr(least, "solve_program",
                        lambda program, options, start: warm.append(start) or (None, None))
    least.cache_clear()
    started = MilpOptions(time_limit_s=1.0, least_start=found.floor_schedule)
    assert least.least_peak(problem, started) == (found.min_feasible_bytes, found.floor_schedule)
    assert warm and all(solvers.simulate(problem, w).peak_bytes == chen for w in warm)
