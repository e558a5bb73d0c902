"""NOTE [Cuts where the schedule goes over] (solvers/lazy_cuts.py): each cut holds its live
set alone (solvers/ondemand.py's schedule_from_cuts); a schedule found fits, takes the time
the simulator says, and the bound proven on the way is below every schedule. No torch."""
from __future__ import annotations

import math
import random

from hypothesis import given, settings, strategies as st

from solvers import Status, simulate, solve
from solvers.bound import boundary_bound
from solvers.lazy_cuts import CUTS_SOLVER, lazy_cuts
from solvers.ondemand import schedule_from_cuts, schedule_from_kept
from tests.problems import autodiff_problem, budget_between, chain, with_masks


def test_each_cut_holds_its_live_set_alone():
    """chain(6): forward ops 0-5 make a0-a5; backward ops 6-11 (b5 ... b0) read a4 ... a0, b0
    none. A cut before op 9 (b2, position 3): copies it does not hold are let go of and made
    again when read, the ones it holds and are not alive made before it."""
    p = chain(6)
    everything = set(p.forward_tensors)
    held = schedule_from_cuts(p, [0, 3], [everything, everything])
    assert held == schedule_from_kept(p, everything)
    assert held.backward == (6, 7, 8, 9, 10, 11)
    assert schedule_from_cuts(p, [0, 3], [everything, {0}]).backward == (6, 7, 8, 1, 9, 10, 11)
    assert schedule_from_cuts(p, [0, 3], [everything, set()]).backward == \
        (6, 7, 8, 0, 1, 9, 10, 11)
    # a4 kept alone: b4 recomputes a0-a3; a1, held at the cut, stays; a0 is made again for b1
    mixed = schedule_from_cuts(p, [0, 3], [{4}, {1}])
    assert mixed.backward == (6, 0, 1, 2, 3, 7, 8, 9, 0, 10, 11)
    assert simulate(p, mixed).peak_bytes < simulate(p, schedule_from_kept(p, {4})).peak_bytes


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
