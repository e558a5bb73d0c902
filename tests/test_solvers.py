"""The solver contract: every solver, tiny problems, invariants, random DAGs. No torch."""
from __future__ import annotations

import pathlib
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from solvers import (InvalidProblemError, InvalidScheduleError, NO_PRODUCER, Op, Problem,
                     Schedule, Status, Tensor, UnknownSolverError, available_solvers,
                     schedule_from_kept, simulate, solve)
from tests.problems import autodiff_problem, chain

SOLVERS = available_solvers()
ROOT = pathlib.Path(__file__).resolve().parents[1]


def dump_on_failure(problem: Problem, budget: int, solver: str) -> str:
    out = ROOT / "failures"
    out.mkdir(exist_ok=True)
    path = out / f"{problem.name}-{solver}-{budget}.json"
    path.write_text(problem.to_json())
    return f"problem written to {path}"


def check_result(problem: Problem, budget: int, solver: str):
    r = solve(problem, budget, solver)
    if r.feasible:
        sim = simulate(problem, r.schedule)
        assert sim.peak_bytes == r.peak_bytes <= budget, dump_on_failure(problem, budget, solver)
        assert abs(sim.time_s - r.objective_s) < 1e-9, dump_on_failure(problem, budget, solver)
        assert r.bound_s <= r.objective_s + 1e-9, dump_on_failure(problem, budget, solver)
        assert 0.0 <= r.gap <= 1.0
    else:
        assert r.status is Status.INFEASIBLE and r.schedule is None
    return r


def test_solvers_import_without_torch():
    code = ("import sys, pkgutil, importlib; sys.modules['torch'] = None\n"
            "import solvers\n"
            "for m in pkgutil.walk_packages(solvers.__path__, 'solvers.'):\n"
            "    importlib.import_module(m.name)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_simulator_by_hand():
    # fixed 100; f0 -> a0 (10); f1(a0) -> a1 (10, the output); b1(tangent, a0) -> g (10);
    # b0(g) -> gin (10, returned).
    p = Problem(ops=(Op("f0", False, 1.0, (), (0,)), Op("f1", False, 1.0, (0,), (1,)),
                     Op("b1", True, 2.0, (2, 0), (3,)), Op("b0", True, 2.0, (3,), (4,))),
                tensors=(Tensor("a0", 10, 0), Tensor("a1", 10, 1), Tensor("t", 10, NO_PRODUCER),
                         Tensor("g", 10, 2), Tensor("gin", 10, 3)),
                fixed_bytes=100, forward_outputs=(1,), backward_outputs=(4,))
    keep = simulate(p, Schedule(frozenset({0}), (2, 3)))
    assert keep.live_bytes == (110, 120, 130, 120) and keep.peak_bytes == 130
    assert keep.time_s == 6.0 and keep.recompute_counts == (0, 0, 0, 0)
    redo = simulate(p, Schedule(frozenset(), (0, 2, 3)))
    assert redo.live_bytes == (110, 120, 120, 130, 120) and redo.time_s == 7.0
    assert redo.recompute_counts == (1, 0, 0, 0)


@pytest.mark.parametrize("schedule, message", [
    (Schedule(frozenset(), (2, 3)), "does not exist"),          # a0 neither kept nor recomputed
    (Schedule(frozenset({0}), (2,)), "exactly once"),            # b0 missing
    (Schedule(frozenset({0}), (2, 3, 3)), "exactly once"),       # b0 twice
    (Schedule(frozenset({0}), (3, 2)), "does not exist"),        # b0 before the g it reads
    (Schedule(frozenset({4}), (2, 3)), "forward tensors"),       # keeping a gradient
])
def test_simulator_rejects_invalid(schedule, message):
    p = chain(2)
    with pytest.raises(InvalidScheduleError, match=message):
        simulate(p, schedule)


def test_problem_validation():
    with pytest.raises(InvalidProblemError, match="comes after a backward op"):
        Problem(ops=(Op("b", True, 1.0, (), (0,)), Op("f", False, 1.0, (), (1,))),
                tensors=(Tensor("g", 1, 0), Tensor("a", 1, 1)), fixed_bytes=0)
    with pytest.raises(InvalidProblemError, match="made later"):
        Problem(ops=(Op("f0", False, 1.0, (1,), (0,)), Op("f1", False, 1.0, (), (1,))),
                tensors=(Tensor("a", 1, 0), Tensor("b", 1, 1)), fixed_bytes=0)
    with pytest.raises(InvalidProblemError, match="negative"):
        Problem(ops=(), tensors=(), fixed_bytes=-1)


def test_json_round_trip():
    p = autodiff_problem(12, random.Random(3))
    assert Problem.from_json(p.to_json()) == p
    s = solve(p, 10**9, "chen_greedy").schedule
    assert Schedule.from_json(s.to_json()) == s


def test_unknown_solver():
    with pytest.raises(UnknownSolverError, match="available"):
        solve(chain(3), 10**9, "gurobi")


@pytest.mark.parametrize("solver", SOLVERS)
def test_empty_problem(solver):
    p = Problem(ops=(), tensors=(), fixed_bytes=7)
    r = check_result(p, 7, solver)
    assert r.feasible and r.peak_bytes == 7 and r.objective_s == 0.0
    assert solve(p, 6, solver).status is Status.INFEASIBLE


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("problem", [chain(1), chain(8), chain(30),
                                     autodiff_problem(25, random.Random(1), name="dag25")],
                         ids=lambda p: p.name)
def test_min_feasible_budget_is_exact(solver, problem):
    """At the minimum feasible budget the solver succeeds; one byte below it fails."""
    first = solve(problem, 10**12, solver)
    assert first.feasible
    least = first.min_feasible_bytes
    at = check_result(problem, least, solver)
    assert at.feasible and at.peak_bytes == least
    below = check_result(problem, least - 1, solver)
    assert not below.feasible and below.min_feasible_bytes == least


@pytest.mark.parametrize("solver", SOLVERS)
def test_unconstrained_is_store_all_time(solver):
    p = autodiff_problem(20, random.Random(7))
    r = check_result(p, 10**12, solver)
    if solver in ("auto", "store_all"):
        assert r.status is Status.OPTIMAL and r.gap == 0.0
        assert r.objective_s == pytest.approx(p.no_recompute_time_s)


def test_store_all_keeps_exactly_what_backward_reads():
    p = chain(6)
    r = solve(p, 10**9, "store_all")
    assert r.schedule.kept == p.saved_for_backward
    assert all(p.ops[i].is_backward for i in r.schedule.backward)


def test_chain_recomputation_saves_memory():
    p = chain(36)
    store = solve(p, 10**9, "store_all")
    least = solve(p, 10**9, "auto").min_feasible_bytes
    assert least < store.peak_bytes - 0.5 * (store.peak_bytes - p.fixed_bytes)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 28), seed=st.integers(0, 10**6), frac=st.floats(0.0, 1.0))
