"""Kusumoto's lower-set DP ("dp") against brute force, the joint MILP and Chen. No torch."""
from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings, strategies as st

from solvers import Status, schedule_from_kept, simulate, solve
from solvers.dp import DpOptions
from tests.problems import autodiff_problem, chain, diamonds
from tests.test_solvers import check_result, dump_on_failure

EXACT, APPROX = DpOptions(exact=True), DpOptions(exact=False)


def _budgets(p, steps=5):
    least = solve(p, 10**12, "dp", EXACT).min_feasible_bytes
    store = solve(p, 10**12, "store_all").peak_bytes
    return sorted({least + (store - least) * k // steps for k in range(steps + 1)})


def _best_on_demand(p, budget):
    """The fastest schedule_from_kept over every kept set (a chain's canonical strategies are
    among them)."""
    fwd, best = list(p.forward_tensors), None
    for bits in range(1 << len(fwd)):
        sim = simulate(p, schedule_from_kept(p, {t for k, t in enumerate(fwd) if bits >> k & 1}))
        if sim.peak_bytes <= budget and (best is None or sim.time_s < best):
            best = sim.time_s
    return best


@pytest.mark.parametrize("n", [3, 6, 9])
def test_exact_dp_on_chains_is_the_best_on_demand_schedule(n):
    p = chain(n)
    for budget in _budgets(p):
        r = check_result(p, budget, "dp")
        assert r.feasible and "exact" in r.note
        assert r.objective_s == pytest.approx(_best_on_demand(p, budget))


@pytest.mark.parametrize("problem", [chain(6), diamonds(1), diamonds(2)] + [
    autodiff_problem(n, random.Random(200 + n), name=f"dpdag{n}") for n in (6, 8)],
    ids=lambda p: p.name)
def test_milp_optimum_never_above_dp(problem):
    for budget in _budgets(problem, steps=3):
        dp = solve(problem, budget, "dp", EXACT)
        milp = solve(problem, budget, "milp")
        assert dp.feasible and milp.feasible
        if milp.status is Status.OPTIMAL:
            assert milp.objective_s <= dp.objective_s + 1e-9, \
                dump_on_failure(problem, budget, "milp")


@pytest.mark.parametrize("n", [4, 9, 16, 30])
def test_dp_beats_chen_on_chains(n):
    p = chain(n)
    dp, chen = solve(p, 10**12, "dp"), solve(p, 10**12, "chen")
    assert dp.min_feasible_bytes <= chen.min_feasible_bytes
    for budget in _budgets(p):
        d, c = solve(p, budget, "dp"), solve(p, budget, "chen_sqrt")
        if c.feasible:
            assert d.objective_s <= c.objective_s + 1e-9


# NOTE: false in simulated time. The DP ranks chains by its own estimates (NOTE [Estimate and
# truth] in solvers/dp.py); chains that tie with or are dominated by another in (kept bytes,
# recompute time, peak estimate) are dropped although the simulator may rate them better, and
# the approximate mode's per-budget cap search simulates a different set of chains. On seed 0
# at its tightest budget (1192 B) the approximate mode's chain runs in 28.36 s, the exact
# mode's in 29.70 s. (Kusumoto et al. saw the same: their approximate DP sometimes beat the
# exact one once liveness analysis ran after it.)
@pytest.mark.parametrize("seed", [pytest.param(0, marks=pytest.mark.xfail(
    strict=True, reason="estimate ties: see the NOTE above")), 1, 2, 3])
def test_approximate_never_faster_than_exact_on_small_dags(seed):
    p = autodiff_problem(9, random.Random(seed), name=f"apx{seed}")
    assert solve(p, 10**12, "dp").note.startswith("exact")
    for budget in _budgets(p, steps=3):
        exact = solve(p, budget, "dp", EXACT)
        approx = solve(p, budget, "dp", APPROX)
        assert "approximate" in approx.note
        if approx.feasible:
            assert exact.objective_s <= approx.objective_s + 1e-9


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 12), seed=st.integers(0, 10**6))
def test_exact_time_never_rises_with_budget(n, seed):
    p = autodiff_problem(n, random.Random(seed), name=f"dpmono{n}-{seed}")
    costs = [solve(p, b, "dp", EXACT).objective_s for b in _budgets(p, steps=6)]
    assert all(a >= b - 1e-12 for a, b in zip(costs, costs[1:])), dump_on_failure(p, 0, "dp")


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 10**6), frac=st.floats(0.0, 1.0),
       exact=st.sampled_from([None, False]))
