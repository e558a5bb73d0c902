"""NOTE [A first run's workspace] (solvers/simulate.py): an op's forward run may hold less than
its recomputations (a random CPU op's replay holds the generator state it puts back). The
simulator prices each run at its own; every solver prices both at the recomputation's, an
upper bound, so its schedules stay within their budget by the simulator."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from solvers import InvalidProblemError, Op, Problem, Schedule, Tensor, Variant, simulate, solve
from solvers.peak_bound import least_peak_bound
from tests.problems import autodiff_problem

SOLVERS = ("auto", "milp", "dp", "evict", "remat", "chen", "checkmate")


def _chain(first: int | None) -> Problem:
    """a = f(); b = drop(a) (workspace 100, its first run's `first`); g = bwd(b)."""
    tensors = (Tensor("a", 10, 0), Tensor("b", 10, 1), Tensor("g", 10, 2))
    ops = (Op("f", False, 1.0, (), (0,)),
           Op("drop", False, 1.0, (0,), (1,), workspace_bytes=100, is_random=True,
              first_workspace_bytes=first),
           Op("bwd", True, 1.0, (1,), (2,)))
    return Problem(ops=ops, tensors=tensors, fixed_bytes=0, backward_outputs=(2,))


def test_the_forward_run_is_priced_at_its_own_workspace_and_a_recomputation_at_its_op():
    kept = Schedule(kept=frozenset({1}), backward=(2,))
    again = Schedule(kept=frozenset({0}), backward=(1, 2))
    for first, forward_peak in ((None, 120), (30, 50)):
        p = _chain(first)
        assert simulate(p, kept).live_bytes[1] == forward_peak
        sim = simulate(p, again)
        assert sim.live_bytes[1] == forward_peak and sim.live_bytes[2] == 120
    assert least_peak_bound(_chain(30)).bytes <= 50  # a lower bound: the first run's


def test_a_first_run_holding_more_than_the_op_is_refused():
    with pytest.raises(InvalidProblemError, match="first run's workspace"):
        _chain(101)
    assert Problem.from_json(_chain(30).to_json()) == _chain(30)
    assert Problem.from_json(_chain(None).to_json()) == _chain(None)


def _replayed(captured: int, state: int = 0) -> Problem:
    """_chain(30) with `drop`'s first run holding `captured` where it copies its state, and
    a variant of `bwd` drawing `b` again from that state (an encode op making nothing)."""
    tensors = (Tensor("a", 10, 0), Tensor("b", 10, 1), Tensor("drawn", 0, 2), Tensor("g", 10, 3))
    ops = (Op("f", False, 1.0, (), (0,)),
           Op("drop", False, 1.0, (0,), (1,), workspace_bytes=100, is_random=True,
              first_workspace_bytes=30, captured_workspace_bytes=captured, state_bytes=state),
           Op("enc", False, 0.0, (), (2,)),
           Op("bwd", True, 1.0, (1,), (3,)))
    return Problem(ops=ops, tensors=tensors, fixed_bytes=state, backward_outputs=(3,),
                   variants=(Variant("replay", 3, 1, reads=(2,), encode_ops=(2,),
                                     replays=True),))


def test_a_first_run_is_priced_with_its_capture_only_where_the_state_is_kept():
    """NOTE [The capture's copy] (monet_opt/recompute.py): the forward run copies a random
    op's generator state first only where the schedule recomputes it or replays it; the
    solvers price every forward run with the copy, and the bound from sizes without."""
    p = _replayed(80)
    kept = Schedule(kept=frozenset({1}), backward=(3,))
    again = Schedule(kept=frozenset({0}), backward=(1, 3))
    replay = Schedule(kept=frozenset({2}), backward=(3,), variants=frozenset({0}))
    assert simulate(p, kept).live_bytes[1] == 50  # a, b and the 30 B run
    assert simulate(p, again).live_bytes[1] == 100  # a, b and the 80 B run with the copy
    assert simulate(p, replay).live_bytes[1] == 100
    assert p.ops[1].first_extra_bytes == 80 and least_peak_bound(p).bytes <= 50
    assert Problem.from_json(p.to_json()) == p
    with pytest.raises(InvalidProblemError, match="first run's workspace"):
        _replayed(101)


def test_a_state_is_held_only_where_the_schedule_keeps_it():
    """NOTE [States kept only where used] (monet_opt/recompute.py): a random op's state is in
    the fixed memory, which the solvers take whole; the simulator, and the bound from sizes,
    leave it out where the schedule keeps none, and a chosen replaying variant keeps it in
    the problem it makes too."""
    p = _replayed(80, state=1000)
    kept = Schedule(kept=frozenset({1}), backward=(3,))
    again = Schedule(kept=frozenset({0}), backward=(1, 3))
    replay = Schedule(kept=frozenset({2}), backward=(3,), variants=frozenset({0}))
    assert simulate(p, kept).fixed_bytes == 0 and simulate(p, kept).peak_bytes == 50
    assert simulate(p, again).fixed_bytes == 1000 and simulate(p, again).live_bytes[1] == 1100
    plain = p.with_variants(frozenset({0}))
    assert simulate(p, replay).peak_bytes == 1100 == \
        simulate(plain, Schedule(kept=frozenset({2}), backward=(3,))).peak_bytes
    assert least_peak_bound(p).bytes <= 50
    assert solve(p, 10**9, "store_all").peak_bytes == 50
    with pytest.raises(InvalidProblemError, match="generator state"):
        replace(p, fixed_bytes=999)


def _random(seed: int) -> Problem:
    """A random step whose forward ops each hold up to 60 B while they run, some less in their
    first run, more where it copies the op's state (NOTE [The capture's copy])."""
    rng = random.Random(seed)
    p = autodiff_problem(10, rng)
    ops = list(p.ops)
    for i in p.forward_ops:
        if rng.random() < 0.6:
            ws = rng.randint(1, 60)
            first = rng.randint(0, ws)
            ops[i] = replace(ops[i], workspace_bytes=ws, is_random=True,
                             first_workspace_bytes=first,
                             captured_workspace_bytes=rng.choice((None, rng.randint(first, ws))))
    return replace(p, ops=tuple(ops))


@pytest.mark.parametrize("seed", range(4))
def test_every_solvers_schedule_is_within_its_budget_by_the_simulator(seed):
    p = _random(seed)
    plain = replace(p, ops=tuple(replace(op, first_workspace_bytes=None,
                                         captured_workspace_bytes=None) for op in p.ops))
    store_all = solve(p, 10**12, "store_all").peak_bytes
    least = solve(p, p.fixed_bytes, "auto", time_limit_s=2).min_feasible_bytes
    assert least_peak_bound(p).bytes <= least
    for budget in (least, (least + store_all) // 2):
        for solver in SOLVERS:
            r = solve(p, budget, solver, time_limit_s=2)
            if not r.feasible:
                continue
            sim = simulate(p, r.schedule)
            assert sim.peak_bytes == r.peak_bytes <= budget, (solver, budget)
            assert sim.peak_bytes <= simulate(plain, r.schedule).peak_bytes
