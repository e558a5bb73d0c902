"""NOTE [Nothing cheap fits]: where no heuristic and no lower-set schedule fits, "auto" gives
the joint MILP most of its time, since only the MILP can make a fast schedule there."""
from __future__ import annotations

import dataclasses
import random
import time

import pytest

from solvers import baselines, joint, registry, remat, solve
from solvers.milp import MilpOptions
from solvers.mip import MipResult
from solvers.windows import Refined
from tests.problems import autodiff_problem, budget_between

LIMIT_S = 12.0


def _milp_options(monkeypatch, problem, budget, limit_s=LIMIT_S):
    """auto's result at `budget` and the options it gave the MILP."""
    given = []
    _, options = registry._REGISTRY["milp"]

    def recorded(p, b, o):
        given.append(o)
        return joint.milp(p, b, o)

    monkeypatch.setitem(registry._REGISTRY, "milp", (recorded, options))
    return solve(problem, budget, "auto", time_limit_s=limit_s), given


def _milp_limits(monkeypatch, problem, budget):
    """auto's result at `budget` and the time limits it gave the MILP."""
    result, given = _milp_options(monkeypatch, problem, budget)
    return result, [o.time_limit_s for o in given]


def _no_remat(monkeypatch):
    """Rematerializing (solvers/remat.py) reaches this small problem's least peak, so that
    some heuristic always fits there; the rule under test is for where none does, as on
    larger graphs, so store-all stands in for it here."""
    def store_all(p, b, _options):
        return dataclasses.replace(baselines.store_all(p, b, baselines.BaselineOptions()),
                                   solver="remat")

    monkeypatch.setitem(registry._REGISTRY, "remat", (store_all, remat.RematOptions))


def _no_rounds(monkeypatch):
    """The cut program's rounds (NOTE [Cuts where the schedule goes over] in solvers/
    lazy_cuts.py) fit this small problem's least peak and prove their schedule close enough
    (NOTE [Proven close enough]), so that auto stops before the MILP; on larger graphs they
    need more than their share, so here they get none."""
    monkeypatch.setattr(registry, "AUTO_CUTS_SHARE", 0.0)
    monkeypatch.setattr(registry, "AUTO_FLOOR_CUTS_SHARE", 0.0)


@pytest.mark.parametrize("coarsened", [False, True])
def test_near_the_least_peak_the_milp_gets_most_of_autos_time(monkeypatch, coarsened):
    monkeypatch.setattr(registry, "_coarsened", lambda problem: coarsened)
    _no_remat(monkeypatch)
    _no_rounds(monkeypatch)
    p = autodiff_problem(8, random.Random(3))
    least = solve(p, 10 ** 12, "auto", time_limit_s=2).min_feasible_bytes
    assert not any(r.feasible for r in registry._cheap(p, least))
    assert not solve(p, least, "dp").feasible
    at_floor, limits = _milp_limits(monkeypatch, p, least)
    assert at_floor.feasible and at_floor.peak_bytes <= least
    assert len(limits) == 1 and limits[0] >= LIMIT_S / 2
    # where a heuristic fits (store-all does not), the MILP gets its share less fine
    # windows' (and annealing's, where coarsened) as before
    everything = registry._cheap(p, 10 ** 12)
    cheap_fits = min(r.min_feasible_bytes for r in everything[1:])
    assert least < cheap_fits < everything[0].peak_bytes
    assert any(r.feasible for r in registry._cheap(p, cheap_fits))
    above, limits_above = _milp_limits(monkeypatch, p, cheap_fits)
    assert above.feasible and len(limits_above) == 1
    assert limits_above[0] < limits[0] / 2


class _Clock:
    """time.perf_counter, `skipped` seconds ahead: work that takes long, without the wait."""
    def __init__(self) -> None:
        self.skipped = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.skipped


class _Stop(Exception):
    pass


