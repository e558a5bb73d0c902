"""Operator variants in the solver layer: the problem's contract, the simulator's view, and the
joint MILP choosing them. No torch."""
from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import example, given, settings, strategies as st

from solvers import (NO_PRODUCER, InvalidProblemError, InvalidScheduleError, Op, Problem,
                     Schedule, Status, Tensor, Variant, available_solvers, registry,
                     schedule_from_kept, simulate, solve)
from tests.problems import autodiff_problem, masked_chain, with_masks
from tests.test_solvers import check_result, dump_on_failure


def test_variant_validation():
    p = masked_chain(3)
    bad_op = Variant("x", 0, 0, (1,), ())
    with pytest.raises(InvalidProblemError, match="not a backward op"):
        Problem(p.ops, p.tensors, p.fixed_bytes, p.forward_outputs, p.backward_outputs,
                (bad_op,))
    first_bwd = p.backward_ops[0]
    bad_read = Variant("x", first_bwd, 0, (1,), ())
    with pytest.raises(InvalidProblemError, match="does not read"):
        Problem(p.ops, p.tensors, p.fixed_bytes, p.forward_outputs, p.backward_outputs,
                (bad_read,))
    assert Problem.from_json(p.to_json()) == p


def test_simulator_runs_the_chosen_variants():
    p = masked_chain(4)
    everything = frozenset(range(len(p.variants)))
    masks = {t for t in p.forward_tensors if p.tensors[t].name.startswith("m")}
    plain = simulate(p, schedule_from_kept(p, p.saved_for_backward))
    masked = simulate(p, schedule_from_kept(p, masks, everything))
    # each op's 32-byte output is replaced by a 1-byte mask; the encoders cost 0.1 s each
    assert plain.time_s == pytest.approx(p.base_time_s)
    assert masked.time_s == pytest.approx(p.base_time_s + 4 * 0.1)
    assert masked.peak_bytes < plain.peak_bytes - 2 * 32
    # the unchosen encoders are free and allocate nothing
    assert simulate(p, schedule_from_kept(p, p.saved_for_backward)).time_s == plain.time_s
    with pytest.raises(InvalidScheduleError, match="reads"):
        simulate(p, Schedule(frozenset(masks), schedule_from_kept(p, masks, everything).backward))


def test_plain_problems_are_cached_and_bounded():
    from solvers import problem as problem_module
    p = masked_chain(5)
    subsets = [frozenset(c) for r in range(4) for c in itertools.combinations(range(5), r)]
    assert len(subsets) > problem_module.PLAIN_PROBLEMS_CACHED
    for chosen in subsets:
        assert p.with_variants(chosen) == problem_module._apply_variants(p, chosen)
    assert p.with_variants(set(subsets[-1])) is p.with_variants(subsets[-1])
    assert len(p._plain_problems) == problem_module.PLAIN_PROBLEMS_CACHED


def test_exclusive_variants_cannot_both_run():
    p = masked_chain(2)
    v = p.variants[0]
    twin = Variant("twin", v.op, v.replaces, v.reads, ())
    q = Problem(p.ops, p.tensors, p.fixed_bytes, p.forward_outputs, p.backward_outputs,
                p.variants + (twin,))
    with pytest.raises(InvalidScheduleError, match="exclude each other"):
        q.with_variants({0, len(q.variants) - 1})


def test_milp_chooses_variants_when_memory_is_tight():
    """Keeping every output does not fit, every mask does: the optimum uses every variant and
    recomputes nothing (each recomputation costs 1 s, each encoder 0.1 s)."""
    p = masked_chain(6)
    everything = frozenset(range(len(p.variants)))
    masks = {t for t in p.forward_tensors if p.tensors[t].name.startswith("m")}
    budget = simulate(p, schedule_from_kept(p, masks, everything)).peak_bytes
    r = check_result(p, budget, "milp")
    assert r.status is Status.OPTIMAL
    assert r.schedule.variants == everything
    assert r.objective_s == pytest.approx(p.base_time_s + 6 * 0.1)
    assert check_result(p, budget, "auto").objective_s == pytest.approx(r.objective_s)


