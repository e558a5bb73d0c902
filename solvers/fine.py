"""Refine any schedule window by window, at full resolution inside the window.

NOTE [Fine windows]
  The whole joint program of a large graph only fits by merging backward positions into a few
  stages (recomputation only at their starts): DenseNet-121 has 366 positions that read
  forward tensors and gets 12 stages, ResNet-50 156 and 27. A recomputed tensor is then made
  at its stage's start and held until its last read, which costs memory that finer stages
  would not, so at tight budgets the program recomputes more than it needs to; and the
  coarse windows (NOTE [Windows of stages]) refine within the same coarse stages.
  A fine window is a run of reading positions [lo, hi) of the backward. Its program has a
  stage at every one of them, and outside the window a stage exactly where the incumbent
  recomputes, whose only candidates are the ops the incumbent recomputes there: the
  incumbent is a point of the program (start_values), and every binary outside the window
  (those stages' recomputations and held copies, the kept flag of a tensor read outside the
  window, variants of backward ops outside) is fixed at the incumbent's value. Free are the
  window's recomputations (ancestors of its reads, nearest first, up to
  MAX_WINDOW_RECOMPUTE), the copies held into and through it, the kept flag of a tensor only
  the window reads and the variants of the window's backward ops. The incumbent can be any
  solver's schedule (the DP's, a polished one), not only one the coarse program expresses.
  Windows half overlap and sweep the backward, again while a sweep improves and time is left;
  each accepted schedule is simulated and strictly faster within the budget, so refining
  never makes a schedule worse. It proves no bound on the whole problem.
"""
from __future__ import annotations

import time

from solvers.milp import BuildTimeout, MilpOptions, Program
from solvers.problem import Problem
from solvers.schedule import Schedule
from solvers.simulate import simulate
from solvers.stages import Stages, ancestors, reading_positions
from solvers.windows import Refined, read_only_in, solve_fixed

WINDOW_POSITIONS = 16      # reading positions per window
MAX_WINDOW_RECOMPUTE = 8000  # recompute binaries inside a window (nearest ancestors first)
WINDOW_TIME_LIMIT_S = 5.0


def refine(problem: Problem, budget_bytes: int, schedule: Schedule, deadline: float,
           options: MilpOptions = MilpOptions()) -> Refined:
    """`schedule` (within `budget_bytes`) made faster window by window until a whole sweep
    finds nothing or `deadline` (time.perf_counter()) passes (NOTE [Fine windows])."""
    best = simulate(problem, schedule)
    anc = ancestors(problem)
    reading = reading_positions(problem)
    solved = improved = 0
    while True:
        before = improved
        for window in _windows(problem, schedule, reading):
            if deadline - time.perf_counter() < 0.5:
                return Refined(schedule, best.time_s, best.peak_bytes, solved, improved)
            candidate = _solve_window(problem, budget_bytes, schedule, window, reading[0], anc,
                                      options, deadline)
            solved += 1
            if candidate is None:
                continue
            sim = simulate(problem, candidate)
            if sim.peak_bytes <= budget_bytes and sim.time_s < best.time_s * (1 - 1e-9):
                schedule, best, improved = candidate, sim, improved + 1
        if improved == before:
            return Refined(schedule, best.time_s, best.peak_bytes, solved, improved)


