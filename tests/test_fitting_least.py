"""NOTE [The least peak where store-all fits] (solvers/least.py): where store-all fits, "auto"
searches its least peak briefly; below store-all's peak for a quarter of its limit, reporting
no more than the lowest least peak already found for the problem in the process, but searching
from Chen's schedules (tests/test_remembered.py)."""
from __future__ import annotations

import random

import pytest

import solvers
from solvers import least, registry
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
    assert [p[0] for p in programs] == [pytest.approx(12 * registry.AUTO_FITTING_LEAST_SHARE),
                                     pytest.approx(12 / 4)]
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

