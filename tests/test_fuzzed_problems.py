"""Problems the solvers fuzzing drew (2026-12-02) where a solver went wrong. No torch."""
from __future__ import annotations

from solvers import NO_PRODUCER, Op, Problem, Status, Tensor, Variant, simulate, solve
from solvers.lazy_cuts import lazy_cuts


def _fuzzed_r75() -> Problem:
    """Nine ops, two of them writing into a dying input."""
    ops = (Op("f0", False, 2.0, (), (0, 1), recompute_time_s=0.5),
           Op("f1", False, 1.0, (0, 1), (2,)),
           Op("f2", False, 0.5, (0, 2), (3,), overwrites=(0,)),
           Op("f3", False, 2.0, (0,), (4,), overwrites=(0,)),
           Op("f4", False, 0.0, (3,), (5,)),
           Op("b0", True, 0.0, (1, 3, 4, 6), (7,)),
           Op("b1", True, 2.0, (3, 5, 6, 7), (8,)),
           Op("b2", True, 2.0, (0, 2, 7, 8), (9,)),
           Op("b3", True, 0.0, (2, 4, 6, 7), (10,)))
    sizes = (("a0.1", 0, 0), ("a0.2", 50, 0), ("a1.1", 10, 1), ("a2.1", 0, 2), ("a3.1", 0, 3),
             ("a4.1", 10, 4), ("tan", 10, NO_PRODUCER), ("g0", 5, 5), ("g1", 20, 6),
             ("g2", 0, 7), ("g3", 20, 8))
    return Problem(ops, tuple(Tensor(*t) for t in sizes), 0, forward_outputs=(3,),
                   backward_outputs=(7, 9), name="r75")


def test_checkmate_at_a_huge_budget_gives_store_alls_time():
    """Checkmate's program built at 2**63 - 1: its row bounds (~9e18) broke HiGHS, 11.0 s
    called optimal where store-all, within the budget, takes 9.5 s (2**60: 11.5 s)."""
    p = _fuzzed_r75()
    store_all = solve(p, 2**63 - 1, "store_all")
    for budget in (10**15, 2**60, 2**63 - 1):
        r = solve(p, budget, "checkmate", time_limit_s=5)
        assert r.feasible and r.objective_s == store_all.objective_s


def _fuzzed_r371() -> Problem:
    """Ten ops; backward op b4 has two variants in two groups (one reads nothing for a0)."""
    ops = (Op("f0", False, 1.261, (), (0,), workspace_bytes=5), Op("f1", False, 1.617, (0,), (1,)),
           Op("f2", False, 1.929, (0,), (2,)),
           Op("f3", False, 1.792, (2,), (3,), recompute_time_s=0.358),
           Op("f4", False, 0.480, (0, 2, 3), (4,)), Op("b4", True, 1.796, (5, 0, 2, 3), (6,)),
           Op("b3", True, 0.322, (6, 2, 3), (7,)), Op("b2", True, 1.968, (7, 6, 0), (8,)),
           Op("b1", True, 0.495, (5, 0), (9,), workspace_bytes=5),
           Op("b0", True, 2.108, (9, 8, 6), (10,)))
    sizes = (("a0", 27, 0), ("a1", 21, 1), ("a2", 40, 2), ("a3", 48, 3), ("a4", 46, 4),
             ("tangent", 46, NO_PRODUCER), ("g4", 31, 5), ("g3", 16, 6), ("g2", 15, 7),
             ("g1", 40, 8), ("g0", 24, 9))
    variants = (Variant("alt5.0", 5, 0, (), (), 0.0), Variant("alt5.3", 5, 3, (4,), (), -1.5),
                Variant("alt6.2", 6, 2, (), (), -0.5, 15))
    return Problem(ops, tuple(Tensor(*t) for t in sizes), 100, forward_outputs=(4,),
                   backward_outputs=(10,), variants=variants, name="r371")


def test_a_bound_above_the_schedules_own_time_is_dropped():
    """NOTE [A bound its own schedule refutes]: the MILP returned the warm start's schedule
    as optimal, gap 0, with a bound above that schedule's own time."""
    p = _fuzzed_r371()
    for budget in (265, 300):
        r = solve(p, budget, "milp", time_limit_s=5)
        assert r.feasible and simulate(p, r.schedule).time_s == r.objective_s
        assert r.bound_s is None or r.bound_s <= r.objective_s * (1 + 1e-9)
        assert r.status != Status.OPTIMAL or r.bound_s is not None


