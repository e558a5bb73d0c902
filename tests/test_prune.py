"""NOTE [Pruning recomputation] (solvers/prune.py): dropping recomputation a schedule can do
without. No torch."""
from __future__ import annotations

import math
import random

import pytest

from solvers import Schedule, simulate, solve
from solvers.prune import prune
from tests.problems import autodiff_problem, chain


def test_prune_drops_recomputation_nobody_needs():
    """NOTE [Pruning recomputation]: a recomputation run twice in a row is run once after
    pruning; what is left still runs within the budget."""
    p = chain(6)
    budget = 100 + 10 + 3 * 10
    r = solve(p, budget, "milp")
    steps = list(r.schedule.backward)
    k = next(k for k, i in enumerate(steps) if not p.ops[i].is_backward)
    doubled = Schedule(r.schedule.kept, tuple(steps[:k + 1] + steps[k:]), r.schedule.variants)
    assert simulate(p, doubled).time_s > r.objective_s
    pruned = prune(p, doubled, budget, deadline=float("inf"))
    sim = simulate(p, pruned)
    assert sim.peak_bytes <= budget and math.isclose(sim.time_s, r.objective_s)


@pytest.mark.parametrize("seed", range(4))
def test_prune_never_slows_nor_overruns(seed):
    """The memory-centric program's schedule (time no object), pruned at its own peak."""
    from solvers import joint
    from solvers.milp import MilpOptions
    p = autodiff_problem(14, random.Random(seed))
    least, schedule = joint.least_peak(p, MilpOptions(time_limit_s=8))
    before = simulate(p, schedule)
    sim = simulate(p, prune(p, schedule, least, deadline=float("inf")))
    assert sim.peak_bytes <= least and sim.time_s <= before.time_s + 1e-12
