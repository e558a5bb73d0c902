"""Least-peak schedules found before, so that a least budget once reported is met again.

NOTE [Least peaks remembered]
  `min_feasible_bytes` promises a budget the caller can ask for next. Where that least peak
  comes from a search a clock cuts short (the MILP's memory-centric program, the lower-set DP),
  a second call can stop elsewhere and end above the first: a budget the first call named is
  then refused (gpt2_tiny did this in CI: 1329416 B reached, 1299976 B named the call before).
  So such solvers return the schedule that reached their least peak (`floor_schedule`), the
  caller keeps it (the profile directory does: monet_opt/cache.py), and hands it back as
  `known` on the next solve of the same problem. `with_known` makes the answer no worse for
  it: the least peak reported is at most a known schedule's, and a budget no solver met this
  time but a known schedule fits is answered with that schedule. The MILP's memory-centric
  program also reports no more than the lowest known schedule (MilpOptions.least_start), so
  what it reaches only goes down from call to call (it searches from Chen's schedules: NOTE
  [The least peak where store-all fits] in solvers/least.py). Schedules that do not run on
  the problem (made for another graph) are ignored: the simulator decides.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from solvers.errors import InvalidScheduleError
from solvers.problem import Problem
from solvers.schedule import Schedule, SolveResult, Status, gap_of
from solvers.simulate import Simulation, simulate


def floor_of(candidates: Iterable[tuple[int | None, Schedule | None]]
             ) -> tuple[int | None, Schedule | None]:
    """The least (peak, schedule) of `candidates`; on a tie in peak, one with a schedule."""
    best: tuple[int | None, Schedule | None] = (None, None)
    for peak, schedule in candidates:
        if peak is None:
            continue
        if best[0] is None or peak < best[0] or (peak == best[0] and best[1] is None):
            best = (peak, schedule)
    return best


def lowest(problem: Problem, known: Iterable[Schedule]) -> Schedule | None:
    """The schedule of `known` with the least peak on `problem`, of those that run on it."""
    return floor_of((sim.peak_bytes, s) for s, sim in _simulated(problem, known))[1]


def _simulated(problem: Problem, known: Iterable[Schedule]
               ) -> list[tuple[Schedule, Simulation]]:
    runs = []
    for schedule in known:
        try:
            runs.append((schedule, simulate(problem, schedule)))
        except (InvalidScheduleError, IndexError):
            continue
    return runs


def with_known(problem: Problem, budget_bytes: int, result: SolveResult,
               known: Iterable[Schedule]) -> SolveResult:
    """`result` with the schedules in `known` taken into account (NOTE [Least peaks
    remembered])."""
    runs = _simulated(problem, known)
    if not runs:
        return result
    peak, floor = floor_of([(result.min_feasible_bytes, result.floor_schedule)] +
                           [(sim.peak_bytes, s) for s, sim in runs])
    result = dataclasses.replace(result, min_feasible_bytes=peak, floor_schedule=floor)
    fits = [(s, sim) for s, sim in runs if sim.peak_bytes <= budget_bytes]
    if result.feasible or not fits:
        return result
    schedule, sim = min(fits, key=lambda r: (r[1].time_s, r[1].peak_bytes))
    bound = result.bound_s
    gap = gap_of(sim.time_s, bound)
    note = "a least-peak schedule remembered from an earlier solve of this problem " \
           "(NOTE [Least peaks remembered])"
    return dataclasses.replace(result, status=Status.FEASIBLE, schedule=schedule,
                               objective_s=sim.time_s, peak_bytes=sim.peak_bytes, gap=gap,
                               note=f"{result.note}; {note}" if result.note else note)


def fitting(problem: Problem, budget_bytes: int, candidates: Iterable[Schedule]
            ) -> list[SolveResult]:
    """NOTE [Schedules remembered]
      A schedule that fits a budget fits every larger one, so a profile directory that holds
      schedules of a problem at several limits (a zoo: `monet-opt precompute`) knows good
      schedules for a new limit before any search: "auto" takes those that fit as candidates
      beside its own (polished, refined and pruned like them), so its answer is never slower
      than one it gave at a smaller limit of the same problem, where a clock cut the search
      short at one limit and not at the other (DenseNet-121 at 50 % of its activations came
      out slower than at 40 %: docs/benchmarks/solvers.md). Candidates that do not run on the
      problem are ignored: the simulator decides."""
    return [SolveResult(solver="remembered", status=Status.FEASIBLE, schedule=s,
                        objective_s=sim.time_s, peak_bytes=sim.peak_bytes, bound_s=None,
                        gap=None, solve_time_s=0.0, min_feasible_bytes=sim.peak_bytes,
                        note="a schedule the profile directory held for this problem at "
                             "another limit (NOTE [Schedules remembered])")
            for s, sim in _simulated(problem, candidates) if sim.peak_bytes <= budget_bytes]
