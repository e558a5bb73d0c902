"""Baseline solvers: store-all, Chen et al.'s sqrt(n) segments and their budget-aware greedy.

Chen, Xu, Zhang, Guestrin (2016), "Training Deep Nets with Sublinear Memory Cost": cut the
forward into segments, keep what crosses a segment boundary, recompute each segment during the
backward. The greedy variant closes a segment once its activations exceed a threshold b; we
sweep b (and the two keep rules below) and return the fastest schedule within the budget.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from solvers.ondemand import schedule_from_kept
from solvers.problem import Problem
from solvers.schedule import Schedule, SolveResult, Status, gap_of
from solvers.simulate import Simulation, simulate


@dataclass(frozen=True)
class BaselineOptions:
    """thresholds: how many segment thresholds the greedy sweep tries (geometric grid)."""

    thresholds: int = 48


def store_all(problem: Problem, budget_bytes: int, options: BaselineOptions) -> SolveResult:
    """Keep every forward tensor the backward reads; recompute nothing. When it fits it is
    optimal: no schedule can be faster than running each op once."""
    start = time.perf_counter()
    sched = schedule_from_kept(problem, problem.saved_for_backward)
    return best_of("store_all", problem, budget_bytes, [(sched, simulate(problem, sched))], start)


def chen_sqrt(problem: Problem, budget_bytes: int, options: BaselineOptions) -> SolveResult:
    """sqrt(n) segments of equal op count, keeping what crosses a segment boundary."""
    start = time.perf_counter()
    fwd = problem.forward_ops
    n_seg = max(1, round(math.sqrt(len(fwd))))
    segment = {op: min(n_seg - 1, k * n_seg // max(1, len(fwd))) for k, op in enumerate(fwd)}
    sched = schedule_from_kept(problem, _crossing(problem, segment))
    return best_of("chen_sqrt", problem, budget_bytes, [(sched, simulate(problem, sched))], start)


def chen_greedy(problem: Problem, budget_bytes: int, options: BaselineOptions) -> SolveResult:
    """Chen's greedy segmentation, swept over its threshold; the fastest schedule that fits."""
    start = time.perf_counter()
    candidates = [(s, simulate(problem, s)) for s in greedy_candidates(problem, options)]
    return best_of("chen_greedy", problem, budget_bytes, candidates, start)


def chen(problem: Problem, budget_bytes: int, options: BaselineOptions) -> SolveResult:
    """The better of chen_sqrt and chen_greedy: the faster schedule within the budget (ties:
    the smaller peak); its least peak is the lower of theirs. The note names the one chosen."""
    start = time.perf_counter()
    results = [chen_sqrt(problem, budget_bytes, options), chen_greedy(problem, budget_bytes,
                                                                      options)]
    min_peak = min(r.min_feasible_bytes for r in results)
    fits = [r for r in results if r.feasible]
    best = min(fits, key=lambda r: (r.objective_s, r.peak_bytes)) if fits else results[0]
    return dataclasses.replace(best, solver="chen", min_feasible_bytes=min_peak,
                               solve_time_s=time.perf_counter() - start,
                               note=f"{best.solver}'s schedule" if fits else "")


def greedy_candidates(problem: Problem, options: BaselineOptions) -> list[Schedule]:
    sizes = [sum(problem.tensors[t].bytes for t in problem.ops[i].outputs)
             for i in problem.forward_ops]
    total, smallest = sum(sizes), min((s for s in sizes if s > 0), default=0)
    if total == 0:
        return [schedule_from_kept(problem, problem.saved_for_backward)]
    grid = _geometric(smallest, total, options.thresholds)
    seen: set[Schedule] = set()
    out: list[Schedule] = []
    for b in grid:
        segment, boundary = _greedy_segments(problem, sizes, b)
        for kept in (_crossing(problem, segment), boundary):
            sched = schedule_from_kept(problem, kept)
            if sched not in seen:
                seen.add(sched)
                out.append(sched)
    return out


def _greedy_segments(problem: Problem, sizes: list[int], threshold: float):
    """Walk the forward; close a segment (keeping its last op's outputs) once the bytes made
    since the last cut exceed `threshold`."""
    segment: dict[int, int] = {}
    boundary: set[int] = set()
    seg, acc = 0, 0
    for op, size in zip(problem.forward_ops, sizes):
        segment[op] = seg
        acc += size
        if acc > threshold:
            boundary.update(problem.ops[op].outputs)
            seg, acc = seg + 1, 0
    return segment, frozenset(boundary)


def _crossing(problem: Problem, segment: dict[int, int]) -> frozenset[int]:
    """Forward tensors read by a forward op in a later segment."""
    kept = set()
    for t in problem.forward_tensors:
        s = segment[problem.tensors[t].producer]
        if any(not problem.ops[u].is_backward and segment[u] > s for u in problem.consumers[t]):
            kept.add(t)
    return frozenset(kept)


def _geometric(lo: float, hi: float, n: int) -> list[float]:
    if n <= 1 or lo >= hi:
        return [hi]
    ratio = (hi / lo) ** (1.0 / (n - 1))
    return [lo * ratio ** k for k in range(n)]


def best_of(name: str, problem: Problem, budget_bytes: int,
            candidates: list[tuple[Schedule, Simulation]], start: float) -> SolveResult:
    """The fastest candidate within the budget (ties: the smaller peak), with the gap measured
    against the no-recomputation time, a valid lower bound on any schedule."""
    min_peak = min(sim.peak_bytes for _, sim in candidates)
    fits = [(sim.time_s, sim.peak_bytes, k) for k, (_, sim) in enumerate(candidates)
            if sim.peak_bytes <= budget_bytes]
    bound = problem.no_recompute_time_s
    elapsed = time.perf_counter() - start
    if not fits:
        return SolveResult(solver=name, status=Status.INFEASIBLE, schedule=None,
                           objective_s=None, peak_bytes=None, bound_s=bound, gap=None,
                           solve_time_s=elapsed, min_feasible_bytes=min_peak)
    _, _, k = min(fits)
    sched, sim = candidates[k]
    gap = gap_of(sim.time_s, bound)
    status = Status.OPTIMAL if gap == 0.0 else Status.FEASIBLE
    return SolveResult(solver=name, status=status, schedule=sched, objective_s=sim.time_s,
                       peak_bytes=sim.peak_bytes, bound_s=bound, gap=gap, solve_time_s=elapsed,
                       min_feasible_bytes=min_peak)
