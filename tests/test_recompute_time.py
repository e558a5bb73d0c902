"""Op.recompute_time_s: a forward op's runs in the backward priced apart from its first run
(NOTE [BatchNorm recomputed from its statistics] in monet_opt/bn_split.py). No torch."""
from __future__ import annotations

import dataclasses
import random

import pytest

from solvers import NO_PRODUCER, Op, Problem, Schedule, Status, Tensor, simulate, solve
from tests.problems import autodiff_problem, chain, diamonds
from tests.test_solvers import SOLVERS, check_result


def test_recomputation_costs_its_own_time():
    """Op.recompute_time_s prices a forward op's runs in the backward, not its first run."""
    p = Problem(ops=(Op("f0", False, 1.0, (), (0,), recompute_time_s=0.25),
                     Op("f1", False, 1.0, (0,), (1,)),
                     Op("b1", True, 2.0, (2, 0), (3,)), Op("b0", True, 2.0, (3,), (4,))),
                tensors=(Tensor("a0", 10, 0), Tensor("a1", 10, 1), Tensor("t", 10, NO_PRODUCER),
                         Tensor("g", 10, 2), Tensor("gin", 10, 3)),
                fixed_bytes=100, forward_outputs=(1,), backward_outputs=(4,))
    assert simulate(p, Schedule(frozenset({0}), (2, 3))).time_s == 6.0
    assert simulate(p, Schedule(frozenset(), (0, 2, 3))).time_s == 6.25
    assert Problem.from_json(p.to_json()) == p


def _cheap_reruns(p: Problem, share: float) -> Problem:
    ops = tuple(dataclasses.replace(op, recompute_time_s=share * op.time_s)
                if not op.is_backward and k % 2 else op for k, op in enumerate(p.ops))
    return dataclasses.replace(p, ops=ops, name=f"{p.name}-cheap")


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("problem", [chain(8), diamonds(2), autodiff_problem(
    12, random.Random(41), name="dag12")], ids=lambda p: getattr(p, "name", p))
def test_every_solver_prices_recomputation_at_its_own_time(solver, problem):
    """With cheaper recomputations, every solver's objective is the simulator's, and the
    MILP's optimum is never above the plain problem's."""
    cheap = _cheap_reruns(problem, 0.25)
    least = solve(cheap, 10**12, "auto").min_feasible_bytes
    budget = least + (solve(cheap, 10**12, "store_all").peak_bytes - least) // 3
    check_result(cheap, budget, solver)
    if solver == "milp":
        plain, fast = solve(problem, budget, "milp"), solve(cheap, budget, "milp")
        if plain.status is Status.OPTIMAL and fast.status is Status.OPTIMAL:
            assert fast.objective_s <= plain.objective_s + 1e-9
