"""NOTE [Cuts where the schedule goes over] (solvers/lazy_cuts.py): one cut reads off the
on-demand schedule of its kept set; a schedule found fits, takes the time the simulator says,
and the bound proven on the way is below every schedule. No torch."""
from __future__ import annotations

import math
import random

from hypothesis import given, settings, strategies as st

from solvers import Status, simulate, solve
from solvers.bound import boundary_bound
from solvers.lazy_cuts import CUTS_SOLVER, lazy_cuts, read_off
from solvers.ondemand import schedule_from_kept
from tests.problems import autodiff_problem, budget_between, with_masks


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 20), seed=st.integers(0, 10**6))
def test_one_cut_reads_off_the_on_demand_schedule(n, seed):
    rng = random.Random(seed)
    p = autodiff_problem(n, rng)
    kept = {t for t in p.forward_tensors if rng.random() < 0.5}
    assert read_off(p, [0], [kept], frozenset()) == schedule_from_kept(p, kept)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 16), seed=st.integers(0, 10**6), frac=st.floats(0.0, 1.0),
       masks=st.booleans())
def test_a_schedule_found_fits_and_the_bound_is_below_every_schedule(n, seed, frac, masks):
    rng = random.Random(seed)
    p = autodiff_problem(n, rng, name=f"cuts{n}-{seed}")
    if masks:
        p = with_masks(p, rng)
    budget = budget_between(p, frac)
    r = lazy_cuts(p, budget, 5.0)
    assert r.solver == CUTS_SOLVER
    if r.feasible:
        sim = simulate(p, r.schedule)
        assert sim.peak_bytes == r.peak_bytes <= budget
        assert math.isclose(sim.time_s, r.objective_s, rel_tol=1e-12)
        assert r.bound_s <= r.objective_s * (1 + 1e-9)
    exact = solve(p, budget, "checkmate")
    if r.bound_s is not None and exact.status == Status.OPTIMAL:
        assert r.bound_s <= exact.objective_s * (1 + 1e-6) + 1e-9


def test_cuts_added_where_one_cut_goes_over():
    """The DAG of tests/test_bound.py's test_cuts_see_the_pressure_later_in_the_backward: one
    cut recomputes nothing, and that schedule goes over later in the backward; cuts added
    there give a schedule within the budget, no faster than the proven optimum."""
    p = autodiff_problem(10, random.Random(1))
    store_peak = solve(p, 10**12, "store_all").peak_bytes
    least = solve(p, 10**12, "milp").min_feasible_bytes
    budget = least + int(0.2 * (store_peak - least))
    assert math.isclose(boundary_bound(p, budget, cuts=1), p.no_recompute_time_s, rel_tol=1e-6)
    r = lazy_cuts(p, budget, 10.0)
    assert r.feasible and r.peak_bytes <= budget
    assert "at 1 cuts" not in r.note
    exact = solve(p, budget, "checkmate")
    assert exact.status == Status.OPTIMAL
    assert exact.objective_s * (1 - 1e-9) <= r.objective_s
    assert r.bound_s <= exact.objective_s * (1 + 1e-6)