def test_near_the_least_peak_the_milp_leaves_polishing_its_time(monkeypatch):
    """NOTE [Nothing cheap fits]: the MILP gets annealing's and fine windows' shares, no more:
    it is to end polishing's share before auto's deadline, so that auto keeps to its limit
    (it used to get half of fine windows' share again: at U-Net's least peak auto took 65.7 s
    of 60). A least-peak program of 15 s is played by a clock that skips ahead."""
    _no_remat(monkeypatch)
    _no_rounds(monkeypatch)
    p = autodiff_problem(8, random.Random(3))
    least = solve(p, 10 ** 12, "auto", time_limit_s=2).min_feasible_bytes
    clock = _Clock()
    monkeypatch.setattr(registry, "time", clock)
    program = registry.least.least_peak

    def slow(problem, options):
        clock.skipped += 15.0
        return program(problem, options)

    monkeypatch.setattr(registry.least, "least_peak", slow)
    calls = []

    def milp(problem, budget, options):
        calls.append((clock.perf_counter(), options.time_limit_s))
        raise _Stop

    monkeypatch.setitem(registry._REGISTRY, "milp", (milp, MilpOptions))
    limit = 60.0
    begun = clock.perf_counter()
    with pytest.raises(_Stop):
        solve(p, least, "auto", time_limit_s=limit)
    (at, given), = calls
    assert at - begun >= 15.0 and given >= limit / 2
    polish_s = min(registry.AUTO_POLISH_TIME_LIMIT_S, limit / 6)
    assert at + given <= begun + limit - polish_s + 1.0  # the heuristics take well under 1 s


def test_near_the_least_peak_the_cut_rounds_get_the_floors_share(monkeypatch):
    """NOTE [Rounds near the floor] (solvers/lazy_cuts.py): where nothing cheap fits within
    AUTO_FLOOR_CUTS_NEAR of the heuristics' least peak, the cut rounds get AUTO_FLOOR_CUTS_SHARE
    of auto's limit; beyond that margin, or where a heuristic fits, AUTO_CUTS_SHARE."""
    _no_remat(monkeypatch)
    p = autodiff_problem(8, random.Random(3))
    least = solve(p, 10 ** 12, "auto", time_limit_s=2).min_feasible_bytes
    everything = registry._cheap(p, 10 ** 12)
    cheap_fits = min(r.min_feasible_bytes for r in everything[1:])
    assert least < cheap_fits
    given = []
    rounds = registry.lazy_cuts

    def recorded(problem, budget, limit_s):
        given.append(limit_s)
        return rounds(problem, budget, limit_s)

    monkeypatch.setattr(registry, "lazy_cuts", recorded)
    limit = 4.0
    for budget in (least, cheap_fits):
        assert solve(p, budget, "auto", time_limit_s=limit).feasible
    monkeypatch.setattr(registry, "AUTO_FLOOR_CUTS_NEAR", -1.0)  # no budget is near
    assert solve(p, least, "auto", time_limit_s=limit).feasible
    assert registry.AUTO_FLOOR_CUTS_SHARE < registry.AUTO_CUTS_SHARE
    assert given == pytest.approx([limit * registry.AUTO_FLOOR_CUTS_SHARE,
                                   limit * registry.AUTO_CUTS_SHARE,
                                   limit * registry.AUTO_CUTS_SHARE])


def test_the_whole_program_is_not_run_again_from_a_schedule_it_did_not_find(monkeypatch):
    """Where the MILP's whole program finds nothing, windows refine the memory-centric
    program's schedule, and the time left goes back to auto, not to the whole program from
    that schedule, which it does not leave (NOTE [Nothing cheap fits])."""
    p = autodiff_problem(8, random.Random(3))
    least = solve(p, 10 ** 12, "auto", time_limit_s=2).min_feasible_bytes
    calls = []

    def finds_nothing(program, options, start):
        calls.append(start)
        return MipResult("timeout", None, None, None), None

    monkeypatch.setattr(joint, "solve_program", finds_nothing)
    r = joint.milp(p, least, MilpOptions(time_limit_s=LIMIT_S))
    assert r.feasible and r.peak_bytes <= least
    assert calls == [None], "the whole program ran again"
    assert "windows of stages" in r.note and "again" not in r.note


def test_without_a_start_the_whole_program_gets_the_larger_share(monkeypatch):
    """NOTE [No start, longer search]: the whole program's share of the time left is
    NO_START_SHARE where nothing starts it, WHOLE_PROGRAM_SHARE where a schedule does."""
    _no_remat(monkeypatch)  # its least peak is no start for the MILP: its own heuristics' is
    p = autodiff_problem(8, random.Random(3))
    least = solve(p, 10 ** 12, "auto", time_limit_s=2).min_feasible_bytes
    everything = registry._cheap(p, 10 ** 12)
    cheap_fits = min(r.min_feasible_bytes for r in everything[1:])
    calls = []

    def finds_nothing(program, options, start):
        calls.append((time.perf_counter(), options.time_limit_s, start))
        return MipResult("timeout", None, None, None), None

    monkeypatch.setattr(joint, "solve_program", finds_nothing)
    shares = []
    for budget in (least, cheap_fits):
        calls.clear()
        begun = time.perf_counter()
        joint.milp(p, budget, MilpOptions(time_limit_s=LIMIT_S))
        at, given, start = calls[0]
        shares.append((start is None, given / (begun + LIMIT_S - at)))
    (no_start, share_none), (with_start, share_start) = shares
    assert no_start and not with_start
    assert share_none == pytest.approx(joint.NO_START_SHARE, abs=0.05)
    assert share_start == pytest.approx(joint.WHOLE_PROGRAM_SHARE, abs=0.05)


