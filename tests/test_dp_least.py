"""NOTE [Caps above the least] (solvers/dp.py): the least peak the DP reports is at most the
peak of any schedule it returns, at any budget, and met at that budget."""
from __future__ import annotations

import random

import pytest

import solvers
from tests.problems import autodiff_problem


@pytest.mark.parametrize("seed", [19, 25, 26, 33, 34])  # each reported a least above a plan's
def test_no_schedule_the_dp_returns_is_below_its_least(seed):
    rng = random.Random(seed)
    p = autodiff_problem(rng.randint(20, 60), rng, fan_in=rng.choice((1, 2, 3)))
    top = solvers.solve(p, 2**62, "store_all").peak_bytes
    least = solvers.solve(p, 1, "dp", time_limit_s=5).min_feasible_bytes
    for k in range(11):
        r = solvers.solve(p, least + (top - least) * k // 10, "dp", time_limit_s=5)
        assert r.feasible and r.peak_bytes >= least == r.min_feasible_bytes, k
