"""NOTE [Least peaks remembered]: a least budget once reported is met on any later solve of the
same profile, even when the search that found it is cut short by the clock next time."""
from __future__ import annotations

import copy
import dataclasses
import json
import random
import re
import warnings
from pathlib import Path

import pytest
import torch

import monet_opt
import solvers
from monet_opt import cache_files
from monet_opt.cache import ProfileCacheWarning
from solvers import Schedule, SolveResult, Status, joint, least, registry, simulate
from solvers.remembered import fitting
from solvers.milp import MilpOptions
from tests import models
from tests.problems import autodiff_problem, chain, diamonds
from tests.test_cache import HUGE, Calls, Direct


@pytest.fixture
def direct(monkeypatch):
    return Direct(Calls(monkeypatch))


def test_auto_returns_the_schedule_of_its_least_peak():
    problem = chain(8, size=10, fixed=100)
    result = solvers.solve(problem, HUGE)
    assert result.floor_schedule is not None
    assert simulate(problem, result.floor_schedule).peak_bytes == result.min_feasible_bytes
    assert result.min_feasible_bytes < result.peak_bytes  # store-all is not the least peak


@pytest.mark.parametrize("name", ["evict", "dp", "milp"])
@pytest.mark.parametrize("budget", [HUGE, 0])
def test_each_solver_returns_the_schedule_of_its_least_peak(name, budget):
    """NOTE [The least peak's schedule] (solvers/evict.py): eviction's least peak came with no
    schedule, so auto's least peak, where it was eviction's, could not be recalled."""
    problem = chain(8, size=10, fixed=100)
    result = solvers.solve(problem, budget, name, time_limit_s=5)
    assert result.floor_schedule is not None
    assert simulate(problem, result.floor_schedule).peak_bytes == result.min_feasible_bytes


def test_a_known_schedule_meets_its_own_peak_and_lowers_the_least_peak():
    problem = chain(8, size=10, fixed=100)
    floor = solvers.solve(problem, HUGE).floor_schedule
    least = simulate(problem, floor).peak_bytes
    assert not solvers.solve(problem, least, "store_all").feasible
    met = solvers.solve(problem, least, "store_all", known=[floor])
    assert met.feasible and met.schedule == floor and met.peak_bytes == least
    assert met.min_feasible_bytes == least and "remembered" in met.note
    below = solvers.solve(problem, least - 1, "store_all", known=[floor])
    assert not below.feasible and below.min_feasible_bytes == least


def test_a_schedule_of_another_graph_is_ignored():
    problem = chain(8, size=10, fixed=100)
    foreign = solvers.solve(diamonds(3), HUGE).floor_schedule
    with pytest.raises(solvers.InvalidScheduleError):
        simulate(problem, foreign)

    def chen(known):
        r = solvers.solve(problem, HUGE, "chen", known=known)
        return dataclasses.replace(r, solve_time_s=0.0)
    assert chen([foreign]) == chen([Schedule(frozenset({999}), ())]) == chen([])


def _cut_short(real_auto):
    """'auto' as if its clock had stopped every search early: no schedule within the budget,
    a least peak 1000 B higher than the real one."""
    def auto(problem, budget_bytes, time_limit_s, least_start=None, candidates=(),
             least_peak=True):
        real = real_auto(problem, budget_bytes, time_limit_s, least_start, candidates,
                         least_peak)
        return SolveResult(solver="auto", status=Status.INFEASIBLE, schedule=None,
                           objective_s=None, peak_bytes=None, bound_s=real.bound_s, gap=None,
                           solve_time_s=0.0, min_feasible_bytes=real.min_feasible_bytes + 1000)
    return auto