def _fuzzed_r19() -> Problem:
    """Fifteen ops; f6 makes a5.1 (read by b4) and a6.2 (1 B, read in no stage recomputing
    f6)."""
    ops = (Op("f0", False, 3.0, (), (), workspace_bytes=30), Op("f1", False, 1.0, (), (0,)),
           Op("f2", False, 3.0, (0,), (1,)), Op("f3", False, 0.0, (1,), (2,), workspace_bytes=30),
           Op("f4", False, 0.5, (1, 2), (3,), workspace_bytes=30, recompute_time_s=0.125),
           Op("f5", False, 3.0, (3,), (4,), workspace_bytes=7, recompute_time_s=0.75,
              is_random=True),
           Op("f6", False, 0.5, (0, 3), (5, 6)), Op("b0", True, 0.0, (3, 7), (8,)),
           Op("b1", True, 1.0, (2, 6, 7), (9,)), Op("b2", True, 1.0, (0, 3, 7, 9), (10,)),
           Op("b3", True, 0.0, (1, 10), (11,)), Op("b4", True, 2.0, (0, 3, 5, 7, 8), (12,)),
           Op("b5", True, 0.0, (0, 4, 5, 8, 9), (13,)), Op("b6", True, 2.0, (1, 5, 8), (14,)),
           Op("b7", True, 1.0, (4, 6, 11, 12), (15,), workspace_bytes=10, inplace_bytes=10))
    sizes = (("a1.1", 20, 1), ("a2.1", 0, 2), ("a3.1", 10, 3), ("a4.1", 10, 4), ("a5.1", 1, 5),
             ("a6.1", 20, 6), ("a6.2", 1, 6), ("tan", 1, NO_PRODUCER), ("g0", 50, 7),
             ("g1", 50, 8), ("g2", 50, 9), ("g3", 10, 10), ("g4", 20, 11), ("g5", 5, 12),
             ("g6", 10, 13), ("g7", 20, 14))
    return Problem(ops, tuple(Tensor(*t) for t in sizes), 0, forward_outputs=(3,),
                   backward_outputs=(14, 15), name="r19")


def test_checkmate_frees_an_output_nothing_reads_where_it_is_made():
    """Checkmate's rows held a recomputed output no candidate reads to the stage's end (the
    simulator frees it at once): at 182 B it proved 19.875 s optimal where the MILP's
    schedule takes 19.125 s."""
    p = _fuzzed_r19()
    milp = solve(p, 182, "milp", time_limit_s=5)
    checkmate = solve(p, 182, "checkmate", time_limit_s=5)
    assert milp.feasible and checkmate.feasible
    assert checkmate.objective_s <= milp.objective_s + 1e-9


def _fuzzed_r300() -> Problem:
    """Fourteen ops, no variants; f3 is cheap to make again at the start of the backward."""
    ops = (Op("f0", False, 2.0, (), (0,), workspace_bytes=30, recompute_time_s=0.5),
           Op("f1", False, 0.0, (0,), (1,), workspace_bytes=30, recompute_time_s=0.0),
           Op("f2", False, 3.0, (0,), (2,), is_random=True),
           Op("f3", False, 0.0, (2,), (3, 4), recompute_time_s=0.0),
           Op("f4", False, 2.0, (0, 3), (5,), workspace_bytes=7),
           Op("f5", False, 2.0, (1, 4), (6, 7)), Op("b0", True, 0.0, (0, 3, 4, 8), (9,)),
           Op("b1", True, 1.0, (2, 9), (10,), workspace_bytes=10),
           Op("b2", True, 1.0, (0, 5, 6, 9, 10), (11,), workspace_bytes=10),
           Op("b3", True, 0.0, (2, 8, 10), (12,)), Op("b4", True, 1.0, (0, 10, 11), (13,)),
           Op("b5", True, 1.0, (5, 6, 10, 12), (14,)),
           Op("b6", True, 0.0, (1, 4, 13), (15,), workspace_bytes=10),
           Op("b7", True, 2.0, (3, 13), (16,), workspace_bytes=10))
    sizes = (("a0.1", 20, 0), ("a1.1", 100, 1), ("a2.1", 5, 2), ("a3.1", 100, 3),
             ("a3.2", 100, 3), ("a4.1", 50, 4), ("a5.1", 100, 5), ("a5.2", 50, 5),
             ("tan", 10, NO_PRODUCER), ("g0", 20, 6), ("g1", 20, 7), ("g2", 0, 8), ("g3", 0, 9),
             ("g4", 20, 10), ("g5", 2, 11), ("g6", 50, 12), ("g7", 2, 13))
    return Problem(ops, tuple(Tensor(*t) for t in sizes), 100, forward_outputs=(0,),
                   backward_outputs=(13, 16), name="r300")


def test_the_cut_rounds_bound_holds_for_every_schedule():
    """A forward row charged every copy alive at the first backward op as held through the
    forward; a schedule making f3's outputs again before b0 fits in 15 s where the rounds'
    bound said 20 s (17 s at 600 B)."""
    p = _fuzzed_r300()
    for budget in (570, 600):
        fits = solve(p, budget, "evict", time_limit_s=5)
        cuts = lazy_cuts(p, budget, 5.0)
        assert fits.feasible and simulate(p, fits.schedule).peak_bytes <= budget
        assert cuts.bound_s is None or cuts.bound_s <= fits.objective_s + 1e-9


def test_a_bound_below_zero_is_raised_to_zero():
    """A program's bound of -0.005 s (auto on a small CNN, at half its activations) made a gap
    of 165 %, which the profile directory then refused as no solve's."""
    from solvers.schedule import Schedule, SolveResult, without_refuted_bound
    r = without_refuted_bound(SolveResult(
        solver="auto", status=Status.FEASIBLE, schedule=Schedule(frozenset(), ()),
        objective_s=2.0, peak_bytes=10, bound_s=-0.005, gap=1.0025, solve_time_s=1.0,
        min_feasible_bytes=10))
    assert r.bound_s == 0.0 and r.gap == 1.0 and r.status == Status.FEASIBLE
