"""NOTE [Pruning recomputation] (solvers/prune.py): dropping recomputation a schedule can do
without. No torch."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest

from solvers import NO_PRODUCER, Op, Problem, Schedule, Tensor, fine, registry, simulate, solve
from solvers.prune import drop_unread, prune
from tests.problems import autodiff_problem, chain


# a budget at which chain(6) must recompute
CHAIN_BUDGET = 100 + 10 + 3 * 10


def _doubled(p: Problem, r) -> Schedule:
    """r's schedule with its first recomputation run twice in a row."""
    steps = list(r.schedule.backward)
    k = next(k for k, i in enumerate(steps) if not p.ops[i].is_backward)
    return Schedule(r.schedule.kept, tuple(steps[:k + 1] + steps[k:]), r.schedule.variants)


def test_prune_drops_recomputation_nobody_needs():
    """NOTE [Pruning recomputation]: a recomputation run twice in a row is run once after
    pruning; what is left still runs within the budget."""
    p, budget = chain(6), CHAIN_BUDGET
    r = solve(p, budget, "milp")
    doubled = _doubled(p, r)
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


def test_unread_recomputation_is_dropped_with_what_only_it_read():
    """NOTE [Unread recomputation]: a recomputed chain whose end nothing reads goes, and so
    does a kept tensor only that chain read; time drops, the peak does not rise, and what is
    left is the schedule without them."""
    # a2 kept, f3 recomputed from it, and f2 -> f3 again after b1: nothing reads a3's copies
    p, plain, padded = _padded_problem()
    assert simulate(p, padded).time_s == simulate(p, plain).time_s + 3.0
    dropped = drop_unread(p, padded)
    assert dropped == plain
    assert simulate(p, dropped).peak_bytes <= simulate(p, padded).peak_bytes
    assert drop_unread(p, dropped) is dropped


def _padded_problem() -> tuple[Problem, Schedule, Schedule]:
    """f0 -> a0 -> f1 -> a1 -> f2 -> a2 -> f3 -> a3; the forward returns a3; b1 reads a0, a1.
    The schedule without recomputation, and one recomputing a3 twice where nothing reads it."""
    p = Problem(ops=(Op("f0", False, 1.0, (), (0,)), Op("f1", False, 1.0, (0,), (1,)),
                     Op("f2", False, 1.0, (1,), (2,)), Op("f3", False, 1.0, (2,), (3,)),
                     Op("b1", True, 1.0, (4, 0, 1), (5,))),
                tensors=(Tensor("a0", 10, 0), Tensor("a1", 10, 1), Tensor("a2", 40, 2),
                         Tensor("a3", 10, 3), Tensor("tangent", 10, NO_PRODUCER),
                         Tensor("g", 10, 4)),
                fixed_bytes=100, forward_outputs=(3,), backward_outputs=(5,))
    return p, Schedule(frozenset({0, 1}), (4,)), Schedule(frozenset({0, 1, 2}), (3, 4, 2, 3))


def test_a_least_peak_pruned_to_the_budget_is_feasible():
    """milp at 103 B answered infeasible with a least peak of 103 B: its least-peak schedule
    peaked at 104 B until unread recomputation was dropped, after the search had said no.
    Asked again at 103 B it said the same. A least-peak schedule pruned to fit the budget is
    now the answer."""
    from solvers import without_unread
    from solvers.schedule import SolveResult, Status
    p, plain, padded = _padded_problem()
    budget = simulate(p, plain).peak_bytes
    assert simulate(p, padded).peak_bytes > budget
    refused = SolveResult("hand", Status.INFEASIBLE, None, None, None, None, None, 0.0,
                          simulate(p, padded).peak_bytes, floor_schedule=padded)
    assert not without_unread(p, refused).feasible  # no budget given: as before
    r = without_unread(p, refused, budget)
    assert r.feasible and r.schedule == plain and r.peak_bytes == r.min_feasible_bytes == budget
    assert "fits the budget" in r.note
    assert not without_unread(p, refused, budget - 1).feasible


@pytest.mark.parametrize("seed", range(4))
def test_every_solver_result_has_no_unread_recomputation(seed):
    """What leaves solvers.solve has nothing drop_unread would drop, at the least peak too."""
    p = autodiff_problem(14, random.Random(seed))
    least = solve(p, 0, "milp", time_limit_s=4).min_feasible_bytes
    for name in ("milp", "dp", "evict", "auto"):
        r = solve(p, least, name, time_limit_s=4)
        for s in (r.schedule, r.floor_schedule):
            if s is not None:
                assert drop_unread(p, s) is s, name


def test_without_unread_says_what_it_dropped():
    """The note names what went: recomputation steps, kept tensors nothing reads, or both,
    and never "0 ... dropped"."""
    from solvers import without_unread
    from solvers.schedule import SolveResult, Status
    p = Problem(ops=(Op("f0", False, 1.0, (), (0,)), Op("f1", False, 1.0, (0,), (1,)),
                     Op("b1", True, 1.0, (2, 0), (3,))),
                tensors=(Tensor("a0", 10, 0), Tensor("a1", 10, 1),
                         Tensor("tangent", 10, NO_PRODUCER), Tensor("g", 10, 2)),
                fixed_bytes=100, forward_outputs=(1,), backward_outputs=(3,))

    def note(schedule):
        sim = simulate(p, schedule)
        r = SolveResult("hand", Status.FEASIBLE, schedule, sim.time_s, sim.peak_bytes,
                        None, None, 0.0, None)
        return without_unread(p, r).note

    assert note(Schedule(frozenset({0, 1}), (2,))) == (
        "1 kept tensors nothing reads dropped (NOTE [Unread recomputation])")
    assert note(Schedule(frozenset({0}), (1, 2))) == (
        "1 unread recomputations dropped (NOTE [Unread recomputation])")
    assert note(Schedule(frozenset({0, 1}), (1, 2))) == (
        "1 unread recomputations and 1 kept tensors nothing reads dropped "
        "(NOTE [Unread recomputation])")


def test_auto_prunes_before_fine_windows(monkeypatch):
    """NOTE [Pruned before windows]: the schedule "auto" hands to fine windows recomputes
    nothing it can do without; windows held a needless recomputation's memory fixed in every
    window."""
    p, budget = chain(6), CHAIN_BUDGET
    r = solve(p, budget, "milp")
    doubled = _doubled(p, r)
    sim = simulate(p, doubled)
    assert sim.peak_bytes <= budget
    slow = dataclasses.replace(r, schedule=doubled, objective_s=sim.time_s,
                               peak_bytes=sim.peak_bytes)
    # the search goes on to windows (a chain's heuristics come close enough: NOTE [Close
    # enough], NOTE [Proven close enough])
    monkeypatch.setattr(registry, "_close_enough", lambda _p, _results: False)
    monkeypatch.setattr(registry, "lazy_cuts", lambda *_a: None)
    monkeypatch.setattr(registry, "_to_refine", lambda _p, _feasible: slow)
    handed = []
    refine = fine.refine
    monkeypatch.setattr(fine, "refine", lambda p_, b, s, *a, **kw: (handed.append(s),
                                                                   refine(p_, b, s, *a, **kw))[1])
    result = solve(p, budget, "auto", time_limit_s=5)
    assert handed, "auto refined a schedule by fine windows"
    assert len(handed[0].backward) < len(doubled.backward)
    assert prune(p, handed[0], budget, deadline=float("inf")) == handed[0]
    assert result.feasible and result.peak_bytes <= budget