def test_random_dags_dp_fits_the_simulator(n, seed, frac, exact):
    p = autodiff_problem(n, random.Random(seed), name=f"dpdag{n}-{seed}")
    opts = DpOptions(exact=exact)
    least = solve(p, 10**12, "dp", opts).min_feasible_bytes
    store = solve(p, 10**12, "store_all").peak_bytes
    budget = int(least + frac * max(0, store - least))
    r = solve(p, budget, "dp", opts)
    assert r.feasible, dump_on_failure(p, budget, "dp")
    sim = simulate(p, r.schedule)
    assert sim.peak_bytes == r.peak_bytes <= budget
    assert r.objective_s == pytest.approx(sim.time_s)
    assert r.bound_s <= r.objective_s + 1e-9
    assert solve(p, least - 1, "dp", opts).status is Status.INFEASIBLE


def test_memory_mode_returns_the_least_peak():
    p = chain(20)
    r = solve(p, 10**12, "dp", DpOptions(mode="memory"))
    assert r.feasible and r.peak_bytes == r.min_feasible_bytes
    assert r.peak_bytes <= solve(p, 10**12, "dp").peak_bytes


def test_thousand_op_chain_in_seconds():
    p = chain(1000)
    start = time.perf_counter()
    store = solve(p, 10**12, "store_all").peak_bytes
    r = solve(p, (store + p.fixed_bytes) // 2, "dp", DpOptions(time_limit_s=30))
    assert r.feasible and "approximate" in r.note and "time limit" not in r.note
    assert time.perf_counter() - start < 30
    assert r.min_feasible_bytes < store // 5


def test_time_limit_and_bad_mode():
    from solvers import SolverError
    p = autodiff_problem(60, random.Random(1))
    r = solve(p, 10**12, "dp", DpOptions(time_limit_s=1e-6))
    assert r.status is Status.TIMEOUT and r.schedule is None
    with pytest.raises(SolverError, match="mode"):
        solve(p, 10**12, "dp", DpOptions(mode="speed"))


def test_exact_mode_takes_store_all_below_every_chain():
    """Two ops whose backward may read masks instead (variants): store-all peaks at 55 B,
    below every chain of lower sets, so exact mode's budget filter left no chain and dp raised
    a bare ValueError ("min() arg is an empty sequence") at 55-57 B, the least peak it had
    itself reported."""
    from solvers import NO_PRODUCER, Op, Problem, Tensor, Variant
    p = Problem(
        ops=(Op("f0", False, 0.0, (), (0,), workspace_bytes=5),
             Op("enc0", False, 0.0151, (0,), (5,)),
             Op("f1", False, 2.0, (0,), (1,), workspace_bytes=30, recompute_time_s=0.0),
             Op("enc1", False, 0.2204, (1,), (6,)),
             Op("b1", True, 0.0, (2, 0, 1), (3,)), Op("b0", True, 0.0, (3,), (4,))),
        tensors=(Tensor("a0", 20, 0), Tensor("a1", 5, 2), Tensor("tan", 5, NO_PRODUCER),
                 Tensor("g1", 10, 4), Tensor("g0", 5, 5), Tensor("m0", 13, 1),
                 Tensor("m1", 3, 3)),
        fixed_bytes=0, forward_outputs=(1,), backward_outputs=(3, 4),
        variants=(Variant("mask0", 4, 0, (5,), (1,), 0.1404, 5),
                  Variant("mask1", 4, 1, (6,), (3,), 0.1941, 0)))
    least = solve(p, 0, "dp").min_feasible_bytes
    for budget in (least, least + 2, 10 ** 9):
        r = solve(p, budget, "dp", time_limit_s=2)
        assert r.feasible and r.peak_bytes <= budget
        assert simulate(p, r.schedule).peak_bytes == r.peak_bytes
