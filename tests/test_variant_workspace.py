"""NOTE [A variant's workspace below its op's] (solvers/variant_checks.py): a variant's extra
workspace may be negative (its run needs less scratch than its op), down to what leaves its op
none. Every solver's schedule then simulates within its budget, and the least peak from sizes
and the boundary bound stay below every schedule. No torch."""
from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from solvers import (NO_PRODUCER, InvalidProblemError, Op, Problem, Tensor, Variant,
                     schedule_from_kept, simulate, solve)
from solvers.bound import boundary_bound
from solvers.lazy_cuts import lazy_cuts
from solvers.peak_bound import least_peak_bound
from solvers.variants import useless
from tests.problems import autodiff_problem, with_masks

SOLVERS = ("auto", "milp", "dp", "evict", "remat", "chen", "checkmate")


def _other(extra: int = -80, first: int | None = None, *more: Variant) -> Problem:
    """f0 -> a0 (10), f1(a0) -> a1 (10, the output); b1(tangent, a0) -> g1 (10) with 100 B of
    workspace (its first run's `first`); b0(g1) -> g0 (10, returned); fixed 100. Variant
    "other" runs b1 otherwise, reading a0 itself, no faster, with `extra` B more workspace."""
    tensors = (Tensor("a0", 10, 0), Tensor("a1", 10, 1), Tensor("tangent", 10, NO_PRODUCER),
               Tensor("g1", 10, 2), Tensor("g0", 10, 3))
    ops = (Op("f0", False, 1.0, (), (0,)), Op("f1", False, 1.0, (0,), (1,)),
           Op("b1", True, 2.0, (2, 0), (3,), workspace_bytes=100, first_workspace_bytes=first),
           Op("b0", True, 2.0, (3,), (4,)))
    return Problem(ops, tensors, fixed_bytes=100, forward_outputs=(1,), backward_outputs=(4,),
                   variants=(Variant("other", 2, 0, (0,), (), 0.1, extra), *more))


def test_a_variant_needing_less_lowers_the_peak_and_every_bound_sees_it():
    p = _other()
    # store-all at b1: fixed 100 + a0, tangent, g1 (30) + 100 B of workspace; "other": 20 B
    plain = simulate(p, schedule_from_kept(p, frozenset({0})))
    other = simulate(p, schedule_from_kept(p, frozenset({0}), frozenset({0})))
    assert (plain.peak_bytes, other.peak_bytes) == (230, 150)
    assert p.with_variants({0}).ops[2].workspace_bytes == 20
    assert least_peak_bound(p).bytes <= 150  # the op at the least workspace it runs with
    for solver in ("milp", "auto"):
        r = solve(p, 150, solver, time_limit_s=2)
        assert r.feasible and r.schedule.variants == {0} and r.peak_bytes == 150, solver
        assert not solve(p, 149, solver, time_limit_s=2).feasible
    bound = boundary_bound(p, 150, time_limit_s=2)
    assert bound is not None and bound <= solve(p, 150, "milp").objective_s + 1e-9
    assert boundary_bound(p, 149, time_limit_s=2) == math.inf
    cuts = lazy_cuts(p, 150, 2.0)
    assert cuts.feasible and simulate(p, cuts.schedule).peak_bytes <= 150
    # no faster and reading the tensor itself, it pays in memory alone: offered
    assert useless(p) == frozenset() and useless(_other(0)) == {0}


def test_down_to_none_of_the_ops_workspace():
    assert _other(-100).with_variants({0}).ops[2].workspace_bytes == 0
    with pytest.raises(InvalidProblemError, match="negative workspace"):
        _other(-101)
    for bad in (-1.5, float("nan"), -(1 << 61), True):
        with pytest.raises(InvalidProblemError, match="extra workspace"):
            _other(bad)
    # a first run's workspace follows the op's down (its forward run's: NOTE [A first run's
    # workspace]); the plain problem stays valid
    assert _other(-80, 100).with_variants({0}).ops[2].first_workspace_bytes == 20
    p = _other(-100)
    assert Problem.from_json(p.to_json()) == p