def test_the_profile_directory_remembers_the_least_peak(direct, monkeypatch):
    first = direct.solve(HUGE)
    path, = Path("profiles").glob("*/least-peak-auto.json")
    stored = json.loads(path.read_text())
    assert stored["peak_bytes"] == first.min_feasible_bytes
    least = first.min_feasible_bytes
    monkeypatch.setattr(registry, "_auto", _cut_short(registry._auto))
    again = direct.solve(least)
    assert again.feasible and again.peak_bytes <= least
    assert again.min_feasible_bytes == least and "remembered" in again.note
    # a cached answer reports the remembered least peak too
    assert direct.solve(HUGE).min_feasible_bytes == least


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d.update(peak_bytes=d["peak_bytes"] - 1), "mismatched: it claims peak"),
    (lambda d: d["schedule"].update(backward=d["schedule"]["backward"][1:]),
     "fails the simulator"),
    (lambda d: d.pop("schedule"), "malformed"),
])
def test_a_damaged_least_peak_file_is_reported_and_not_used(direct, monkeypatch, damage,
                                                            reason):
    least = direct.solve(HUGE).min_feasible_bytes
    path, = Path("profiles").glob("*/least-peak-auto.json")
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(cache_files.signed(data)))
    monkeypatch.setattr(registry, "_auto", _cut_short(registry._auto))
    with pytest.warns(ProfileCacheWarning, match=re.escape(str(path)) + ".*" + reason):
        refused = direct.solve(least)
    assert not refused.feasible and refused.min_feasible_bytes == least + 1000


def test_another_profiles_least_peak_file_is_passed_over_and_replaced(direct, monkeypatch):
    """Two DDP ranks profiling one model at once leave the least-peak file of the profile that
    lost the race to profile.json: the other's every later solve warned it "mismatched: made
    on another profile" and removed it. Now passed over in silence, as no file, and replaced
    by the next least found."""
    least = direct.solve(HUGE).min_feasible_bytes
    path, = Path("profiles").glob("*/least-peak-auto.json")
    data = json.loads(path.read_text())
    data["key"].update(profile_sha256="0" * 64)
    path.write_text(json.dumps(cache_files.signed(data)))
    real = registry._auto
    monkeypatch.setattr(registry, "_auto", _cut_short(real))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refused = direct.solve(least)  # not known: the search, cut short, ends above it
        assert not refused.feasible and refused.min_feasible_bytes == least + 1000
        monkeypatch.setattr(registry, "_auto", real)
        assert direct.solve(HUGE - 1).min_feasible_bytes == least
    assert json.loads(path.read_text())["key"]["profile_sha256"] != "0" * 64


def test_a_lower_least_peak_replaces_the_stored_one(direct, monkeypatch):
    least = direct.solve(HUGE).min_feasible_bytes
    path, = Path("profiles").glob("*/least-peak-auto.json")
    real = registry._auto

    def higher(problem, budget_bytes, time_limit_s, least_start=None, candidates=(),
               least_peak=True):
        r = real(problem, budget_bytes, time_limit_s, least_start, candidates, least_peak)
        return dataclasses.replace(r, min_feasible_bytes=r.min_feasible_bytes + 1000,
                                   floor_schedule=None)
    monkeypatch.setattr(registry, "_auto", higher)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert direct.solve(HUGE - 1).min_feasible_bytes == least
    assert json.loads(path.read_text())["peak_bytes"] == least


def test_the_least_peak_program_reports_a_known_schedule(monkeypatch):
    """MilpOptions.least_start: a known schedule lower than Chen's least peak is reported by a
    memory-centric program stopped before it finds anything, not Chen's; the program searches
    from Chen's schedules all the same (NOTE [The least peak where store-all fits]: from a
    brief search's schedule it stayed there, 324.9 MiB on a ResNet-50 where from Chen's it
    reached 293.9 MiB)."""
    for seed in range(20):
        rng = random.Random(seed)
        problem = autodiff_problem(20, rng)
        chen = solvers.solve(problem, HUGE, "chen").min_feasible_bytes
        found = solvers.solve(problem, HUGE, "milp", time_limit_s=5)
        if found.floor_schedule is not None and found.min_feasible_bytes < chen:
            break
    else:
        pytest.fail("no random DAG where the MILP's least peak is below Chen's")
    warm = []
    monkeypatch.setattr(least, "solve_program",
                        lambda program, options, start: warm.append(start) or (None, None))
    joint.least_peak.cache_clear()
    assert joint.least_peak(problem, MilpOptions(time_limit_s=1.0))[0] == chen
    started = MilpOptions(time_limit_s=1.0, least_start=found.floor_schedule)
    assert joint.least_peak(problem, started) == (found.min_feasible_bytes, found.floor_schedule)
    assert warm and all(solvers.simulate(problem, w).peak_bytes == chen for w in warm)


