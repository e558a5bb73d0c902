"""Problems the solvers fuzzing drew (2026-12-06): sizes at a GPU's scale, lists for tuples,
and variants that save time beside store-all. No torch."""
from __future__ import annotations

import pytest

from solvers import (NO_PRODUCER, InvalidProblemError, Op, Problem, Schedule, Status, Tensor,
                     Variant, simulate, solve)


def _chain(g: int) -> Problem:
    """Nine ops of ~`g`-byte tensors, one of them random."""
    ops = (Op("f0", False, 1.0, (), (0,)),
           Op("f1", False, 1.0, (0,), (1, 2)),
           Op("f2", False, 1.0, (0,), (3,), is_random=True, state_bytes=1),
           Op("f3", False, 1.0, (2,), (4, 5)),
           Op("b3", True, 1.0, (6, 2, 5), (7,)),
           Op("b2", True, 1.0, (6, 0, 3), (8,)),
           Op("b1", True, 1.0, (7, 0, 2), (9,)),
           Op("b0", True, 1.0, (9, 8), (10,)),
           Op("acc", True, 1.0, (9, 8), (11,)))
    sizes = (("a0", g, 0), ("a1", g + 1, 1), ("a1b", g + 1, 1), ("a2", g + 1, 2), ("a3", 1, 3),
             ("a3b", g // 2, 3), ("tangent", 10, NO_PRODUCER), ("g3", 0, 4), ("g2", g // 2, 5),
             ("g1", 1, 6), ("g0", g + 1, 7), ("acc", 1, 8))
    return Problem(ops, tuple(Tensor(*t) for t in sizes), 101, forward_outputs=(5,),
                   backward_outputs=(11,))


@pytest.mark.parametrize("solver", ["milp", "auto"])
def test_gibibyte_tensors_a_byte_under_store_alls_peak(solver):
    """NOTE [Rows that must hold to the byte]: the MILP's schedule of 1 GiB tensors peaked 1 B
    over the budget its program held it to, and the solve raised "its memory rows are wrong"
    (from 16 MiB tensors up; 1 KiB ones solved)."""
    p = _chain(1 << 30)
    budget = solve(p, 1 << 40, "store_all").peak_bytes - 1
    r = solve(p, budget, solver, time_limit_s=5)
    assert r.feasible and simulate(p, r.schedule).peak_bytes <= budget


def test_checkmate_meets_store_alls_time_at_its_peak():
    """Checkmate called a 5.0 s schedule optimal at store-all's peak with 12 MiB tensors, where
    store-all (4.5 s) fits; with its rows held a band under the budget, store-all is a
    candidate of its own."""
    m = 12 << 20
    ops = (Op("f0", False, 2.0, (), (0,)), Op("f1", False, 1.0, (), (1,), recompute_time_s=0.5),
           Op("b1", True, 0.5, (2, 1), (3,)), Op("b0", True, 1.0, (2, 0, 1), (4,)))
    sizes = (("a0", 10, 0), ("a1", m, 1), ("tan", m, NO_PRODUCER), ("g1", 1, 2), ("g0", 0, 3))
    p = Problem(ops, tuple(Tensor(*t) for t in sizes), 100, forward_outputs=(1,),
                backward_outputs=(4,))
    store_all = solve(p, 1 << 40, "store_all")
    r = solve(p, store_all.peak_bytes, "checkmate", time_limit_s=5)
    assert r.objective_s == store_all.objective_s == 4.5


def test_a_step_past_any_device_is_refused():
    """A two-op step of a 1 PiB tensor passed the checks (their bound was 2**60) and got a
    schedule dropping the tensor its backward reads from the least-peak program."""
    def two_ops(k: int) -> Problem:
        big = 1 << k
        return Problem((Op("f0", False, 3.0, (), (0,), recompute_time_s=0.0),
                        Op("b0", True, 1.0, (1, 0), (2,))),
                       (Tensor("a0", big, 0), Tensor("tangent", big - 1, NO_PRODUCER),
                        Tensor("g0", 1, 1)), 0, forward_outputs=(0,), backward_outputs=(2,))
    assert solve(two_ops(46), 1 << 48, "auto", time_limit_s=2).objective_s == 4.0
    with pytest.raises(InvalidProblemError, match="past any device"):
        two_ops(47)  # each tensor under 2**48 B, together 2**48
    with pytest.raises(InvalidProblemError, match="absurd"):
        two_ops(50)


def test_lists_for_tuples_solve_like_tuples():
    """A problem built with lists passed its checks, then "auto", "milp" and "checkmate" died
    deep inside (unhashable type: 'list')."""
    def chain(seq) -> Problem:
        return Problem(ops=seq([Op("f0", False, 1.0, seq([]), seq([0])),
                                Op("f1", False, 1.0, seq([0]), seq([1])),
                                Op("b1", True, 1.0, seq([2, 0]), seq([3])),
                                Op("b0", True, 1.0, seq([3]), seq([4]))]),
                       tensors=seq([Tensor("a", 10, 0), Tensor("b", 10, 1),
                                    Tensor("tan", 10, NO_PRODUCER), Tensor("g1", 10, 2),
                                    Tensor("g0", 10, 3)]),
                       fixed_bytes=0, forward_outputs=seq([1]), backward_outputs=seq([4]))
    listed, tupled = chain(list), chain(tuple)
    assert listed == tupled and hash(listed.ops[0]) == hash(tupled.ops[0])
    for solver in ("auto", "milp", "checkmate"):
        assert solve(listed, 35, solver, time_limit_s=2).objective_s == \
            solve(tupled, 35, solver, time_limit_s=2).objective_s


def test_auto_searches_on_where_a_variant_saves_time_beside_store_all():
    """NOTE [Close enough]: store-all fit, so "auto" settled at 4.0 s; a faster variant's
    encode op run in the backward beside store-all's kept set takes 3.5 s within the budget
    (store-all with that variant does not fit)."""
    ops = (Op("f0", False, 0.0, (), (0,)),
           Op("f1", False, 1.0, (0,), (1,), workspace_bytes=5),
           Op("enc0", False, 0.0, (0,), (3,)),
           Op("b1", True, 1.0, (2, 0), (4,)),
           Op("b0", True, 2.0, (4, 0), (5,)))
    sizes = (("a0", 50, 0), ("a1", 1, 1), ("tangent", 20, NO_PRODUCER), ("m0", 2, 2),
             ("g1", 1, 3), ("g0", 10, 4))
    p = Problem(ops, tuple(Tensor(*t) for t in sizes), 0, forward_outputs=(1,),
                backward_outputs=(5,),
                variants=(Variant("v0", 4, 0, (3,), (2,), -0.5, 0),
                          Variant("w0", 4, 0, (), (), 1.0, 0)))
    budget = 72
    assert solve(p, budget, "store_all").objective_s == 4.0
    faster = simulate(p, Schedule(kept=frozenset({0}), backward=(3, 2, 4),
                                  variants=frozenset({0})))
    assert faster.peak_bytes <= budget and faster.time_s == 3.5
    assert solve(p, budget, "auto", time_limit_s=5).objective_s == 3.5


def _tensors(*sizes: tuple[str, int, int]) -> tuple[Tensor, ...]:
    return tuple(Tensor(*t) for t in sizes)


def test_a_schedule_in_the_band_under_the_budget_is_not_claimed_beaten():
    """NOTE [Rows that must hold to the byte]: "milp" held its rows 1,489 B under a budget a
    6.25 s schedule peaks at exactly, and called its 6.75 s optimal (bound 6.75)."""
    mb = 107258368
    ops = (Op("f0", False, 0.5, (), (0,)),
           Op("f1", False, 0.0, (), (1,), workspace_bytes=324380160,
              recompute_time_s=0.25),
           Op("f2", False, 2.0, (0,), (2,), workspace_bytes=324380160,
              recompute_time_s=0.25),
           Op("f3", False, 0.0, (2,), (3,), is_random=True),
           Op("b3", True, 1.0, (4, 2), (5,)), Op("b2", True, 0.0, (5, 0), (6,)),
           Op("b1", True, 1.0, (4,), (7,), workspace_bytes=mb),
           Op("b0", True, 1.0, (6, 3), (8,), workspace_bytes=mb))
    p = Problem(ops, _tensors(("a0", 217418752, 0), ("a1", mb, 1), ("a2", 527276544, 2),
                              ("a3", mb, 3), ("tangent", 217418752, NO_PRODUCER),
                              ("g3", 527276544, 4), ("g2", 0, 5), ("g1", 1058068992, 6),
                              ("g0", 527276544, 7)),
                0, forward_outputs=(3,), backward_outputs=(8, 3))
    fits = simulate(p, Schedule(kept=frozenset({0, 2}), backward=(4, 5, 6, 0, 2, 3, 7)))
    budget = 1489390592
    assert fits.peak_bytes <= budget and fits.time_s == 6.25
    for solver in ("milp", "checkmate"):
        r = solve(p, budget, solver, time_limit_s=5)  # Checkmate's space finds none there
        assert r.bound_s is None or r.bound_s <= fits.time_s, solver
        assert r.status is not Status.OPTIMAL or r.objective_s <= fits.time_s, solver


def test_the_boundary_bound_at_gibibytes_is_no_schedules_time_above():
    """HiGHS called the 1-cut bound program's optimum 8.2 s for 2 GiB tensors, where a schedule
    of 8.1 s fits the budget: "auto" called its 8.2 s optimal. Its rows now take the band
    beyond the budget (a bound may only be lower)."""
    ws, big = 433349799, 2180496827
    ops = (Op("f0", False, 2.0, (), (0,), recompute_time_s=0.5),
           Op("f1", False, 2.0, (), (1,), workspace_bytes=1306393083),
           Op("enc1", False, 0.0, (1,), (3,)), Op("enc0", False, 0.1, (0,), (4,)),
           Op("b1", True, 1.0, (2, 1), (5,), workspace_bytes=ws),
           Op("b0", True, 2.0, (2, 0), (6,), workspace_bytes=ws),
           Op("acc", True, 1.0, (6, 5), (7,), workspace_bytes=ws))
    p = Problem(ops, _tensors(("a0", big, 0), ("a1", big, 1), ("tangent", 894713057, NO_PRODUCER),
                              ("m1", 102938545, 2), ("m0", 0, 3), ("g1", 0, 4), ("g0", ws, 5),
                              ("acc", 651699103, 6)),
                0, forward_outputs=(1,), backward_outputs=(7,),
                variants=(Variant("v1", 4, 1, (3,), (2,), 0.2, -ws),
                          Variant("v0", 5, 0, (4,), (3,), 0.0, -ws),
                          Variant("w0", 5, 0, (), (), 1.0, 0)))
    budget = solve(p, 1 << 47, "store_all").peak_bytes - 1
    fits = simulate(p, Schedule(kept=frozenset({1, 4}), backward=(4, 5, 6),
                                variants=frozenset({1})))
    assert fits.peak_bytes <= budget and fits.time_s == pytest.approx(8.1)
    r = solve(p, budget, "auto", time_limit_s=5)
    assert r.bound_s <= fits.time_s + 1e-9
    assert r.status is not Status.OPTIMAL or r.objective_s <= fits.time_s + 1e-9