def test_variants_of_two_inputs_of_one_op_may_not_take_off_more_than_it_has():
    # b1 also reads a1, which a second group of its variants replaces: each takes off 60 B
    base = _other(-60)
    ops = base.ops[:2] + (replace(base.ops[2], inputs=(2, 0, 1)),) + base.ops[3:]
    twin = Variant("twin", 2, 1, (1,), (), 0.0, -60)
    with pytest.raises(InvalidProblemError, match="may take off 120 B"):
        replace(base, ops=ops, variants=base.variants + (twin,))
    p = replace(base, ops=ops, variants=(replace(base.variants[0], extra_workspace_bytes=-50),
                                         replace(twin, extra_workspace_bytes=-50)))
    assert p.least_workspaces[2] == 0 and p.with_variants({0, 1}).ops[2].workspace_bytes == 0
    # exclusive variants of one group: only the most one of them takes off counts
    p = _other(-70, None, Variant("again", 2, 0, (0,), (), 0.0, -20))
    assert p.least_workspaces[2] == 30


def _random(seed: int) -> Problem:
    """A random step with mask variants and other implementations of backward ops (reading
    what the op reads), whose backward ops hold up to 80 B of workspace and whose variants add
    up to 20 B or take off up to the op's share for each of its groups."""
    rng = random.Random(seed)
    p = with_masks(autodiff_problem(rng.randint(4, 16), rng, fixed=rng.randint(0, 300),
                                    name=f"neg{seed}"), rng)
    ops = [replace(op, workspace_bytes=rng.randint(0, 80)) if op.is_backward else op
           for op in p.ops]
    fwd = set(p.forward_tensors)
    others = [Variant(f"other{b}.{x}", b, x, (x,), (), rng.uniform(-0.1, 0.3))
              for b in p.backward_ops for x in p.ops[b].inputs
              if x in fwd and rng.random() < 0.4]
    variants = p.variants + tuple(others)
    groups: dict[int, set[int]] = {}
    for var in variants:
        groups.setdefault(var.op, set()).add(var.replaces)
    variants = tuple(replace(var, extra_workspace_bytes=rng.randint(
        -(ops[var.op].workspace_bytes // len(groups[var.op])), 20)) for var in variants)
    return replace(p, ops=tuple(ops), variants=variants)


@pytest.mark.parametrize("seed", range(10))
def test_every_solvers_schedule_is_within_its_budget_and_above_the_bounds(seed):
    p = _random(seed)
    assert any(v.extra_workspace_bytes < 0 for v in p.variants)
    bound = least_peak_bound(p).bytes
    rng = random.Random(seed)
    forward = list(p.forward_tensors)
    for _ in range(8):  # schedules keeping anything, with any variants
        chosen: dict[tuple[int, int], int] = {}
        for v, var in enumerate(p.variants):
            if rng.random() < 0.6:
                chosen.setdefault(var.group, v)
        kept = frozenset(rng.sample(forward, rng.randint(0, len(forward))))
        plain = p.with_variants(frozenset(chosen.values()))
        schedule = replace(schedule_from_kept(plain, kept), variants=frozenset(chosen.values()))
        assert simulate(p, schedule).peak_bytes >= bound
    store_all = solve(p, 10**12, "store_all").peak_bytes
    least = solve(p, p.fixed_bytes, "auto", time_limit_s=2).min_feasible_bytes
    assert bound <= least
    for budget in (least, (least + store_all) // 2):
        times = []
        for solver in SOLVERS:
            r = solve(p, budget, solver, time_limit_s=2)
            assert r.min_feasible_bytes is None or r.min_feasible_bytes >= bound, solver
            if not r.feasible:
                continue
            sim = simulate(p, r.schedule)
            assert sim.peak_bytes == r.peak_bytes <= budget, (solver, budget)
            assert sim.peak_bytes >= bound and abs(sim.time_s - r.objective_s) < 1e-9
            assert r.bound_s is None or r.bound_s <= r.objective_s + 1e-9, (solver, budget)
            times.append(r.objective_s)
        assert times, budget  # auto's least peak fits at least
        proven = boundary_bound(p, budget, time_limit_s=2)
        assert proven is None or proven <= min(times) + 1e-9


def test_the_simulator_runs_a_chosen_variant_at_its_workspace():
    p = _random(0)
    v = min(range(len(p.variants)), key=lambda k: p.variants[k].extra_workspace_bytes)
    var = p.variants[v]
    zero = replace(p, variants=tuple(replace(w, extra_workspace_bytes=0) if k == v else w
                                     for k, w in enumerate(p.variants)))
    schedule = schedule_from_kept(p, p.with_variants({v}).saved_for_backward, frozenset({v}))
    sim = simulate(p, schedule)
    step = sim.steps.index(var.op)
    diffs = [a - b for a, b in zip(sim.live_bytes, simulate(zero, schedule).live_bytes)]
    assert var.extra_workspace_bytes < 0
    assert diffs == [var.extra_workspace_bytes if k == step else 0 for k in range(len(diffs))]
