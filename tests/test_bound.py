"""NOTE [The boundary bound] (solvers/bound.py): below every schedule, above the no-recompute
time, and infeasible exactly where nothing fits at the start of the backward. No torch."""
from __future__ import annotations

import math
import random

from hypothesis import given, settings, strategies as st

from solvers import solve
from solvers.bound import boundary_bound
from tests.problems import autodiff_problem, chain, with_masks


def test_chain_bound_counts_the_forced_recomputation():
    # chain(6): six 10-byte activations, fixed 100, a 10-byte tangent. Backward reads a0..a4.
    # With room for three of those five at the backward's start, two must be recomputed.
    p = chain(6)
    budget = 100 + 10 + 3 * 10
    bound = boundary_bound(p, budget)
    assert math.isclose(bound, p.no_recompute_time_s + 2.0, rel_tol=1e-9)
    r = solve(p, budget, "milp")
    assert r.feasible and r.objective_s >= bound - 1e-9


def test_no_room_at_all_is_infeasible():
    p = chain(4)
    assert boundary_bound(p, p.fixed_bytes) == math.inf


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 24), seed=st.integers(0, 10**6), frac=st.floats(0.0, 1.0),
       masks=st.booleans())
def test_bound_is_below_every_schedule(n, seed, frac, masks):
    rng = random.Random(seed)
    p = autodiff_problem(n, rng, name=f"bound{n}-{seed}")
    if masks:
        p = with_masks(p, rng)
    store_peak = solve(p, 10**12, "store_all").peak_bytes
    least = solve(p, 10**12, "auto").min_feasible_bytes
    budget = int(least + frac * (store_peak - least))
    bound = boundary_bound(p, budget)
    assert bound is not None and bound >= p.no_recompute_time_s - 1e-9
    for solver in ("auto", "milp", "evict", "dp", "chen"):
        r = solve(p, budget, solver)
        if r.feasible:
            assert bound <= r.objective_s + 1e-9, (solver, bound, r.objective_s)
    assert boundary_bound(p, budget - 1) >= bound - 1e-9  # a smaller budget never helps
