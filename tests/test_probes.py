"""Probes of the least-peak program's budgets in the time "auto" has left where nothing fits
(NOTE [Probes under the least peak] in solvers/probes.py). No torch."""
from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

from solvers import Schedule, Status, simulate, solve
from solvers.baselines import BaselineOptions, chen_sqrt
from solvers.milp import MilpOptions, Program, build_stages, solve_program
from solvers.probes import probe, relaxation_bound
from solvers.problem import Problem
from tests.problems import chain

BENCH = Path(__file__).resolve().parents[1] / "docs/benchmarks"


def _saved(path: str, key_start: str) -> Problem:
    with gzip.open(BENCH / path, "rt") as f:
        saved = json.load(f)["problems"]
    return Problem.from_json(next(v["problem"] for k, v in saved.items()
                                  if k.startswith(key_start)))


def _relaxed_bound(p: Problem) -> int:
    options = MilpOptions()
    stages = build_stages(p, options.max_recompute_vars, options.max_held_vars)
    return relaxation_bound(stages, time.perf_counter() + 30.0)


def test_a_program_that_only_fits():
    """fits_only: no objective, so the first schedule within the budget is optimal."""
    p = chain(8)
    options = MilpOptions(time_limit_s=10.0)
    stages = build_stages(p, options.max_recompute_vars, options.max_held_vars)
    program = Program(stages, 150, fits_only=True)
    assert not any(program.mip.cost) and program.mip.offset == 0.0
    res, schedule = solve_program(program, options, None)
    assert res.status == "optimal" and simulate(p, schedule).peak_bytes <= 150
    assert solve_program(Program(stages, 129, fits_only=True), options, None)[0].status == \
        "infeasible"


def test_auto_below_its_least_peak_on_a_chain():
    """The RNN of tests/test_eager_kernels.py (196 ops): where nothing fits, auto reported
    22,800 B in 30 s before the probes (its least-peak program and the rematerializing passes
    stall there), though the relaxation bounds the program at 21,712 B; now within 2 % of that
    bound, its floor schedule peaks where it says, and a budget there is met with it."""
    p = _saved("problems_chains.json.gz", "rnn_tanh_dropout")
    bound = _relaxed_bound(p)
    res = solve(p, 1, "auto", time_limit_s=20)
    assert res.status == Status.INFEASIBLE
    assert bound <= res.min_feasible_bytes <= bound * 1.02, (res.min_feasible_bytes, bound)
    assert simulate(p, res.floor_schedule).peak_bytes == res.min_feasible_bytes
    met = solve(p, res.min_feasible_bytes, "auto", time_limit_s=2, known=[res.floor_schedule])
    assert met.feasible and met.peak_bytes <= res.min_feasible_bytes


def test_probes_report_what_they_found():
    """Below a least peak known (Chen's √n's), each schedule returned peaks where it says, under
    it, and at or above the relaxation's bound (and over the budget asked for)."""
    p = _saved("problems_chains.json.gz", "unet")
    opts = BaselineOptions()
    below = chen_sqrt(p, 2 ** 62, opts).min_feasible_bytes
    bound = _relaxed_bound(p)
    peak, schedule = probe(p, 1, below, time.perf_counter() + 8)
    assert isinstance(schedule, Schedule)
    assert bound <= simulate(p, schedule).peak_bytes == peak < below


def test_no_probe_where_the_bound_is_above():
    """GoogLeNet (make bench's CPU problem): eviction's least peak is under the program's bound,
    so no probe runs (the relaxation alone: 0.7 s on an idle machine); nor where the time is up
    (auto's search before it may run past its deadline)."""
    p = _saved("problems_cpu.json.gz", "googlenet")
    below = _relaxed_bound(p) - 1
    start = time.perf_counter()
    assert probe(p, 1, below, start + 30) is None
    assert time.perf_counter() - start < 15
    start = time.perf_counter()
    assert probe(p, 1, below + 10 ** 8, start) is None
    assert time.perf_counter() - start < 0.1


def test_the_budget_asked_for_is_probed_first(monkeypatch):
    """Above the relaxation's bound the first probe is at the budget itself, and a schedule
    found there fits it: a plan for the caller, where auto's other searches found none."""
    from solvers import probes

    p = _saved("problems_chains.json.gz", "rnn_tanh_dropout")
    budget = int(_relaxed_bound(p) * 1.025)
    asked = []

    def recorded(program, options, start):
        asked.append(program.budget)
        return solve_program(program, options, start)
    monkeypatch.setattr(probes, "solve_program", recorded)
    peak, schedule = probe(p, budget, 2 * budget, time.perf_counter() + 20)
    assert asked[0] == budget
    assert simulate(p, schedule).peak_bytes == peak <= budget
