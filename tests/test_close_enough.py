"""NOTE [Close enough]: once a heuristic's schedule is within AUTO_CLOSE_ENOUGH of the step
that recomputes nothing, "auto" searches no further (no MILP, polishing, annealing or fine
windows) and still reports the least peak."""
from __future__ import annotations

import dataclasses
import time

from solvers import Status, registry, simulate, solve
from tests.problems import chain


def _chain_with_a_cheap_op(cheap_s: float):
    """A chain whose 11th forward op costs `cheap_s` (the others 1.0): recomputing it is what
    a budget one activation under store-all's peak asks for."""
    p = chain(40)
    ops = list(p.ops)
    ops[10] = dataclasses.replace(ops[10], time_s=cheap_s)
    p = dataclasses.replace(p, ops=tuple(ops))
    return p, solve(p, 10 ** 9, "store_all").peak_bytes - p.tensors[10].bytes


def _solvers_called(monkeypatch) -> list[str]:
    called = []
    for name, (fn, options) in list(registry._REGISTRY.items()):
        def recorded(problem, budget, o, fn=fn, name=name):
            called.append(name)
            return fn(problem, budget, o)
        monkeypatch.setitem(registry._REGISTRY, name, (recorded, options))
    return called


def test_auto_takes_a_heuristic_within_reach_of_no_recomputation(monkeypatch):
    p, budget = _chain_with_a_cheap_op(0.001)
    called = _solvers_called(monkeypatch)
    start = time.perf_counter()
    r = solve(p, budget, "auto", time_limit_s=60)
    assert time.perf_counter() - start < 30  # well under the limit it no longer spends
    assert r.feasible and r.peak_bytes <= budget
    assert r.objective_s <= p.no_recompute_time_s * (1 + registry.AUTO_CLOSE_ENOUGH)
    assert r.objective_s > p.no_recompute_time_s  # store-all does not fit
    assert "milp" not in called
    sim = simulate(p, r.schedule)
    assert (sim.peak_bytes, sim.time_s) == (r.peak_bytes, r.objective_s)
    # the least peak is still the least-peak program's, as when it searches
    assert r.min_feasible_bytes == solve(p, budget, "milp").min_feasible_bytes


def test_auto_searches_on_when_the_heuristic_is_dearer(monkeypatch):
    p, budget = _chain_with_a_cheap_op(0.9)  # recomputing it costs 0.75 % of the step
    assert 0.9 > p.no_recompute_time_s * registry.AUTO_CLOSE_ENOUGH
    # without the cut program's rounds, which prove it the least (the test below)
    monkeypatch.setattr(registry, "AUTO_CUTS_SHARE", 0.0)
    monkeypatch.setattr(registry, "AUTO_FLOOR_CUTS_SHARE", 0.0)
    called = _solvers_called(monkeypatch)
    r = solve(p, budget, "auto", time_limit_s=4)
    assert r.feasible and r.peak_bytes <= budget
    assert "milp" in called


def test_auto_stops_where_the_rounds_prove_their_schedule_close(monkeypatch):
    """NOTE [Proven close enough] (solvers/lazy_cuts.py): the same chain, where the cheapest
    recomputation is dearer than close enough to store-all: the cut program's rounds find it
    and prove nothing is faster, so auto stops without the MILP, its gap that proof's."""
    p, budget = _chain_with_a_cheap_op(0.9)
    called = _solvers_called(monkeypatch)
    start = time.perf_counter()
    r = solve(p, budget, "auto", time_limit_s=30)
    assert time.perf_counter() - start < 15
    assert r.feasible and r.peak_bytes <= budget and "milp" not in called
    assert r.objective_s - r.bound_s <= registry.AUTO_CLOSE_ENOUGH * p.no_recompute_time_s
    assert r.gap is not None and r.gap <= registry.AUTO_CLOSE_ENOUGH
    exact = solve(p, budget, "checkmate")
    assert exact.status == Status.OPTIMAL and r.bound_s <= exact.objective_s * (1 + 1e-6)
