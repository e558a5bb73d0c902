"""NOTE [A portfolio of seeds] (solvers/portfolio.py). No torch."""
from __future__ import annotations

import multiprocessing
import os
import random
import time

import pytest

from solvers import Status, SolveResult, simulate, solve
from solvers import highs, least, portfolio
from tests.problems import autodiff_problem, chain

pytest.importorskip("highspy")


@pytest.mark.parametrize("cores, ranks, runs", [
    (1, None, 1), (2, None, 1), (7, None, 1), (8, None, 2), (16, None, 4), (64, None, 4),
    (16, "2", 2), (16, "8", 1), (64, "4", 4), (16, "", 4)])
def test_one_search_per_four_cores_at_most_four(monkeypatch, cores, ranks, runs):
    """Shared among the processes torchrun started on the machine (LOCAL_WORLD_SIZE)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    if ranks is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
    assert portfolio.runs() == runs


def _result(schedule, objective, least_bytes, bound=None, floor=None):
    feasible = schedule is not None
    return SolveResult(solver="auto:test", status=Status.FEASIBLE if feasible else
                       Status.INFEASIBLE, schedule=schedule, objective_s=objective,
                       peak_bytes=100 if feasible else None, bound_s=bound, gap=None,
                       solve_time_s=0.1, min_feasible_bytes=least_bytes, floor_schedule=floor)


def test_the_fastest_schedule_and_the_least_peak_of_any_seed(monkeypatch):
    p = chain(6)
    a, b, c = (solve(p, 10**9, name).schedule for name in ("store_all", "chen_sqrt", "evict"))
    by_seed = {0: _result(a, 3.0, 10, bound=1.0), 1: _result(b, 2.0, 12, bound=1.5),
               2: _result(None, None, 8, floor=c), 3: _result(c, 2.5, 9, bound=2.2)}
    monkeypatch.setattr(portfolio, "runs", lambda: 4)
    r = portfolio.best_of(lambda: by_seed[highs.SEED], 5.0)
    assert (r.schedule, r.objective_s) == (b, 2.0)  # seed 1's
    assert (r.min_feasible_bytes, r.floor_schedule) == (8, c)  # seed 2's
    assert r.bound_s == 1.5  # seed 3's 2.2 is contradicted by seed 1's schedule
    assert "seed 1's" in r.note and "NOTE [A portfolio of seeds]" in r.note
    assert highs.SEED == 0


def test_a_search_that_overruns_is_stopped(monkeypatch):
    p = chain(6)
    a = solve(p, 10**9, "store_all").schedule

    def search():
        if highs.SEED == 2:
            time.sleep(60)
        return _result(a, 3.0 - highs.SEED, 10)
    monkeypatch.setattr(portfolio, "runs", lambda: 3)
    monkeypatch.setattr(portfolio, "GRACE_S", 0.5)
    start = time.monotonic()
    r = portfolio.best_of(search, 0.5)
    assert time.monotonic() - start < 5.0
    assert r.objective_s == 2.0 and "1 overran" in r.note


def test_where_our_search_fails_the_others_stop(monkeypatch):
    def search():
        if highs.SEED == 0:
            raise ValueError("ours failed")
        time.sleep(60)
    monkeypatch.setattr(portfolio, "runs", lambda: 3)
    start = time.monotonic()
    with pytest.raises(ValueError, match="ours failed"):
        portfolio.best_of(search, 30.0)
    assert time.monotonic() - start < 5.0
    assert not multiprocessing.active_children()


def test_a_seeded_search_leaves_the_parents_work_aside_alone(monkeypatch):
    """A forked search sees the programs its parent began aside in least._aside; reading one
    would take the parent's answer, stopping one would kill the parent's child."""
    p = chain(6)
    a = solve(p, 10**9, "store_all").schedule
    monkeypatch.setitem(least._aside, "the parent's", object())
    monkeypatch.setattr(portfolio, "runs", lambda: 2)
    r = portfolio.best_of(lambda: _result(a, 1.0 + len(least._aside) - highs.SEED, 10), 5.0)
    assert r.objective_s == 0.0  # seed 1 saw none of them
    assert "the parent's" in least._aside


def test_auto_with_two_seeds_plans_within_the_budget(monkeypatch):
    monkeypatch.setattr(portfolio, "runs", lambda: 2)
    p = autodiff_problem(40, random.Random(3))
    floor = solve(p, 10**12, "chen_sqrt").min_feasible_bytes
    budget = floor + (solve(p, 10**12, "store_all").peak_bytes - floor) // 3
    r = solve(p, budget, "auto", time_limit_s=3.0)
    assert r.feasible and simulate(p, r.schedule).peak_bytes <= budget
    assert "NOTE [A portfolio of seeds]" in r.note
    assert r.min_feasible_bytes <= budget
