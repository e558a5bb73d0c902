"""Refine a schedule window by window: the joint MILP with all but a run of stages fixed.

NOTE [Windows of stages]
  On a large graph HiGHS stops the whole program at its time limit far from optimal, most of
  all at tight budgets: on ResNet-50 (b16, 128^2) at 25 % of its store-all activations it
  ended at +44.5 % over store-all. A window is a run of consecutive stages [lo, hi). Its
  program is the whole program with every binary outside the window fixed at the incumbent's
  value; free are the recomputations of the window's stages, the copies held into and through
  it, the kept flag (and every held copy) of a tensor that only the window reads, and the
  variants of the window's backward ops. Presolve removes the fixed part, so a window of a few
  thousand binaries closes in about a second. Windows half overlap and sweep the backward from
  its first stage to its last, again while a sweep improves and time is left. From that
  +44.5 %, windows of six of the program's 27 stages (a prototype of this) reached +34.2 % in
  one sweep and +28.4 % in a second (29 s in all). Each window's optimum
  is exact within the window, so an accepted schedule is never slower; the simulator checks it.
  The bound stays the whole problem's (the window programs prove nothing about the rest).
  The least-peak program (the budget a variable and the objective) can be refined the same
  way: a window minimizes the peak with the rest fixed, which lowers it where the peak is
  inside the window; a schedule is taken when it peaks lower (or as low, and runs faster).
  least_peak does not use it: its answer is the least budget optimize() promises to meet, and
  windows cut off by the clock made that answer differ between two calls on the same model
  (a tiny GPT-2 refused its own least peak in tests/test_executor.py).
"""
from __future__ import annotations

import dataclasses
import time

from solvers.milp import MilpOptions, Program
from solvers.mip import solve_mip
from solvers.schedule import Schedule
from solvers.simulate import Simulation, simulate

MAX_FREE_BINARIES = 3000  # a window grows by whole stages while it has at most this many
WINDOW_TIME_LIMIT_S = 4.0


@dataclasses.dataclass(frozen=True)
class Refined:
    schedule: Schedule
    time_s: float
    peak_bytes: int
    windows: int   # window programs solved
    improved: int  # of them, how many gave a better schedule


def refine(program: Program, schedule: Schedule, options: MilpOptions,
           deadline: float) -> Refined:
    """`schedule` (which `program` must express) made faster window by window (for the
    least-peak program: lower, then faster) until a whole sweep finds nothing or `deadline`
    (time.perf_counter()) passes (NOTE [Windows of stages])."""
    problem = program.st.problem
    best = simulate(problem, schedule)
    windows = _windows(program)
    solved = improved = 0

    def done() -> Refined:
        return Refined(schedule, best.time_s, best.peak_bytes, solved, improved)

    while True:
        before = improved
        for free in windows:
            left = deadline - time.perf_counter()
            values = program.start_values(schedule)
            if left < 0.2 or values is None:  # None cannot happen for this program's schedule
                return done()
            res = solve_fixed(program, values, free, options, min(WINDOW_TIME_LIMIT_S, left))
            solved += 1
            if res.values is None:
                continue
            candidate = program.schedule(res.values)
            sim = simulate(problem, candidate)
            if _better(program, sim, best):
                schedule, best, improved = candidate, sim, improved + 1
        if improved == before:
            return done()


def solve_fixed(program: Program, values: list[float], free: frozenset[int],
                options: MilpOptions, time_limit_s: float):
    """`program` with every binary outside `free` fixed at `values`, started from them."""
    lb, ub = list(program.mip.lb), list(program.mip.ub)
    for j, integer in enumerate(program.mip.integer):
        if integer and j not in free:
            lb[j] = ub[j] = round(values[j])
    return solve_mip(dataclasses.replace(program.mip, lb=lb, ub=ub), options.backend,
                     time_limit_s, values, options.rel_gap / 10)


def read_only_in(program: Program, lo: int, hi: int) -> set[int]:
    """The held-copy binaries, at every stage, of the tensors only stages [lo, hi) read:
    whether such a tensor is kept at all is the window's to decide."""
    st = program.st
    first: dict[int, int] = {}
    for a, reads in enumerate(st.stage_reads):
        for x in reads:
            first.setdefault(x, a)
    return {program.S[a][x] for x, f in first.items() if f >= lo and st.last_need[x] < hi
            for a in range(hi + 1) if x in program.S[a]}


def _better(program: Program, sim: Simulation, than: Simulation) -> bool:
    faster = sim.time_s < than.time_s * (1 - 1e-9)
    if program.min_memory:
        return sim.peak_bytes < than.peak_bytes or (sim.peak_bytes == than.peak_bytes and faster)
    return sim.peak_bytes <= program.budget and faster


def _windows(program: Program) -> list[frozenset[int]]:
    """The free binaries of each window, half-overlapping, from the first stage to the last."""
    n = len(program.st.groups)
    out, lo = [], 0
    while lo < n:
        hi = lo + 1
        free = _free(program, lo, hi)
        while hi < n:
            wider = _free(program, lo, hi + 1)
            if len(wider) > MAX_FREE_BINARIES and hi - lo >= 2:
                break
            hi, free = hi + 1, wider
        out.append(free)
        if hi == n:
            break
        lo = max(lo + 1, (lo + hi) // 2)
    return out


def _free(program: Program, lo: int, hi: int) -> frozenset[int]:
    st, p = program.st, program.st.problem
    free = read_only_in(program, lo, hi)
    for a in range(lo, hi):
        free.update(program.R[a].values())
    for a in range(lo, hi + 1):
        free.update(program.S[a].values())
    ops = {st.bwd[q] for a in range(lo, hi) for q in st.groups[a]}
    free.update(e for v, e in enumerate(program.E) if p.variants[v].op in ops)
    return frozenset(free)


__all__ = ["Refined", "read_only_in", "refine", "solve_fixed"]

