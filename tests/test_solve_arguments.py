"""solvers.solve refuses a budget or time limit that is no number, saying which (a NaN budget
got a schedule from milp and checkmate and a bare TypeError from auto); a problem holding numpy
numbers is written as JSON."""
from __future__ import annotations

import json
import math

import pytest

from solvers import InvalidProblemError, SolverError, solve
from solvers.problem import Problem
from tests.problems import chain


@pytest.mark.parametrize("solver", ["milp", "checkmate", "dp", "store_all", "auto"])
@pytest.mark.parametrize("budget", [math.nan, None, "100", True])
def test_a_budget_that_is_no_number_is_refused(solver, budget):
    with pytest.raises(SolverError, match=f"budget_bytes must be a number of bytes, got "
                                          f"{budget!r}"):
        solve(chain(3), budget, solver, time_limit_s=1)


@pytest.mark.parametrize("limit", [math.nan, 0, -1.0, "5"])
def test_a_time_limit_that_is_no_positive_number_is_refused(limit):
    with pytest.raises(SolverError, match="time_limit_s must be a positive number"):
        solve(chain(3), 10 ** 6, "milp", time_limit_s=limit)


def test_whole_and_real_budgets_still_solve():
    for budget in (10 ** 6, 1e6, math.inf):
        assert solve(chain(3), budget, "auto", time_limit_s=2).feasible


def test_numpy_numbers_are_written_as_json_numbers():
    """The checks take numpy's integers and floats as whole and real; to_json raised
    TypeError on them, so such a problem could be solved but not cached."""
    import dataclasses

    import numpy as np
    p = chain(3)
    q = dataclasses.replace(
        p, fixed_bytes=np.int64(p.fixed_bytes),
        tensors=(dataclasses.replace(p.tensors[0], bytes=np.int32(p.tensors[0].bytes)),)
        + p.tensors[1:],
        ops=(dataclasses.replace(p.ops[0], time_s=np.float64(p.ops[0].time_s)),) + p.ops[1:])
    assert q.to_json() == p.to_json()


@pytest.mark.parametrize("problem", [None, {}, chain(3).to_json()])
def test_a_problem_that_is_no_problem_is_refused(problem):
    """None or a dict failed deep inside (AttributeError 'with_variants'; solver probe)."""
    with pytest.raises(InvalidProblemError, match="problem must be a solvers.Problem"):
        solve(problem, 10 ** 6, "auto", time_limit_s=1)


def test_a_malformed_problem_dict_says_so():
    """A field of the wrong kind or a missing one raised a bare TypeError from Op.__init__."""
    good = json.loads(chain(3).to_json())
    del good["ops"][0]["inputs"]
    with pytest.raises(InvalidProblemError, match="Problem.from_dict: not a problem's fields"):
        Problem.from_dict(good)
