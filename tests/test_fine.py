"""NOTE [Fine windows] (solvers/fine.py). No torch."""
from __future__ import annotations

import random
import time

import pytest

from solvers import fine, simulate, solve
from solvers.milp import MilpOptions
from tests.problems import autodiff_problem, chain, masked_chain


def _budget(p, share: float, solvers=("chen_sqrt",)) -> int:
    """`share` of the way from the least peak all `solvers` reach to store-all's peak."""
    floor = max(solve(p, 10**12, s).min_feasible_bytes for s in solvers)
    return floor + int((solve(p, 10**12, "store_all").peak_bytes - floor) * share)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("start_with", ["chen_sqrt", "evict", "dp"])
def test_fine_windows_make_any_schedule_faster_within_the_budget(monkeypatch, seed,
                                                                 start_with):
    """From another solver's schedule (recomputing where no coarse stage starts), windows of
    four reading positions reach a faster schedule that fits, never beating the optimum."""
    monkeypatch.setattr(fine, "WINDOW_POSITIONS", 4)
    p = autodiff_problem(16, random.Random(seed))
    budget = _budget(p, 0.25, ("chen_sqrt", "evict", "dp"))
    start = solve(p, budget, start_with).schedule
    refined = fine.refine(p, budget, start, time.perf_counter() + 60)
    sim = simulate(p, refined.schedule)
    exact = solve(p, budget, "milp", MilpOptions(rel_gap=1e-9))
    assert sim.peak_bytes == refined.peak_bytes <= budget
    assert sim.time_s == pytest.approx(refined.time_s)
    assert exact.objective_s - 1e-9 <= refined.time_s <= simulate(p, start).time_s
    if start_with == "chen_sqrt":  # Chen's segments leave room on every one of these
        assert refined.improved and refined.time_s < simulate(p, start).time_s


def test_fine_windows_reach_the_optimum_on_a_chain():
    """One window holds the whole chain: its program is the whole program, so from Chen's
    schedule it reaches the exact optimum."""
    p = chain(12)
    budget = _budget(p, 0.3)
    start = solve(p, budget, "chen_sqrt").schedule
    refined = fine.refine(p, budget, start, time.perf_counter() + 60)
    exact = solve(p, budget, "milp", MilpOptions(rel_gap=1e-9))
    assert refined.time_s == pytest.approx(exact.objective_s)


def test_fine_windows_choose_variants():
    """A window may swap recomputation for a cheaper variant of the window's backward ops."""
    p = masked_chain(10, encode_s=0.01)
    budget = _budget(p.with_variants(frozenset()), 0.2)
    start = solve(p.with_variants(frozenset()), budget, "chen_sqrt").schedule
    refined = fine.refine(p, budget, start, time.perf_counter() + 60)
    assert refined.schedule.variants
    assert simulate(p, refined.schedule).peak_bytes <= budget
    assert refined.time_s < simulate(p, start).time_s


def test_a_window_without_recomputation_is_not_solved():
    """With everything kept nothing can get faster: no window is even tried."""
    p = autodiff_problem(12, random.Random(1))
    store_all = solve(p, 10**12, "store_all")
    refined = fine.refine(p, store_all.peak_bytes, store_all.schedule,
                          time.perf_counter() + 60)
    assert (refined.windows, refined.improved) == (0, 0)
    assert refined.schedule == store_all.schedule


def test_a_backward_that_reads_no_forward_tensor_has_no_window():
    p = chain(1)  # its one backward op reads only the output gradient
    store_all = solve(p, 10**9, "store_all")
    refined = fine.refine(p, 10**9, store_all.schedule, time.perf_counter() + 5)
    assert (refined.windows, refined.schedule) == (0, store_all.schedule)


def test_the_deadline_is_kept():
    p = autodiff_problem(40, random.Random(0))
    budget = _budget(p, 0.2)
    start = solve(p, budget, "chen_sqrt").schedule
    t0 = time.perf_counter()
    refined = fine.refine(p, budget, start, t0 + 0.3)
    assert time.perf_counter() - t0 < 5.0
    assert simulate(p, refined.schedule).peak_bytes <= budget