def _the_program_finds_nothing(monkeypatch, p) -> int:
    """p's least peak; then the MILP's whole program finds nothing, nothing starts it, and
    windows of stages cannot move a schedule (as where the program is coarsened)."""
    least = solve(p, 10 ** 12, "milp", time_limit_s=4).min_feasible_bytes

    def finds_nothing(program, options, start):
        return MipResult("infeasible", None, None, None), None

    monkeypatch.setattr(joint, "solve_program", finds_nothing)
    monkeypatch.setattr(joint, "_best_start", lambda *args: None)
    monkeypatch.setattr(joint.windows, "refine",
                        lambda program, s, options, deadline: Refined(s, 0.0, 0, 1, 0))
    return least


@pytest.mark.parametrize("seed", [3, 5])
def test_time_left_near_the_floor_goes_to_fine_windows(monkeypatch, seed):
    """NOTE [Time left near the floor]: where the whole program and its windows find nothing
    and the memory-centric program's schedule is returned early, the MILP solver refines it by
    fine windows in the time left (never slower, and within the budget); "auto", which refines
    its best itself, turns that off."""
    p = autodiff_problem(10, random.Random(seed))
    budget = int(_the_program_finds_nothing(monkeypatch, p) * 1.1)
    kept = joint.milp(p, budget, MilpOptions(time_limit_s=LIMIT_S, refine_left=False))
    refined = joint.milp(p, budget, MilpOptions(time_limit_s=LIMIT_S))
    assert "memory-centric program's" in kept.note and "near the floor" not in kept.note
    assert refined.feasible and refined.peak_bytes <= budget
    assert refined.objective_s < kept.objective_s * (1 - 1e-6)
    assert "fine windows with the time left" in refined.note
    assert refined.solve_time_s < LIMIT_S + 1


@pytest.mark.parametrize("seed", [1, 3])
def test_time_left_near_the_floor_prunes_first(monkeypatch, seed):
    """NOTE [Time left near the floor]: before fine windows, the time left drops the
    recomputation the memory-centric program's schedule can do without (here windows move
    nothing, so what is gained is pruning's)."""
    p = autodiff_problem(10, random.Random(seed))
    least = _the_program_finds_nothing(monkeypatch, p)
    monkeypatch.setattr(joint.fine, "refine",
                        lambda problem, budget, s, deadline, options: Refined(s, 0.0, 0, 1, 0))
    kept = joint.milp(p, least, MilpOptions(time_limit_s=LIMIT_S, refine_left=False))
    pruned = joint.milp(p, least, MilpOptions(time_limit_s=LIMIT_S))
    assert pruned.feasible and pruned.peak_bytes <= least
    assert pruned.objective_s < kept.objective_s * (1 - 1e-6)
    assert "recomputations it could do without dropped" in pruned.note


def test_auto_refines_the_milps_schedule_itself(monkeypatch):
    """auto gives the MILP refine_left=False (NOTE [Time left near the floor]): fine windows
    on its best come out of auto's own share."""
    p = autodiff_problem(8, random.Random(3))
    _no_rounds(monkeypatch)
    least = solve(p, 10 ** 12, "auto", time_limit_s=2).min_feasible_bytes
    _, given = _milp_options(monkeypatch, p, least, limit_s=4)
    assert [o.refine_left for o in given] == [False]


def test_the_least_peak_said_is_no_higher_than_the_schedule_found(monkeypatch):
    """Where every least-peak search ends above a schedule "auto" found within the budget (a
    start, a polished one: GPT-2 narrow at batch 39 had a plan within 300 MiB where they said
    466.9 MiB), the least peak it reports is no higher than that schedule's."""
    p = autodiff_problem(8, random.Random(3))
    budget = budget_between(p, 0.5)
    calls = []
    searched = registry.floor_of

    def searches_ending_high(candidates):  # the first call gathers the searches' floors
        calls.append(1)
        return (1 << 40, None) if len(calls) == 1 else searched(candidates)

    monkeypatch.setattr(registry, "floor_of", searches_ending_high)
    result = solve(p, budget, "auto", time_limit_s=2)
    assert calls and result.feasible and result.min_feasible_bytes <= result.peak_bytes
