"""NOTE [Heuristics in their time] (solvers/timeshare.py): the heuristics "auto" runs first share
a part of its limit, keep what they found with the problem, and go on from there. No torch."""
from __future__ import annotations

import math
import random
import time

import pytest

from solvers import Problem, registry, solve, timeshare
from solvers.baselines import BaselineOptions, _coarse_to_fine, chen_greedy
from solvers.milp import BuildTimeout, MilpOptions, Program
from solvers.stages import build_stages
from tests.problems import autodiff_problem, with_masks


def _problem_and_budget(seed: int = 0) -> tuple[Problem, int]:
    p = autodiff_problem(60, random.Random(seed))
    store_all = solve(p, 10**12, "store_all").peak_bytes
    least = solve(p, 10**12, "chen_sqrt").min_feasible_bytes
    return p, least + (store_all - least) // 3


def test_the_grid_is_swept_coarse_to_fine_each_point_once():
    for n in (1, 2, 3, 7, 48):
        order = _coarse_to_fine(list(range(n)))
        assert sorted(order) == list(range(n))
    assert _coarse_to_fine(list(range(48)))[:5] == [0, 47, 32, 16, 8]


def test_a_greedy_sweep_cut_short_goes_on_where_it_stopped():
    """Out of time, the sweep simulates one candidate; the next call on the same problem goes
    on from there and ends where a whole sweep does."""
    p, budget = _problem_and_budget()
    whole = chen_greedy(Problem.from_json(p.to_json()), budget, BaselineOptions())
    first = chen_greedy(p, budget, BaselineOptions(time_limit_s=0.0))
    assert len(p.memo[("chen_greedy", 48)].done) == 1
    assert first.schedule is None or first.peak_bytes <= budget
    rest = chen_greedy(p, budget, BaselineOptions())
    assert (rest.schedule, rest.objective_s, rest.peak_bytes, rest.min_feasible_bytes) == \
        (whole.schedule, whole.objective_s, whole.peak_bytes, whole.min_feasible_bytes)


def test_the_heuristics_out_of_time_still_answer():
    """With their share spent before they begin, each heuristic still gives its answer from
    what it could try (one greedy candidate), and every schedule it gives fits."""
    p, budget = _problem_and_budget(1)
    results = registry._cheap(p, budget, deadline=0.0)
    assert [r.solver for r in results[:4]] == list(registry._HEURISTICS)
    assert len(p.memo[("chen_greedy", 48)].done) == 1
    assert all(r.peak_bytes <= budget for r in results if r.feasible)
    assert all(r.min_feasible_bytes is not None for r in results)


def test_the_time_left_is_shared_by_weight():
    deadline = time.perf_counter() + 100.0
    shares = list(timeshare.limits(["store_all", "chen_greedy", "evict"], deadline))
    assert shares[0] is None
    assert shares[1] == pytest.approx(25.0, abs=0.5)  # weights 1 and 3
    # read as it begins: the last has all that is left (here the greedy sweep took none)
    assert shares[2] == pytest.approx(100.0, abs=0.5)
    assert list(timeshare.limits(["evict"], 0.0)) == [0.0]


def test_a_program_stops_being_built_at_its_deadline():
    p, budget = _problem_and_budget()
    o = MilpOptions()
    stages = build_stages(p, o.max_recompute_vars, o.max_held_vars)
    with pytest.raises(BuildTimeout):
        Program(stages, budget, deadline=0.0)
    assert Program(stages, budget, deadline=math.inf).budget == budget


def test_a_short_limit_gives_each_program_a_tenth_of_it(monkeypatch):
    """NOTE [Short limits]: each program auto solved got at least a second, so a limit below
    about 10 s did not hold (a 195-op GPT-2 asked for 0.5 s took 5.3 s); now a tenth of it."""
    from solvers import joint, least
    given = []

    def spy(solve_program):
        def recorded(program, options, *args, **kwargs):
            given.append(options.time_limit_s)
            return solve_program(program, options, *args, **kwargs)
        return recorded
    for module in (least, joint):
        monkeypatch.setattr(module, "solve_program", spy(module.solve_program))
    rng = random.Random(1)
    p = autodiff_problem(60, rng)
    p, budget = with_masks(p, rng), _problem_and_budget(1)[1]
    for solver in ("auto", "milp"):  # the MILP alone too (asked for 2 s it took 4.5 s)
        given.clear()
        solve(p, budget, solver, time_limit_s=0.5)
        assert given and max(given) <= 0.5, solver
    assert timeshare.program_floor(0.5) == 0.05 and timeshare.program_floor(30) == 1.0
