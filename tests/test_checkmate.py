"""Checkmate's MILP (the baseline) on problems where it went wrong. No torch."""
from __future__ import annotations

from solvers import NO_PRODUCER, Op, Problem, Tensor, solve


def _fuzzed_r75() -> Problem:
    """A problem the solvers fuzzing drew (2026-12-02): nine ops, two of them writing into a
    dying input."""
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


def test_a_huge_budget_gives_store_alls_time():
    """Built at 2**63 - 1, the program's row bounds (~9e18) broke HiGHS: 11.0 s called
    optimal where store-all, within the budget, takes 9.5 s (2**60: 11.5 s)."""
    p = _fuzzed_r75()
    store_all = solve(p, 2**63 - 1, "store_all")
    for budget in (10**15, 2**60, 2**63 - 1):
        r = solve(p, budget, "checkmate", time_limit_s=5)
        assert r.feasible and r.objective_s == store_all.objective_s
