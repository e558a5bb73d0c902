"""NOTE [A coarser program aside]: where the MILP has no start, a ladder of coarser programs
searches on the idle core, each rung only past a proved infeasibility of the one before."""
from __future__ import annotations

import dataclasses
import math
import random

from solvers import coarse, joint, schedule_from_kept, simulate, solve
from solvers.least import least_peak
from solvers.milp import MilpOptions
from solvers.mip import MipResult
from solvers.schedule import Status
from tests.problems import autodiff_problem

# variable limits small enough that this problem's whole program merges stages and two
# coarser programs differ from it
SMALL = MilpOptions(max_held_vars=60, max_recompute_vars=60, time_limit_s=6.0)


def _problem():
    return autodiff_problem(16, random.Random(3))


def _store_all_peak(p) -> int:
    return simulate(p, schedule_from_kept(p, p.saved_for_backward)).peak_bytes


def _mid_budget(p) -> int:
    least = solve(p, 10 ** 12, "auto", time_limit_s=2).min_feasible_bytes
    return (least + _store_all_peak(p)) // 2


def test_the_rungs_are_coarser_and_distinct():
    p = _problem()
    rungs = coarse.rungs(p, SMALL)
    assert rungs == [(60, 15), (30, 60)]
    assert coarse.rungs(p, MilpOptions()) == []  # nothing coarser than an exact program


def test_the_ladder_goes_on_only_past_a_proved_infeasibility(monkeypatch):
    p = _problem()
    budget = _mid_budget(p)
    real, calls = coarse.solve_program, []

    def first_rung(status):
        def fake(program, options, start):
            calls.append(program.st.window)
            if len(calls) == 1:
                return MipResult(status, None, None, None), None
            return real(program, options, start)
        return fake

    monkeypatch.setattr(coarse, "solve_program", first_rung("infeasible"))
    found = coarse.ladder(p, budget, SMALL, 5.0)
    assert found is not None and found[0] == (30, 60) and len(calls) == 2
    assert simulate(p, found[1]).peak_bytes <= budget
    calls.clear()
    monkeypatch.setattr(coarse, "solve_program", first_rung("timeout"))
    assert coarse.ladder(p, budget, SMALL, 5.0) is None and len(calls) == 1


def _no_heuristic_fits(monkeypatch):
    """joint.milp's heuristics made to find nothing within the budget."""
    real = joint._heuristic

    def none_fit(problem, budget_bytes, deadline):
        r = real(problem, budget_bytes, deadline)
        return dataclasses.replace(r, status=Status.INFEASIBLE, schedule=None, objective_s=None,
                                   peak_bytes=None)
    monkeypatch.setattr(joint, "_heuristic", none_fit)


def test_the_milp_without_a_start_takes_the_coarser_programs_schedule(monkeypatch):
    p = _problem()
    budget = _mid_budget(p)
    monkeypatch.setattr(coarse, "MIN_OPS", 0)
    _no_heuristic_fits(monkeypatch)
    monkeypatch.setattr(joint, "_best_start", lambda *args: None)
    monkeypatch.setattr(joint, "solve_program",
                        lambda program, options, start: (MipResult("timeout", None, None, None),
                                                         None))
    r = joint.milp(p, budget, SMALL)
    assert r.feasible and r.peak_bytes <= budget
    assert "coarser program" in r.note
    memory_centric = simulate(p, least_peak(p, SMALL)[1])
    assert r.objective_s < memory_centric.time_s


def test_no_ladder_where_the_milp_has_a_start(monkeypatch):
    p = _problem()
    started = []
    monkeypatch.setattr(coarse, "MIN_OPS", 0)
    monkeypatch.setattr(coarse, "start", lambda *args: started.append(args))
    r = joint.milp(p, _store_all_peak(p) - 1, SMALL)  # a heuristic's schedule fits
    assert r.feasible and started == []


def test_the_ladder_begins_before_the_bound_and_stops_where_the_rounding_fits(monkeypatch):
    """NOTE [The ladder's head start]: begun as soon as no heuristic fits, before the bound and
    the relaxation; stopped (its answer unused) where the relaxation's rounding fits."""
    p = _problem()
    events, heuristic = [], joint._heuristic
    monkeypatch.setattr(coarse, "MIN_OPS", 0)
    _no_heuristic_fits(monkeypatch)
    real_start, real_bound, real_cancel = coarse.start, joint.boundary_bound, coarse.cancel
    monkeypatch.setattr(coarse, "start", lambda *a: events.append("ladder") or real_start(*a))
    monkeypatch.setattr(joint, "boundary_bound", lambda *a: events.append("bound") or
                        real_bound(*a))
    monkeypatch.setattr(coarse, "cancel", lambda aside: events.append(
        "stopped" if aside is not None else "none") or real_cancel(aside))
    monkeypatch.setattr(coarse, "collect", lambda aside, *a: events.append(
        "collected" if aside is not None else "nothing aside"))
    # a start found after all (as the relaxation's rounding may be): the heuristic's schedule
    monkeypatch.setattr(joint, "_best_start", lambda problem, budget, *a:
                        heuristic(problem, budget, math.inf).schedule)
    r = joint.milp(p, _store_all_peak(p) - 1, SMALL)  # a heuristic's schedule fits there
    assert r.feasible
    assert events[:3] == ["ladder", "bound", "stopped"] and "nothing aside" in events, events
