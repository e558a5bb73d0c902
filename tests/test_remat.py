"""Rematerializing under the budget (solvers/remat.py): copies dropped and made again as often
as the budget asks, within it by the simulator's count, below what keeping a set and
recomputing it once can reach."""
from __future__ import annotations

import dataclasses
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from solvers import NO_PRODUCER, Op, Problem, Tensor, registry, remat, simulate, solve, variants
from solvers.remat import RematOptions, rematerialize
from solvers.schedule import SolveResult, Status
from tests.problems import autodiff_problem, chain, with_masks


def test_a_chain_goes_below_what_recomputing_once_reaches():
    """On a chain of 30 the least peak is the fixed memory and three activations (the op
    running, its input and the gradient), reached by making earlier copies again and again;
    a kept set recomputed once (eviction, Chen, the lower-set DP) holds many more."""
    p = chain(30)
    least = solve(p, 0, "remat").min_feasible_bytes
    assert least == p.fixed_bytes + 3 * 10
    assert all(solve(p, 0, s).min_feasible_bytes >= least + 60 for s in ("evict", "chen", "dp"))
    r = solve(p, least, "remat")
    sim = simulate(p, r.schedule)
    assert r.feasible and sim.peak_bytes == r.peak_bytes <= least
    assert max(sim.recompute_counts) > 1  # the same op made again more than once


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 24), seed=st.integers(0, 10**6), frac=st.floats(0.0, 1.0),
       masks=st.booleans())
def test_every_pass_is_within_its_budget(n, seed, frac, masks):
    """A pass counts bytes as the simulator does (or more), so what it returns fits; with no
    limit it recomputes nothing."""
    rng = random.Random(seed)
    p = autodiff_problem(n, rng)
    p = with_masks(p, rng) if masks else p
    free = rematerialize(p, math.inf)
    assert simulate(p, free).time_s == p.base_time_s
    store_peak = simulate(p, free).peak_bytes
    budget = int(p.fixed_bytes + frac * (store_peak - p.fixed_bytes))
    for a, b in remat.WEIGHTS:
        for chosen in (frozenset(), variants.lightest(p)):
            schedule = rematerialize(p, budget, a, b, chosen)
            if schedule is not None:
                assert simulate(p, schedule).peak_bytes <= budget


def test_a_pass_gives_up_once_it_is_slower_than_asked():
    p = chain(12)
    budget = solve(p, 0, "remat").min_feasible_bytes
    made = rematerialize(p, budget)
    time_s = simulate(p, made).time_s
    assert time_s > p.base_time_s  # it had to make copies again
    assert rematerialize(p, budget, give_up_s=time_s) is not None
    assert rematerialize(p, budget, give_up_s=time_s - 1e-6) is None


def test_the_least_peak_search_goes_on_where_the_clock_stopped_it():
    """Cut short, the bisection is kept with the problem; the next solve finishes it."""
    p = chain(40)
    first = solve(p, 0, "remat", RematOptions(time_limit_s=1e-9))
    state = p.memo[("remat", remat.WEIGHTS)]
    assert not state.done and "stopped by the clock" in first.note
    second = solve(p, 0, "remat")
    assert state.done and second.min_feasible_bytes < first.min_feasible_bytes
    assert second.min_feasible_bytes == p.fixed_bytes + 3 * 10


def test_auto_finds_a_chain_plan_near_its_floor():
    """Below what recomputing once reaches, auto's plan is rematerialized."""
    p = chain(30)
    least = solve(p, 0, "remat").min_feasible_bytes
    r = solve(p, least + 10, "auto", time_limit_s=5)
    assert r.feasible and r.peak_bytes <= least + 10
    assert r.min_feasible_bytes == least


def test_where_nothing_fits_auto_goes_on_with_the_least_peak_search(monkeypatch):
    """NOTE [The least peak in the time left]: the pass's least-peak search, stopped by the
    clock in auto's heuristics, goes on in the time auto has left where nothing fits, and auto
    reports the pass's least peak."""
    real = remat.remat

    def hurried(problem, budget_bytes, options):
        return real(problem, budget_bytes, dataclasses.replace(options, time_limit_s=1e-9))

    monkeypatch.setitem(registry._REGISTRY, "remat", (hurried, RematOptions))
    p = chain(40)
    r = solve(p, 0, "auto", time_limit_s=5)
    assert not r.feasible
    assert p.memo[("remat", remat.WEIGHTS)].probes > 0  # none in the heuristics' phase
    assert r.min_feasible_bytes == p.fixed_bytes + 3 * 10  # the pass's floor on a chain


def test_fine_windows_refine_a_rematerialized_plan_only_well_ahead():
    """Windows refine the fastest plan that recomputes once, unless a rematerialized plan is
    faster by more than AUTO_REMAT_MARGIN of the step (NOTE [Rematerializing in auto])."""
    p = chain(4)
    step = p.no_recompute_time_s
    margin = registry.AUTO_REMAT_MARGIN * step

    def result(solver, objective_s):
        return SolveResult(solver=solver, status=Status.FEASIBLE, schedule=None,
                           objective_s=objective_s, peak_bytes=1, bound_s=None, gap=None,
                           solve_time_s=0.0, min_feasible_bytes=1)
    once, slower = result("polish", 2 * step), result("evict", 3 * step)
    close, ahead = result("remat", 2 * step - margin / 2), result("remat", 2 * step - 2 * margin)
    assert registry._to_refine(p, [slower, close, once]) is once
    assert registry._to_refine(p, [slower, ahead, once]) is ahead
    assert registry._to_refine(p, [slower, once]) is once
    assert registry._to_refine(p, [close]) is close


def test_a_forward_tensor_the_backward_returns_is_made_again_at_the_end():
    """x (100 B) is returned by the backward; held through it the step peaks at 201 B, made
    again after the last backward op at 101 B. The pass left it unmade: "remat" and "auto"
    raised InvalidScheduleError ("the backward's outputs reads 'x'") at every budget."""
    ops = (Op("f0", False, 0.1, (), (0,)), Op("b0", True, 1.0, (1,), (2,)),
           Op("b1", True, 1.0, (2,), (3,)))
    tensors = (Tensor("x", 100, 0), Tensor("tan", 1, NO_PRODUCER), Tensor("g", 100, 1),
               Tensor("h", 1, 2))
    p = Problem(ops, tensors, 0, forward_outputs=(), backward_outputs=(3, 0))
    for budget in (101, 150, 10**6):
        for name in ("remat", "auto"):
            r = solve(p, budget, name, time_limit_s=5)
            assert r.feasible and simulate(p, r.schedule).peak_bytes == r.peak_bytes <= budget