def test_a_tensor_waiting_for_a_later_encode_op_is_counted():
    """NOTE [Read by a later encode op]: enc_a's 30 B workspace runs while b (last read by f)
    waits for enc_b. The MILP did not count b there: its schedule keeping both masks peaked
    at 111 B, and "milp" and "auto" raised an internal SolverError at a budget of 80 B."""
    ops = (Op("f", False, 1.0, (), (0, 1)),
           Op("enc_a", False, 0.1, (0,), (2,), workspace_bytes=30),
           Op("enc_b", False, 0.1, (1,), (3,)),
           Op("b0", True, 1.0, (4, 0, 1), (5,)))
    tensors = (Tensor("a", 40, 0), Tensor("b", 40, 0), Tensor("ma", 1, 1), Tensor("mb", 1, 2),
               Tensor("tan", 1, NO_PRODUCER), Tensor("g", 1, 3))
    p = Problem(ops, tensors, 0, forward_outputs=(), backward_outputs=(5,), variants=(
        Variant("mask_a", 3, 0, (2,), (1,), 0.0), Variant("mask_b", 3, 1, (3,), (2,), 0.0)))
    both = simulate(p, Schedule(kept=frozenset({2, 3}), backward=(3,),
                                variants=frozenset({0, 1})))
    assert both.peak_bytes == 111
    for budget in (80, 90, 111, 200):
        brute = _brute_force(p, budget)
        for solver in ("milp", "auto"):
            r = check_result(p, budget, solver)
            assert r.feasible == (brute is not None)
            assert not r.feasible or r.objective_s <= brute + 1e-9


def _brute_force(p: Problem, budget: int) -> float | None:
    """The fastest on-demand schedule over every variant choice and kept set."""
    groups: dict[tuple[int, int], list[int]] = {}
    for v, var in enumerate(p.variants):
        groups.setdefault(var.group, []).append(v)
    options = [[None] + vs for vs in groups.values()]
    fwd = list(p.forward_tensors)
    best = None
    for pick in itertools.product(*options):
        chosen = frozenset(v for v in pick if v is not None)
        for bits in range(1 << len(fwd)):
            kept = {t for k, t in enumerate(fwd) if bits >> k & 1}
            sim = simulate(p, schedule_from_kept(p, kept, chosen))
            if sim.peak_bytes <= budget and (best is None or sim.time_s < best):
                best = sim.time_s
    return best


@pytest.mark.parametrize("seed", range(6))
def test_milp_at_least_as_good_as_every_on_demand_schedule(seed):
    rng = random.Random(seed)
    p = with_masks(autodiff_problem(5, rng, name=f"tiny{seed}"), rng, frac=1.0)
    assert p.variants
    least = solve(p, 10**12, "milp").min_feasible_bytes
    store = simulate(p, schedule_from_kept(p, p.saved_for_backward)).peak_bytes
    for budget in (least, (least + store) // 2):
        r = check_result(p, budget, "milp")
        brute = _brute_force(p, budget)
        assert r.feasible
        if brute is not None:
            assert r.objective_s <= brute + 1e-9, dump_on_failure(p, budget, "milp")


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 16), seed=st.integers(0, 10**6), frac=st.floats(0.0, 1.0))
@example(n=13, seed=622, frac=0.75)
def test_random_dags_with_variants_every_solver(n, seed, frac):
    rng = random.Random(seed)
    plain = autodiff_problem(n, rng, name=f"vdag{n}-{seed}")
    p = with_masks(plain, rng)
    store_peak = solve(p, 10**12, "store_all").peak_bytes
    least = solve(p, 10**12, "auto").min_feasible_bytes
    assert least <= solve(plain, 10**12, "auto").min_feasible_bytes, \
        dump_on_failure(p, least, "auto")
    budget = int(least + frac * (store_peak - least))
    results = {s: check_result(p, budget, s) for s in available_solvers()}
    assert results["auto"].feasible, dump_on_failure(p, budget, "auto")
    # "auto" does not consult the Checkmate baseline, which can beat the joint MILP
    # (test_solvers.test_checkmate_never_slower_than_milp).
    best = min(r.objective_s for s, r in results.items()
               if r.feasible and s not in ("auto", "checkmate"))
    # ...and polishes the best of them (NOTE [Polishing]), so it can only do better, unless it
    # stopped within AUTO_CLOSE_ENOUGH of no recomputation (NOTE [Close enough]; found by a
    # local run: n=13, seed=622, frac=0.75, store-all with the lightest variants +0.37 %)
    auto = results["auto"].objective_s
    assert auto <= best * (1 + 1e-9) or \
        auto <= p.no_recompute_time_s * (1 + registry.AUTO_CLOSE_ENOUGH), \
        dump_on_failure(p, budget, "auto")
