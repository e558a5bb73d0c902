"""What solvers claim, against the simulator, on problems a fuzzer of the torch-free solvers
found (tests/data/fuzzed_problem_*.json: random ops with states, captured first runs and
replaying variants; solver claims probe, 2026-12-06)."""
from __future__ import annotations

import pathlib

from solvers import NO_PRODUCER, Op, Problem, Schedule, Tensor, Variant, simulate, solve
from solvers.peak_bound import least_peak_bound

DATA = pathlib.Path(__file__).parent / "data"


def _fuzzed(seed: int) -> Problem:
    return Problem.from_json((DATA / f"fuzzed_problem_{seed}.json").read_text())


def _replayed(captured: int | None) -> Problem:
    """a = f0() (random); g = b0(tangent, a); a variant of b0 draws `a` again (reads nothing)."""
    return Problem(ops=(Op("f0", False, 1.0, (), (0,), workspace_bytes=100, is_random=True,
                           captured_workspace_bytes=captured),
                        Op("b0", True, 1.0, (1, 0), (2,))),
                   tensors=(Tensor("a", 10, 0), Tensor("tangent", 10, NO_PRODUCER),
                            Tensor("g", 10, 1)),
                   fixed_bytes=0, backward_outputs=(2,),
                   variants=(Variant("replay", 1, 0, replays=True),))


def test_auto_anneals_a_start_that_keeps_nothing():
    """Annealing chose a tensor to toggle from none where the chosen variants leave the
    backward reading no forward tensor (IndexError from solve(..., "auto"))."""
    assert solve(_replayed(None), 10**6, "auto", time_limit_s=1).feasible
    r = solve(_fuzzed(149), 183, "auto", time_limit_s=1)
    assert r.feasible and r.peak_bytes <= 183


def test_the_bound_from_sizes_takes_the_lesser_first_run():
    """A captured first run measured below the plain one (they are measured apart): the bound
    said 110 B of a step whose replaying schedule peaks at 20 B."""
    p = _replayed(10)
    replay = Schedule(kept=frozenset(), backward=(1,), variants=frozenset({0}))
    assert least_peak_bound(p).bytes <= simulate(p, replay).peak_bytes == 20


def test_a_least_below_the_least_pass_comes_with_its_schedule():
    """Checkmate said a least peak of its own schedule's, with no schedule to meet it again
    (a solve at it was refused); a schedule pruned of unread recomputation peaked below the
    least its result said."""
    p = _fuzzed(1)
    r = solve(p, 258, "checkmate", time_limit_s=1)
    assert r.feasible and r.min_feasible_bytes <= r.peak_bytes
    assert r.floor_schedule is not None
    assert simulate(p, r.floor_schedule).peak_bytes == r.min_feasible_bytes
    again = solve(p, r.min_feasible_bytes, "checkmate", time_limit_s=1, known=[r.floor_schedule])
    assert again.feasible
    q = _fuzzed(24)
    r = solve(q, 29, "checkmate", time_limit_s=1)
    assert r.feasible and r.min_feasible_bytes <= r.peak_bytes