def _searches_cut_short(monkeypatch):
    """'auto' as if its clock had stopped the MILP, the DP, rematerializing and the bound's
    kept sets before they found anything (the other heuristics, polishing and windows still
    run)."""
    def nothing(problem, budget_bytes, options):
        return SolveResult(solver="cut", status=Status.TIMEOUT, schedule=None, objective_s=None,
                           peak_bytes=None, bound_s=None, gap=None, solve_time_s=0.0,
                           min_feasible_bytes=None)
    for name in ("milp", "dp", "remat", "checkmate"):
        monkeypatch.setitem(registry._REGISTRY, name, (nothing, registry._REGISTRY[name][1]))
    monkeypatch.setattr(registry, "kept_starts", lambda problem, budget_bytes, limit: [])
    monkeypatch.setattr(registry, "lazy_cuts",
                        lambda problem, budget_bytes, limit: nothing(problem, budget_bytes, None))
    # and its searches in the time left where nothing fits (NOTEs [The least peak in the time
    # left], [Probes under the least peak], [Checkmate where nothing fits])
    monkeypatch.setattr(registry.remat, "least_until",
                        lambda problem, budget_bytes, deadline, below=None: nothing(
                            problem, budget_bytes, None))
    monkeypatch.setattr(registry.last_tries.probes, "probe", lambda *args: None)


def _only_the_milp_reaches():
    """A random DAG and a budget the full MILP meets and auto without it does not."""
    problem = autodiff_problem(20, random.Random(0))
    least = solvers.solve(problem, HUGE).min_feasible_bytes
    budget = (least + solvers.solve(problem, HUGE, "store_all").peak_bytes) // 2
    return problem, budget, solvers.solve(problem, budget, "milp", time_limit_s=10)


def test_auto_takes_a_remembered_schedule_that_fits(monkeypatch):
    """NOTE [Schedules remembered]: a schedule of the same problem that fits the budget is a
    candidate; one that does not fit, or was made for another problem, is not."""
    problem, budget, full = _only_the_milp_reaches()
    assert full.feasible
    _searches_cut_short(monkeypatch)
    assert not solvers.solve(problem, budget, time_limit_s=2).feasible
    taken = solvers.solve(problem, budget, time_limit_s=2, candidates=[full.schedule])
    assert taken.feasible and taken.objective_s <= full.objective_s
    assert simulate(problem, taken.schedule).peak_bytes <= budget
    assert not solvers.solve(problem, full.peak_bytes - 1, time_limit_s=2,
                             candidates=[full.schedule]).feasible
    other = solvers.solve(chain(8), HUGE).floor_schedule
    assert not solvers.solve(problem, budget, time_limit_s=2, candidates=[other]).feasible
    # a named solver's answer stays its own
    assert not solvers.solve(problem, budget, "evict", candidates=[full.schedule]).feasible


def test_the_profile_directory_hands_auto_its_schedules_at_other_limits(direct, monkeypatch):
    """A schedule cached at a lower limit of the same profile meets a higher one that the
    search, cut short, does not (a zoo solved least limit first never gets slower)."""
    first = direct.solve(HUGE)
    least = first.min_feasible_bytes
    mid = (least + first.peak_bytes) // 2
    low = direct.solve(mid)
    floor = simulate(direct.profile().problem, first.floor_schedule)
    assert low.feasible and low.objective_s < floor.time_s  # faster than the least peak's
    monkeypatch.setattr(registry, "_auto", _cut_short_but_candidates(registry._auto))
    higher = direct.solve(mid + 1)
    assert higher.feasible and higher.objective_s <= low.objective_s


