"""Budgets probed below the least peak, in the time "auto" has left where nothing fits.

NOTE [Probes under the least peak]
  Where nothing meets the budget, "auto" reports the least peak it reached, and spends the time
  it has left lowering it by rematerializing passes (NOTE [The least peak in the time left] in
  solvers/remat.py), which often settle in seconds. On a long chain the least-peak program
  (solvers/least.py) is weak too: its objective is the budget, a maximum over every moment of
  the step, and HiGHS's heuristics seldom improve on its start there, though its relaxation is
  tight. An RNN of 196 ops (tests/test_eager_kernels.py): the relaxation's bound 21,712 B, the
  program's schedule 23,312 B in 4 s and 22,544 B in 15 s, while the same program with a fixed
  budget and no objective (any schedule within it is optimal) found one at 21,968 B in 1.3 s
  when asked for 2 % over the bound. So once the passes settle, the time left goes to such
  probes: the least-peak program's relaxation bounds the budgets it can meet from below, and
  each probe halves the range between the highest budget below that bound or known to fail and
  the lowest peak known, getting half the time left (a probe that runs out of time aims halfway
  higher next). Where the budget asked for is above the bound, the first probe is at the budget
  itself: a schedule there is a plan for the caller, not only a lower least peak. Where the
  bound is at or above the least peak known (the program's stages cannot reach what eviction
  did: MobileNetV2, GoogLeNet, ResNet-50, DenseNet-121 and GPT-2 narrow at make bench's CPU
  sizes) it costs the relaxation only (0.6-1.5 s there). Asked for 1 B in 30 s: the RNN 22,800
  -> 21,712 B (the bound), make bench's U-Net 100.36 -> 98.75 MB
  (docs/benchmarks/least_probes.md).
"""
from __future__ import annotations

import dataclasses
import math
import time

from solvers import remat
from solvers.baselines import best_of
from solvers.milp import BuildTimeout, MilpOptions, Program, build_stages, solve_program
from solvers.mip import solve_relaxation
from solvers.problem import Problem
from solvers.schedule import Schedule, SolveResult
from solvers.simulate import simulate

PROBE_CLOSE = 0.002  # stop once the range is this share of the least peak known
PROBE_MIN_S = 0.5  # the least time a probe is given


def least_until(problem: Problem, budget_bytes: int, deadline: float,
                below: int | None = None) -> SolveResult:
    """remat.least_until (below `below`, a peak met otherwise), then probes of the least-peak
    program's budgets until `deadline` below what that reached (NOTE [Probes under the least
    peak]); the lowest schedule of both as the result and its floor schedule."""
    start = time.perf_counter()
    late = remat.least_until(problem, budget_bytes, deadline, below)
    known = [b for b in (below, late.min_feasible_bytes) if b is not None]
    probed = probe(problem, budget_bytes, min(known), deadline) \
        if known and not late.feasible else None
    if probed is None:
        return late
    peak, schedule = probed
    result = best_of("probes", problem, budget_bytes, [(schedule, simulate(problem, schedule))],
                     start)
    return dataclasses.replace(result, floor_schedule=schedule,
                               note=f"a probe of the least-peak program met {peak} B")


def probe(problem: Problem, budget_bytes: int, below: int,
          deadline: float) -> tuple[int, Schedule] | None:
    """The lowest-peak schedule the probes found under `below` by `deadline`, and its peak; None
    where they found none."""
    if deadline - time.perf_counter() < PROBE_MIN_S:
        return None
    options = MilpOptions()
    stages = build_stages(problem, options.max_recompute_vars, options.max_held_vars)
    bound = relaxation_bound(stages, deadline)
    if bound is None:
        return None
    # no budget under lo is probed: the program meets none under its bound, and a schedule
    # within the budget asked for is all the caller needs; that budget is probed first
    lo = aim = max(budget_bytes, bound)
    hi, found = below, None
    first = lo if lo == budget_bytes else None
    while hi - aim > hi * PROBE_CLOSE and deadline - time.perf_counter() >= PROBE_MIN_S:
        mid = first if first is not None else (aim + hi) // 2
        first = None
        left = max(PROBE_MIN_S, (deadline - time.perf_counter()) / 2)
        try:
            program = Program(stages, mid, deadline, fits_only=True)
        except BuildTimeout:
            break
        res, schedule = solve_program(program, dataclasses.replace(options, time_limit_s=left),
                                      None)
        peak = simulate(problem, schedule).peak_bytes if schedule is not None else None
        if peak is not None and peak < hi:
            hi, found = peak, schedule
            aim = lo
        elif res.status == "infeasible":
            lo = aim = mid + 1
        else:
            aim = mid
    return (hi, found) if found is not None else None


def relaxation_bound(stages, deadline: float) -> int | None:
    """The least-peak program of `stages` relaxed (integrality dropped), solved by `deadline`:
    no schedule of the program peaks below it. None where it did not finish in time."""
    try:
        mip = Program(stages, None, deadline).mip
    except BuildTimeout:
        return None
    objective = solve_relaxation(mip, deadline - time.perf_counter()).objective
    return math.ceil(objective) if objective is not None else None
