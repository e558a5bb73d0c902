"""NOTE [The boundary bound] (solvers/bound.py): below every schedule, above the no-recompute
time, and infeasible exactly where nothing fits at the start of the backward; with forward rows
(solvers/bound_start.py) still below every schedule, and the starts made from it above it and
within the budget. No torch."""
from __future__ import annotations

import math
import random

from hypothesis import given, settings, strategies as st

from solvers import Status, simulate, solve
from solvers.bound import boundary_bound
from solvers.bound_start import kept_starts
from tests.test_bound_start import one_cut_with_forward_rows
from tests.problems import autodiff_problem, budget_between, chain, with_masks


def test_chain_bound_counts_the_forced_recomputation():
    # chain(6): six 10-byte activations, fixed 100, a 10-byte tangent. Backward reads a0..a4.
    # While the first backward op runs, its 10-byte output is alive too: room for two of those
    # five (a4, which it reads, and one more), so three must be recomputed. That is the optimum.
    p = chain(6)
    budget = 100 + 10 + 3 * 10
    bound = boundary_bound(p, budget, cuts=1)
    assert math.isclose(bound, p.no_recompute_time_s + 3.0, rel_tol=1e-9)
    r = solve(p, budget, "milp")
    assert r.status == Status.OPTIMAL and math.isclose(r.objective_s, bound, rel_tol=1e-9)


def test_no_room_at_all_is_infeasible():
    p = chain(4)
    assert boundary_bound(p, p.fixed_bytes) == math.inf


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 24), seed=st.integers(0, 10**6), frac=st.floats(0.0, 1.0),
       masks=st.booleans())
def test_bound_is_below_every_schedule(n, seed, frac, masks):
    rng = random.Random(seed)
    p = autodiff_problem(n, rng, name=f"bound{n}-{seed}")
    if masks:
        p = with_masks(p, rng)
    budget = budget_between(p, frac)
    bound = boundary_bound(p, budget)
    assert bound is not None and bound >= p.no_recompute_time_s - 1e-9
    # the one-cut program with a row at every forward op (NOTE [Forward rows])
    forward = one_cut_with_forward_rows(p, budget)
    for solver in ("auto", "milp", "evict", "dp", "chen"):
        r = solve(p, budget, solver)
        if r.feasible:
            assert bound <= r.objective_s + 1e-9, (solver, bound, r.objective_s)
            assert forward <= r.objective_s * (1 + 2e-6) + 1e-9, (solver, forward)
    # A smaller budget never helps, up to the bound program's own relative gap (1e-4 each).
    assert boundary_bound(p, budget - 1) >= bound * (1 - 2e-4) - 1e-9
    # one cut is the same program with fewer rows (NOTE [Cuts through the backward])
    one = boundary_bound(p, budget, cuts=1)
    assert one <= bound * (1 + 2e-4) + 1e-9
    for start in kept_starts(p, budget, 5.0):  # NOTE [The bound's kept set]: within the
        sim = simulate(p, start.schedule)     # budget, no faster than its program
        assert sim.peak_bytes <= budget and sim.time_s >= forward * (1 - 2e-6) - 1e-9


def test_cuts_see_the_pressure_later_in_the_backward():
    """NOTE [Cuts through the backward]: on this DAG nothing must be recomputed for the first
    backward op's sake, but later, with gradients alive, something must; the bound with cuts
    sees it and stays below Checkmate's proven optimum."""
    p = autodiff_problem(10, random.Random(1))
    store_peak = solve(p, 10**12, "store_all").peak_bytes
    least = solve(p, 10**12, "milp").min_feasible_bytes
    budget = least + int(0.2 * (store_peak - least))
    one, many = boundary_bound(p, budget, cuts=1), boundary_bound(p, budget)
    exact = solve(p, budget, "checkmate")
    assert exact.status == Status.OPTIMAL
    assert math.isclose(one, p.no_recompute_time_s, rel_tol=1e-6)
    assert one + 1e-6 < many <= exact.objective_s + 1e-9
