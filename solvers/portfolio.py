"""Several searches of one budget at once, each with its own HiGHS seed, on machines with the
cores for them; the fastest schedule wins.

NOTE [A portfolio of seeds]
  Where "auto"'s search goes hangs on HiGHS's random seed wherever the MILP makes the plan.
  Auto in 30 s (12 s on U-Net) with seeds 0-3, one after another on the 2-core machine, predicted
  overhead: ResNet-50 (b16 128², CPU profile) at half its activations +4.0/+4.0/+4.1/+4.0 %, a
  third +9.9/+10.9/+11.1/+12.0 %, a quarter +40.0/+40.0/+37.0/+37.0 %; GoogLeNet (b32 128²) at a
  third +14.8/+14.9/+15.0/+14.7 %, a quarter +25.8/+25.4/+25.8/+27.5 %; U-Net's H200 problem (b11
  416x608) at half +43.2/+40.1/+43.3/+41.3 % (in the bench's order, at its own half:
  +30.9/+31.9/+25.0/+27.1 %). Near the easy end nothing moves; where the search is hard the best
  of four is 3-6 points under seed 0. A single search uses up to three cores (itself, and the
  least-peak program and the coarser ladder aside, each HiGHS program in a child), so a machine
  with four cores per search to spare (the lent GPU machines have 16) runs one search per
  CORES_PER_RUN cores, at most MAX_RUNS, each in a forked child but seed 0's, all with the same
  time limit, and keeps the fastest schedule and the least peak any found. Two-core machines
  (and CI) run one search, seed 0, as before. Processes that plan at once on one machine share
  its cores: torchrun says how many it started there (LOCAL_WORLD_SIZE).
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Callable

from solvers import highs, least
from solvers.aside import Aside, can_fork
from solvers.schedule import SolveResult, gap_of

MAX_RUNS = 4
CORES_PER_RUN = 4
# How long past its own limit a seeded search may take before it is dropped.
GRACE_S = 5.0


def runs() -> int:
    """How many seeded searches this machine runs at once (NOTE [A portfolio of seeds])."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:  # torchrun's processes on this machine, each planning for its rank
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, min(MAX_RUNS, cores // ranks // CORES_PER_RUN))


def best_of(search: Callable[[], SolveResult], time_limit_s: float) -> SolveResult:
    """search() with seed 0 here and, where runs() > 1, with seeds 1.. in forked children at
    the same time; the fastest feasible result, reporting the least peak any of them found."""
    n = runs()
    if n <= 1 or not can_fork():
        return search()
    deadline = time.monotonic() + time_limit_s + GRACE_S
    others = {seed: Aside(_seeded, seed, search) for seed in range(1, n)}
    try:
        results = {0: search()}
        for seed, other in others.items():
            try:
                results[seed] = other.result(max(0.0, deadline - time.monotonic()))
            except TimeoutError:  # stopped: it overran its limit
                continue
    finally:  # where ours or one of theirs failed, the rest stop too
        for other in others.values():
            other.cancel()
    return _merged(results, n)


def _seeded(seed: int, search: Callable[[], SolveResult]) -> SolveResult:
    least.forget_inherited()  # the parent's work aside is its own to collect
    highs.SEED = seed
    return search()


def _merged(results: dict[int, SolveResult], n: int) -> SolveResult:
    """The fastest feasible result (the lower seed on a tie), with the least peak any found
    and the highest bound no schedule found contradicts."""
    fits = [seed for seed, r in results.items() if r.feasible]
    won = min(fits, key=lambda s: (results[s].objective_s, results[s].peak_bytes, s)) \
        if fits else 0
    best = results[won]
    floor = min(results.values(), key=lambda r: math.inf if r.min_feasible_bytes is None
                else r.min_feasible_bytes)
    changes = dict(min_feasible_bytes=floor.min_feasible_bytes,
                   floor_schedule=floor.floor_schedule,
                   solve_time_s=max(r.solve_time_s for r in results.values()))
    if best.feasible:
        bounds = [r.bound_s for r in results.values()
                  if r.bound_s is not None and r.bound_s <= best.objective_s]
        bound = max(bounds, default=None)
        dropped = n - len(results)
        note = (f"the fastest of {n} searches with HiGHS seeds 0-{n - 1}, seed {won}'s"
                + (f" ({dropped} overran and were stopped)" if dropped else "")
                + " (NOTE [A portfolio of seeds])")
        changes.update(bound_s=bound, gap=None if bound is None else
                       gap_of(best.objective_s, bound),
                       note=f"{best.note}; {note}" if best.note else note)
    return dataclasses.replace(best, **changes)
