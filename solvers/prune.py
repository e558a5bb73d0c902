"""Drop recomputation a schedule can do without.

NOTE [Pruning recomputation]
  A schedule from a program that minimizes something other than time (the memory-centric
  program, which `auto` falls back on near the least peak) or from a coarsened one may recompute
  what it need not: a copy nobody reads before the next copy is made, a chain recomputed at a
  stage start that an earlier copy could still serve. Dropping one recomputation step makes its
  readers use the previous copy (NOTE [Lifetimes], rule 3), which then lives longer; the
  simulator says whether the schedule still runs and still fits. `prune` sweeps the backward from
  its end to its start, dropping every step it can, until a sweep drops nothing or time runs out.
  No drop makes the step slower. On ResNet-50 (b16, 128²) at its least peak the memory-centric
  schedule (+391 % predicted) came out at +92 % and +213 % in two runs of `auto` (2.5 s of
  pruning each), and at +122 % from three whole sweeps (4.5 s) on their own.

NOTE [Pruned before windows]
  Fine windows hold everything outside the window at the schedule's values (NOTE [Fine
  windows] in solvers/fine.py), so a schedule that recomputes what it need not (the
  memory-centric program's, near the least peak) has that memory spent in every window and
  barely moves; "auto" pruned only after windows. The MILP solver alone prunes first (NOTE
  [Time left near the floor] in solvers/joint.py), and so does "auto" now, in up to its pruning
  share, taken from fine windows' time (solvers/registry.py). `make bench` at 9c6de41, U-Net at
  its least peak, 100.0 MiB: the MILP's schedule pruned then refined, +49.9 % predicted,
  auto's refined then pruned, +120.1 % (the same least-peak schedule; measured +32.2 /
  +66.7 %). That case did not recur on a new profile of U-Net, where the cut program's schedule
  wins at the least peak (+23.1 % either way). DenseNet-121 (b16 128², a new CPU profile, 30 s),
  one solve each, before -> after: at auto's least peak (159.6 MiB) +34.1 / +32.4 % -> +30.9 /
  +30.9 % (the memory-centric schedule, 50 -> 145 recomputations dropped), 10 % above it +9.3 /
  +9.4 % -> +8.8 / +8.9 %.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from solvers.errors import InvalidScheduleError
from solvers.problem import Problem
from solvers.schedule import Schedule, SolveResult, Status, gap_of
from solvers.simulate import simulate


def prune(problem: Problem, schedule: Schedule, budget_bytes: int,
          deadline: float) -> Schedule:
    """`schedule` with every recomputation step dropped whose removal leaves it runnable within
    `budget_bytes` (NOTE [Pruning recomputation]); stops at `deadline` (time.perf_counter())."""
    is_backward = [op.is_backward for op in problem.with_variants(schedule.variants).ops]
    order = list(schedule.backward)
    dropped = True
    while dropped and time.perf_counter() < deadline:
        dropped = False
        for k in range(len(order) - 1, -1, -1):
            if is_backward[order[k]]:
                continue
            if time.perf_counter() >= deadline:
                break
            trial = dataclasses.replace(schedule, backward=tuple(order[:k] + order[k + 1:]))
            try:
                fits = simulate(problem, trial).peak_bytes <= budget_bytes
            except InvalidScheduleError:
                continue
            if fits:
                del order[k]
                dropped = True
    return dataclasses.replace(schedule, backward=tuple(order))


def drop_unread(problem: Problem, schedule: Schedule) -> Schedule:
    """NOTE [Unread recomputation]
      A recomputation step whose outputs nothing reads before they are made again (or the step
      ends) only reads its inputs, and so do the steps that feed only it. Solvers leave such
      steps (the memory-centric program's schedule below; two of four small random problems'
      least-peak answers in tests/test_prune.py). The executor's dead-code pass drops them,
      but a forward tensor kept for them alone is still saved by the partitioner (a random op,
      which its own dead-code pass keeps, read it), and with no reader left in the backward it
      was held to the step's end, where the simulator had freed it at the dropped step: on
      GPT-2 (b1x256) at its least peak, 26 of the schedule's 29 kept tensors (46.0 of 46.75
      MiB) were kept for such steps only, and the plan measured 993.9 MiB against 947.9
      predicted. So no schedule leaves the solvers with them (solvers.without_unread), nor
      reaches the executor (monet_opt/api.py; the executor refuses a saved tensor nobody
      reads): one sweep from the backward's end keeps a recomputation step only where a later
      step, or the step's end for what the backward returns, reads one of its outputs before
      it is made again, and keeps a forward tensor only where the backward reads it. Dropping
      frees memory no later and costs no time: on that schedule 87 of 1251 recomputed runs
      went, the predicted step 2.95 -> 2.82 s, the peak stayed 947.9 MiB, now measured so."""
    ops = problem.with_variants(schedule.variants).ops
    needed = set(problem.backward_outputs)
    order = []
    for i in reversed(schedule.backward):
        op = ops[i]
        if not op.is_backward and needed.isdisjoint(op.outputs):
            continue
        needed.difference_update(op.outputs)
        needed.update(op.inputs)
        order.append(i)
    kept = schedule.kept & needed
    if len(order) == len(schedule.backward) and kept == schedule.kept:
        return schedule
    return dataclasses.replace(schedule, kept=frozenset(kept), backward=tuple(reversed(order)))


def without_unread(problem: Problem, result: SolveResult,
                   budget_bytes: int | None = None) -> SolveResult:
    """`result` with its schedule's and least-peak schedule's unread recomputation dropped
    (NOTE [Unread recomputation] in solvers/prune.py), their time and peak simulated again.
    An infeasible result whose least-peak schedule then fits `budget_bytes` is feasible with
    it: dropping brought its peak down to the budget, and a caller told to raise the budget
    to a least peak the budget already was (a milp answer at 104 B pruned to 103 B, asked at
    103 B) was refused again at it."""
    changes: dict[str, Any] = {}
    if result.schedule is not None:
        schedule = drop_unread(problem, result.schedule)
        if schedule != result.schedule:
            sim = simulate(problem, schedule)
            note = _unread_note(result.schedule, schedule)
            gap = None if result.gap is None else gap_of(sim.time_s, result.bound_s)
            changes.update(schedule=schedule, objective_s=sim.time_s, peak_bytes=sim.peak_bytes,
                           gap=gap, note=f"{result.note}; {note}" if result.note else note)
            if result.min_feasible_bytes is not None and sim.peak_bytes < \
                    result.min_feasible_bytes:  # no least above its own peak (checkmate's)
                changes.update(min_feasible_bytes=sim.peak_bytes, floor_schedule=schedule)
    if result.floor_schedule is not None:
        floor = drop_unread(problem, result.floor_schedule)
        if floor != result.floor_schedule:
            peak = simulate(problem, floor).peak_bytes
            least = changes.get("min_feasible_bytes", result.min_feasible_bytes)
            if least is None or peak <= least:
                changes.update(floor_schedule=floor, min_feasible_bytes=peak)
    result = dataclasses.replace(result, **changes) if changes else result
    if result.feasible or budget_bytes is None or result.floor_schedule is None or \
            result.min_feasible_bytes is None or result.min_feasible_bytes > budget_bytes:
        return result
    sim = simulate(problem, result.floor_schedule)
    if sim.peak_bytes > budget_bytes:
        return result
    note = "its least-peak schedule, with unread recomputation dropped, fits the budget"
    return dataclasses.replace(result, status=Status.FEASIBLE, schedule=result.floor_schedule,
                               objective_s=sim.time_s, peak_bytes=sim.peak_bytes,
                               gap=gap_of(sim.time_s, result.bound_s),
                               note=f"{result.note}; {note}" if result.note else note)


def _unread_note(before: Schedule, after: Schedule) -> str:
    """What drop_unread took from `before`: recomputation steps, kept tensors, or both."""
    steps = len(before.backward) - len(after.backward)
    kept = len(before.kept) - len(after.kept)
    parts = [f"{n} {what}" for n, what in ((steps, "unread recomputations"),
                                            (kept, "kept tensors nothing reads")) if n]
    return f"{' and '.join(parts)} dropped (NOTE [Unread recomputation])"