def _cut_short_but_candidates(real_auto):
    """'auto' whose own searches find nothing, keeping the candidates it is handed."""
    def auto(problem, budget_bytes, time_limit_s, least_start=None, candidates=(),
             least_peak=True):
        fits = fitting(problem, budget_bytes, candidates)
        if fits:
            return min(fits, key=lambda r: r.objective_s)
        return _cut_short(real_auto)(problem, budget_bytes, time_limit_s, least_start)
    return auto


def test_a_least_peak_is_recalled_in_the_process_without_a_profile_directory(monkeypatch):
    """NOTE [Least peaks recalled in the process]: a second optimize() of the same model,
    profiled anew (other times, the same memory), meets the least budget the first reported
    even where its own searches are cut short; the solvers alone recall nothing."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    first = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_dir=None,
                               profile_repeats=1)
    least = first.plan.min_feasible_bytes
    monkeypatch.setattr(registry, "_auto", _cut_short(registry._auto))
    problem = monet_opt.lower_problem(copy.deepcopy(model), x, profile_repeats=1)
    assert not solvers.solve(problem, least).feasible
    again = monet_opt.optimize(model, x, least, profile_dir=None, profile_repeats=1)
    # at most the least recalled: under load the first search can stop above one found later
    assert again.plan.predicted_peak_bytes <= least >= again.plan.min_feasible_bytes
    loss_fn(again(x)).backward()


def test_recall_keeps_the_least_peak_and_the_latest_plans(monkeypatch):
    """NOTE [Least peaks recalled in the process]: the least peak's schedule stays recalled
    while later plans come and go (PER_PROBLEM at most); another problem of the step (`like`)
    is recalled with it; a problem of another memory structure, or another solver, recalls
    nothing."""
    from solvers import remembered
    monkeypatch.setattr(remembered, "_recalled", type(remembered._recalled)())
    problem = chain(8, size=10, fixed=100)
    every = [solvers.schedule_from_kept(problem, set(kept)) for kept in
             ([], [0], [1], [2], [3], [0, 2], [1, 3], [0, 1], [2, 3], [0, 3], [1, 2])]
    peaks = [simulate(problem, s).peak_bytes for s in every]
    least = min(range(len(every)), key=peaks.__getitem__)

    def result(k, floor):
        return SolveResult(solver="test", status=Status.FEASIBLE, schedule=every[k],
                           objective_s=1.0, peak_bytes=peaks[k], bound_s=None, gap=None,
                           solve_time_s=0.0, min_feasible_bytes=peaks[floor],
                           floor_schedule=every[floor])

    remembered.recall("auto", problem, result(0, least))
    for k in range(1, len(every)):
        remembered.recall("auto", problem, result(k, k))  # no least peak lower than the first's
    kept = remembered.recalled("auto", problem)
    assert every[least] in kept and len(kept) == remembered.PER_PROBLEM
    assert every[-1] in kept and every[0] not in kept
    other = chain(8, size=11, fixed=100)
    assert remembered.recalled("auto", other) == ()
    assert set(remembered.recalled("auto", other, problem)) == set(kept)
    assert remembered.recalled("dp", problem) == ()  # another solver's are not its own


def test_a_least_peak_is_no_higher_than_the_schedule_returned():
    """The MILP's least peak came from its memory-centric program alone: 23,312 B said beside
    a schedule of 21,712 B (solver probe, 2026-12-06)."""
    from solvers.remembered import with_known
    problem = chain(8, size=10, fixed=100)
    found = solvers.solve(problem, HUGE, "chen")
    claimed = dataclasses.replace(found, min_feasible_bytes=found.peak_bytes + 50,
                                  floor_schedule=None)
    fixed = with_known(problem, HUGE, claimed, [])
    assert fixed.min_feasible_bytes == found.peak_bytes and fixed.floor_schedule == found.schedule
