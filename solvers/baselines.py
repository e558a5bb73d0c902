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
from typing import Any, Iterator, NamedTuple, Sequence

from solvers.ondemand import schedule_from_kept
from solvers.problem import Problem
from solvers.schedule import SolveResult, Status, gap_of
from solvers.simulate import Simulation, simulate


@dataclass(frozen=True)
class BaselineOptions:
    """thresholds: how many segment thresholds the greedy sweep tries (geometric grid).
    time_limit_s: wall time chen_greedy may spend on the sweep (coarse to fine, at least one
    candidate; a later call on the same problem goes on where it stopped)."""

    thresholds: int = 48
    time_limit_s: float = math.inf


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
    """Chen's greedy segmentation, swept over its threshold; the fastest schedule that fits
    among those simulated in the time limit."""
    start = time.perf_counter()
    sweep = problem.memo.get(("chen_greedy", options.thresholds))
    if sweep is None:
        sweep = problem.memo[("chen_greedy", options.thresholds)] = _Sweep(problem, options)
    # best_of picks a recipe (the schedules themselves are not kept: thousands of ops each)
    found = best_of("chen_greedy", problem, budget_bytes,
                    sweep.run(start + options.time_limit_s), start)
    if found.schedule is None:
        return found
    return dataclasses.replace(found, schedule=schedule_from_kept(
        problem, sweep.kept(*found.schedule)))


class _Judged(NamedTuple):
    peak_bytes: int
    time_s: float


class _Sweep:
    """The greedy sweep's candidates, simulated as time allows, kept with the problem (the
    budget only picks among them): each as its recipe (threshold, whether kept at segment
    boundaries), its peak and its time."""

    def __init__(self, problem: Problem, options: BaselineOptions) -> None:
        self.problem = problem
        self.sizes = [sum(problem.tensors[t].bytes for t in problem.ops[i].outputs)
                      for i in problem.forward_ops]
        self.pending = self._recipes(options)
        self.done: list[tuple[tuple[float | None, bool], _Judged]] = []

    def run(self, deadline: float) -> list[tuple[tuple[float | None, bool], _Judged]]:
        for recipe, kept in self.pending:
            sim = simulate(self.problem, schedule_from_kept(self.problem, kept))
            self.done.append((recipe, _Judged(sim.peak_bytes, sim.time_s)))
            if time.perf_counter() > deadline:
                break
        return self.done

    def kept(self, threshold: float | None, at_boundaries: bool) -> frozenset[int]:
        if threshold is None:  # the forward makes nothing: store-all's
            return self.problem.saved_for_backward
        segment, boundary = _greedy_segments(self.problem, self.sizes, threshold)
        return boundary if at_boundaries else _crossing(self.problem, segment)

    def _recipes(self, options: BaselineOptions) -> Iterator[
            tuple[tuple[float | None, bool], frozenset[int]]]:
        """Each distinct kept set with its recipe, made as asked for: the thresholds of the
        grid coarse to fine (its ends, its middle, the quarters, ...), so that a sweep cut
        short has tried the whole range."""
        total = sum(self.sizes)
        if total == 0:
            yield (None, True), self.kept(None, True)
            return
        smallest = min(s for s in self.sizes if s > 0)
        seen: set[int] = set()  # the kept sets' hashes (the sets would be held for good)
        for b in _coarse_to_fine(_geometric(smallest, total, options.thresholds)):
            for at_boundaries in (False, True):
                kept = self.kept(b, at_boundaries)
                if hash(kept) not in seen:
                    seen.add(hash(kept))
                    yield (b, at_boundaries), kept


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


def _coarse_to_fine(grid: list[float]) -> list[float]:
    """The grid's points, each once: its ends, then halving the step between those taken."""
    order = [0, len(grid) - 1]
    step = 1 << max(0, (len(grid) - 1).bit_length() - 1)
    while step:
        order += range(step, len(grid), step)
        step //= 2
    return [grid[k] for k in dict.fromkeys(order)]


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
            candidates: Sequence[tuple[Any, Simulation | _Judged]],
            start: float) -> SolveResult:
    """The fastest candidate within the budget (ties: the smaller peak), with the gap measured
    against the no-recomputation time, a valid lower bound on any schedule. A candidate: (its
    schedule, or what names it, as the result's schedule; its simulation's peak and time)."""
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
