"""Annealing kept sets (NOTE [Annealing kept sets] in solvers/anneal.py)."""
from __future__ import annotations

import random
import time

from solvers import SolveResult, Status, registry, schedule_from_kept, simulate, solve
from solvers.anneal import anneal
from solvers.evict import _drop_and_refill, _judge_into, _put_back
from tests.problems import autodiff_problem, chain


def _stuck(seed: int, from_evicted: bool = True):
    """A problem, a budget between its least and store-all peaks, and the kept set polishing
    ends at there from eviction's (or from none): put back greedily until nothing more fits,
    then dropped and refilled."""
    p = autodiff_problem(14, random.Random(seed))
    store = simulate(p, schedule_from_kept(p, p.saved_for_backward)).peak_bytes
    least = solve(p, 10**12, "evict").min_feasible_bytes
    budget = least + (store - least) // 3
    judge = _judge_into(p, frozenset(), [])
    kept = solve(p, budget, "evict").schedule.kept if from_evicted else frozenset()
    while (more := _put_back(p, kept, budget, judge, float("inf"))) != kept:
        kept = more
    return p, budget, _drop_and_refill(p, kept, budget, judge, float("inf"))


def test_annealing_leaves_the_local_optimum_drop_and_refill_ends_at():
    p, budget, kept = _stuck(0, from_evicted=False)
    local = simulate(p, schedule_from_kept(p, kept))
    optimum = solve(p, budget, "milp")
    assert optimum.status == "optimal" and optimum.objective_s < local.time_s - 1e-9
    schedule, sim = anneal(p, budget, [schedule_from_kept(p, kept)], float("inf"), moves=2000)
    assert sim == simulate(p, schedule) and sim.peak_bytes <= budget
    assert abs(sim.time_s - optimum.objective_s) < 1e-9


def test_annealing_never_returns_a_schedule_over_the_budget_or_slower_than_its_start():
    for seed in range(1, 6):
        p, budget, kept = _stuck(seed)
        start = simulate(p, schedule_from_kept(p, kept))
        schedule, sim = anneal(p, budget, [schedule_from_kept(p, kept)], float("inf"),
                               seed=seed, moves=300)
        assert simulate(p, schedule).peak_bytes <= budget
        assert sim.time_s <= start.time_s


def test_annealing_is_repeatable_for_a_seed_and_a_number_of_moves():
    p, budget, kept = _stuck(0)
    runs = [anneal(p, budget, [schedule_from_kept(p, kept)], float("inf"), seed=3, moves=200)
            for _ in range(2)]
    assert runs[0][0] == runs[1][0]


def test_annealing_starts_from_the_fastest_start_that_fits_and_none_if_none_does():
    p = chain(8)
    least = solve(p, 10**9, "evict").min_feasible_bytes
    store_all = schedule_from_kept(p, p.saved_for_backward)
    assert anneal(p, least - 1, [store_all], float("inf"), moves=50) is None
    none_kept = schedule_from_kept(p, frozenset())
    budget = simulate(p, store_all).peak_bytes
    schedule, sim = anneal(p, budget, [none_kept, store_all], float("inf"), moves=0)
    assert schedule == store_all and sim.time_s == simulate(p, store_all).time_s


def test_auto_takes_annealing_s_schedule_where_it_is_faster():
    """auto's annealing step (registry._annealed), given polishing's local optimum, returns a
    faster schedule (the optimum, here) and says where it came from."""
    p, budget, kept = _stuck(0, from_evicted=False)
    optimum = solve(p, budget, "milp").objective_s
    local = schedule_from_kept(p, kept)
    sim = simulate(p, local)
    given = SolveResult(solver="polish", status=Status.FEASIBLE, schedule=local,
                        objective_s=sim.time_s, peak_bytes=sim.peak_bytes, bound_s=None,
                        gap=None, solve_time_s=0.0, min_feasible_bytes=None)
    r = registry._annealed(p, budget, [given], time.perf_counter() + 3.0)
    assert r.solver == "anneal" and "Annealing kept sets" in r.note
    assert simulate(p, r.schedule).peak_bytes <= budget
    assert abs(r.objective_s - optimum) < 1e-9 < sim.time_s - optimum