def test_random_dags_every_solver(n, seed, frac):
    p = autodiff_problem(n, random.Random(seed), name=f"dag{n}-{seed}")
    store_peak = solve(p, 10**12, "store_all").peak_bytes
    least = solve(p, 10**12, "auto").min_feasible_bytes
    budget = int(least + frac * (store_peak - least))
    results = {s: check_result(p, budget, s) for s in SOLVERS}
    assert results["auto"].feasible, dump_on_failure(p, budget, "auto")
    best = min(r.objective_s for s, r in results.items() if r.feasible and s != "auto")
    assert results["auto"].objective_s == pytest.approx(best)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 24), seed=st.integers(0, 10**6))
def test_cost_never_rises_with_budget(n, seed):
    p = autodiff_problem(n, random.Random(seed), name=f"mono{n}-{seed}")
    least = solve(p, 10**12, "auto").min_feasible_bytes
    store_peak = solve(p, 10**12, "store_all").peak_bytes
    for solver in ("auto", "chen_greedy"):
        costs = [solve(p, least + (store_peak - least) * k // 6, solver).objective_s
                 for k in range(7)]
        feasible = [c for c in costs if c is not None]
        assert all(a >= b - 1e-12 for a, b in zip(feasible, feasible[1:])), \
            dump_on_failure(p, least, solver)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 20), seed=st.integers(0, 10**6), keep_frac=st.floats(0.0, 1.0))
def test_schedule_from_any_kept_set_is_valid(n, seed, keep_frac):
    rng = random.Random(seed)
    p = autodiff_problem(n, rng)
    kept = {t for t in p.forward_tensors if rng.random() < keep_frac}
    sim = simulate(p, schedule_from_kept(p, kept))
    assert sim.peak_bytes >= p.fixed_bytes
    assert sim.time_s >= p.no_recompute_time_s - 1e-9


@pytest.mark.parametrize("backend", ["highs", "cbc", "cpsat"])
def test_milp_backends_agree_on_the_optimum(backend):
    """Every backend proves the same optimum on a small DAG at a tight budget, and the schedule
    it returns simulates within the budget at exactly the reported time."""
    from solvers.milp import MilpOptions
    p = autodiff_problem(10, random.Random(11), name="dag10")
    least = solve(p, 10**12, "milp").min_feasible_bytes
    store_all = simulate(p, schedule_from_kept(p, p.saved_for_backward)).peak_bytes
    budget = (least + store_all) // 2
    reference = solve(p, budget, "milp")
    r = solve(p, budget, "milp", MilpOptions(backend=backend, time_limit_s=30))
    assert r.feasible, dump_on_failure(p, budget, backend)
    assert simulate(p, r.schedule).peak_bytes <= budget
    assert r.objective_s == pytest.approx(reference.objective_s, rel=1e-6)
    assert r.objective_s <= solve(p, budget, "chen_greedy").objective_s + 1e-9


def test_milp_beats_chen_when_memory_is_tight():
    """On a chain the program finds schedules Chen's segments cannot: lower least peak, and
    less recomputation at a budget both meet."""
    p = chain(12)
    milp, chen = solve(p, 10**12, "milp"), solve(p, 10**12, "chen_greedy")
    assert milp.min_feasible_bytes < chen.min_feasible_bytes
    budget = chen.min_feasible_bytes
    assert solve(p, budget, "milp").objective_s < solve(p, budget, "chen_greedy").objective_s