def _windows(p: Problem, schedule: Schedule, reading: list[int]) -> list[list[int]]:
    """Half-overlapping runs of WINDOW_POSITIONS reading positions, those where the schedule
    recomputes the most time (or spends it on variants) first. A window where it spends none
    is left out: with the rest fixed, it can only add recomputation."""
    if not reading:  # the backward reads no forward tensor: nothing to recompute
        return []
    rec = _recomputed_at(p, schedule)
    step = max(1, WINDOW_POSITIONS // 2)
    scored = []
    for k in range(0, max(1, len(reading) - step), step):
        window = reading[k:k + WINDOW_POSITIONS]
        lo, hi = window[0], window[-1] + 1
        spent = sum(p.ops[i].rerun_s for q, ops in rec.items() if lo <= q < hi for i in ops)
        ops = set(p.backward_ops[lo:hi])
        spent += sum(abs(p.variant_time_s(v)) for v in range(len(p.variants))
                     if p.variants[v].op in ops
                     and (v in schedule.variants or p.variant_time_s(v) < 0))
        if spent > 0:
            scored.append((-spent, k, window))
    return [w for _, _, w in sorted(scored)]


def _recomputed_at(p: Problem, schedule: Schedule) -> dict[int, list[int]]:
    """Backward position -> the forward ops the schedule recomputes just before it."""
    pos = {b: q for q, b in enumerate(p.backward_ops)}
    out: dict[int, list[int]] = {}
    q = 0
    for i in schedule.backward:
        if p.ops[i].is_backward:
            q = pos[i] + 1
        else:
            out.setdefault(q, []).append(i)
    return out


def _solve_window(p: Problem, budget_bytes: int, schedule: Schedule, window: list[int],
                  first_read: int, anc, options: MilpOptions,
                  deadline: float) -> Schedule | None:
    rec = _recomputed_at(p, schedule)
    if any(q >= len(p.backward_ops) for q in rec):
        return None  # recomputation after the last backward op: nothing reads it
    lo, hi = window[0], window[-1] + 1
    outside = [q for q in rec if not lo <= q < hi]
    starts = sorted(set(window) | set(outside) | {min([first_read, *rec])})
    index = {q: a for a, q in enumerate(starts)}
    only = {index[q]: frozenset(rec.get(q, ())) for q in starts if not lo <= q < hi}
    inside = [index[q] for q in starts if lo <= q < hi]
    stages = Stages(p, starts=starts, only=only)
    mine = {index[q]: frozenset(rec.get(q, ())) for q in starts if lo <= q < hi}
    only.update(_nearest(stages, mine, anc))
    stages = Stages(p, starts=starts, only=only)
    try:  # its rows for every op: seconds on a graph of thousands
        program = Program(stages, budget_bytes, deadline)
    except BuildTimeout:
        return None
    values = program.start_values(schedule) if time.perf_counter() < deadline else None
    if values is None:
        return None
    left = min(WINDOW_TIME_LIMIT_S, deadline - time.perf_counter())
    res = solve_fixed(program, values, _free(program, inside), options, max(0.2, left))
    return program.schedule(res.values) if res.values is not None else None


def _nearest(stages: Stages, mine: dict[int, frozenset[int]], anc
             ) -> dict[int, frozenset[int]]:
    """Per window stage, its candidates cut to the ancestors within the widest distance that
    keeps MAX_WINDOW_RECOMPUTE binaries (ops the incumbent recomputes there always stay)."""
    p = stages.problem
    full = {a: stages.cand[a] for a in mine}

    def within(d: int) -> dict[int, frozenset[int]]:
        out = {}
        for a in mine:
            srcs = [p.tensors[x].producer for x in stages.D[a]]
            near = {i for s in srcs for i in anc[s] if s - i <= d}
            out[a] = frozenset(i for i in full[a] if i in near) | mine[a]
        return out

    lo, hi = 0, len(p.ops)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(len(c) for c in within(mid).values()) <= MAX_WINDOW_RECOMPUTE:
            lo = mid
        else:
            hi = mid - 1
    return within(lo)


def _free(program: Program, inside: list[int]) -> frozenset[int]:
    st, p = program.st, program.st.problem
    free: set[int] = set()
    touched = {x for a in inside for x in st.stage_reads[a]}
    touched |= {y for a in inside for i in st.cand[a] for y in p.ops[i].outputs}
    for a in inside:
        free.update(program.R[a].values())
        for b in (a, a + 1):  # copies held into, through and out of the window
            free.update(v for x, v in program.S[b].items() if x in touched)
    free |= read_only_in(program, min(inside), max(inside) + 1)
    ops = {st.bwd[q] for a in inside for q in st.groups[a]}
    free.update(e for v, e in enumerate(program.E) if p.variants[v].op in ops)
    return frozenset(free)


__all__ = ["Refined", "refine"]
