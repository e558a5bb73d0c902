"""What auto tries last where nothing it found fits: the least peak in the time left, and
Checkmate's program, which reorders the backward.

NOTE [The backward reordered]
  Every program of auto's keeps the backward in the problem's order (as MONeT's does);
  Checkmate's lets it move, and so reaches lower peaks: a 4-layer tanh MLP (batch 512) was
  refused at 700,000 B by auto, saying no schedule of its space peaks below 755,728 B and a
  longer solve would find none, where Checkmate planned it at 641,296 B, measured to the byte
  and bitwise eager's (closures probe, 2026-12-07). Where nothing of auto's fits, it now runs
  Checkmate's program in what is left of its time (at least REORDERED_SHARE of it), on
  problems of up to REORDERED_OPS forward ops (its program grows with their square:
  DenseNet-121's took 16 s to build), and takes its schedule where it fits, its least peak
  among the least peaks said.
"""
from __future__ import annotations

import time

from solvers import checkmate, probes
from solvers.problem import Problem
from solvers.remembered import floor_of
from solvers.schedule import Schedule, SolveResult

REORDERED_SHARE = 0.2
REORDERED_OPS = 400


def last_tries(problem: Problem, budget_bytes: int, start: float, limit: float,
               min_peak: int | None, floor: Schedule | None
               ) -> tuple[int | None, Schedule | None, list[SolveResult]]:
    """(least peak, its schedule, [a schedule within the budget] or []) from the probes under
    auto's least peak (NOTEs [The least peak in the time left], [Probes under the least peak]),
    then Checkmate's program (NOTE [The backward reordered]), until `start` + `limit`."""
    from solvers.registry import solve  # it calls this
    deadline = start + limit
    reorder = len(problem.forward_ops) <= REORDERED_OPS
    late = probes.least_until(problem, budget_bytes, deadline - limit * REORDERED_SHARE
                              if reorder else deadline, min_peak)
    min_peak, floor = floor_of([(min_peak, floor), (late.min_feasible_bytes,
                                                    late.floor_schedule)])
    if late.feasible or not reorder:
        return min_peak, floor, [late] if late.feasible else []
    moved = solve(problem, budget_bytes, "checkmate", checkmate.CheckmateOptions(
        time_limit_s=max(1.0, deadline - time.perf_counter())))
    min_peak, floor = floor_of([(min_peak, floor), (moved.min_feasible_bytes,
                                                    moved.floor_schedule)])
    return min_peak, floor, [moved] if moved.feasible else []
