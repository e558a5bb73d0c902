"""Rematerializing under the budget: one pass over the step that evicts what it must and makes
it again when it is read, as often as the budget asks (Kirisame et al.'s Dynamic Tensor
Rematerialization, run offline on the whole step, whose reads are known in advance).

NOTE [Rematerializing under the budget]
  Every other heuristic here chooses a kept set and recomputes on demand (solvers/ondemand.py):
  each forward op at most once in the backward, and what it makes held until its last read.
  Near the least peak that is not enough: a recomputed stretch must itself be dropped and made
  again, which only the MILP's stages allow, and on a transformer the MILP finds little there
  in seconds (BERT-base's H200 problem, b32 seq 512, auto in 12 s at 10 % above its least peak
  of 1,656 MiB: +259 % predicted over store-all, with the boundary bound at +16.7 %).
  This pass walks the forward, then the backward ops in their order, holding every tensor the
  backward reads and counting the bytes as the simulator does (NOTE [Lifetimes] in
  simulate.py). Before an op runs that would go over the budget it evicts held forward copies,
  lowest score first: score = cost^a / (bytes * distance^b), where cost is the time to make the
  copy again from what is then held (its producer and every producer of an input no longer
  held, each once: Kirisame et al.'s evicted neighbourhood, here exact), and distance the steps
  until its next read (Belady's rule: the reads are known). In the forward only copies no later
  forward op reads can go (they are then not kept); in the backward any held forward copy but
  the inputs of the ops being made. A backward op's missing inputs are made again depth-first
  from what is held, the earliest-made input of each op first, each input held while the op's
  other inputs are made (a later-made input first would hold a residual stream's branch while
  the stream is remade back to its start). A copy goes once nothing left in the step reads it
  or anything made from it. Several (a, b) are tried; the simulator judges each schedule.
  The least budget the pass meets is found by bisection (kept with the problem: another solve
  goes on from where it stopped), and its schedule is the floor schedule (NOTE [Least peaks
  remembered] in solvers/remembered.py).
  Auto in 12 s with it and without it, predicted over store-all (docs/benchmarks/remat.md):
  that BERT-base problem at 1,656 / 1,822 MiB +259.5 / +255.1-257.9 % -> +28.8 / +22.7 %,
  its least peak 1,656 -> 1,404 MiB; U-Net's H200 problem (b11 416x608) at half its
  activations +30.3-43.2 -> +23.7-24.4 %; ResNet-50 (CPU, b16 128²) at a third +12.3-12.6 ->
  +8.1 %, its least peak 324.9 -> 265.9 MiB; DenseNet-121's H200 problem (b128) least peak
  2,834 -> 1,781 MiB, its plans above that the other heuristics' (the pass alone 2-17 points
  behind them). On a chain it reaches the floor of three activations, making early ops again
  quadratically often.

NOTE [Rematerializing in auto]
  A rematerialized schedule fits far below what recomputing once reaches, but it is no start
  for polishing and annealing, which recompute their kept sets once. Counted as something
  cheap that fits (NOTE [Nothing cheap fits] in solvers/registry.py), it took the MILP's time
  near the floor: GoogLeNet (b32 128², CPU) at 155 MiB, auto 12 s, +35.7 % without the
  heuristic, +39.8 % with it (docs/benchmarks/remat.md). So it does not count there, nor is it
  polished (it had taken one of the three places of the schedules polished), nor a start for
  annealing (its kept set, recomputed once, could fit and be the fastest start: the bench's
  ResNet-50 problem at a third of its activations, auto 30 s, three runs, +6.4-6.9 % without
  the heuristic, +7.3-7.7 % with it; five runs with it no start, +6.6-7.3 % and +6.2-7.6 %;
  GoogLeNet at a third, auto 12 s, five runs, +19.7-20.9 % and +18.4-19.4 %, where the
  heuristic had cost 0.2-2.2 points; remat.md's run +18.9 and +20.7 %: the cell's spread).
  Fine windows made +39.8 % of its +44.5 % at GoogLeNet's 155 MiB, where without it they had
  made +35.5 % of polishing's +45.1 %: they refine it only where it is faster than the fastest
  schedule recomputing once by more than AUTO_REMAT_MARGIN of the step (BERT-base's H200
  problem at 1,822 MiB: +23.2 % against the MILP's +258 %; windows +22.7 %); with 5 %,
  GoogLeNet at a third of its activations came out at +19.7 % (its +21.3 % refined), where
  windows had made +17.8 % of a schedule recomputing once.

NOTE [The least peak in the time left]
  Below the least peak "auto" finds nothing that fits and says so (InfeasibleBudgetError, with
  the least peak it reached), after its heuristics, the DP and the MILP have run, often well
  before its limit. The pass's least-peak bisection had only its share of the heuristics' time,
  and on a large graph a probe below the pass's least fails slowly (every (a, b) and variant
  choice runs to where it cannot evict: DenseNet-121, the bench's CPU profile at 3b69dad, 1,820
  ops, 2.4 s a pass, against 0.2 s for one that fits), so it rarely got past its first probe.
  Where nothing fits, auto now goes on with the search until its deadline, below the least
  peak it already has (a lower one is all it can add), each probe LEFT_SHARE of the way up
  (fewer of the slow probes that fail). That profile below its floor, auto in 30 s: least
  activations 87.8 MiB in 9.0 s -> 61.2 MiB in 31.7 s (the bisection alone, halving from
  store-all, had kept 87.8 MiB in the same time).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from solvers import variants
from solvers.baselines import best_of
from solvers.problem import Problem
from solvers.remat_pass import Timeout, rematerialize
from solvers.schedule import Schedule, SolveResult, Status
from solvers.simulate import Simulation, simulate

__all__ = ["RematOptions", "Timeout", "from_kept", "least_until", "remat", "rematerialize"]

# The (a, b) of the eviction score cost^a / (bytes * distance^b) tried, in this order.
WEIGHTS = ((1.0, 0.0), (2.0, 1.0), (1.0, 0.5), (1.0, 1.0), (0.5, 1.0), (1.0, 2.0))
# The least-peak bisection stops when its interval is this share of the store-all peak.
LEAST_TOLERANCE = 0.002
# The share of the time limit kept for the least-peak bisection (unless done before), and the
# weights its probes try (the first of WEIGHTS).
LEAST_SHARE = 0.5
LEAST_WEIGHTS = 2
# Where auto goes on with the search in its time left, how far up each probe goes (NOTE [The
# least peak in the time left]).
LEFT_SHARE = 0.75


@dataclass(frozen=True)
class RematOptions:
    """time_limit_s: wall time for the whole solve (a pass still running then is dropped).
    weights: the (a, b) tried (NOTE [Rematerializing under the budget])."""

    time_limit_s: float = 10.0
    weights: tuple[tuple[float, float], ...] = WEIGHTS


def remat(problem: Problem, budget_bytes: int, options: RematOptions) -> SolveResult:
    """The fastest rematerializing pass within the budget, with and without the lightest
    variants (each pass given up once it is slower than the fastest so far); then the least
    budget a pass meets, by bisection in the time left (NOTE [Rematerializing under the
    budget]), reported as min_feasible_bytes."""
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    least = _least(problem, options.weights)
    passes_end = deadline if least.done else start + options.time_limit_s * (1 - LEAST_SHARE)
    found: list[tuple[Schedule, Simulation]] = []
    for chosen, (a, b) in _passes(problem, options.weights):
        if found and time.perf_counter() > passes_end:
            break
        fastest = min((sim.time_s for _, sim in found), default=math.inf)
        try:
            schedule = rematerialize(problem, budget_bytes, a, b, chosen, fastest, deadline)
        except Timeout:
            break
        if schedule is not None:
            sim = simulate(problem, schedule)
            found.append((schedule, sim))
            least.offer(schedule, sim)
    least.run(deadline)
    found.append(least.floor)
    result = best_of("remat", problem, budget_bytes, found, start)
    return dataclasses.replace(result, solve_time_s=time.perf_counter() - start,
                               min_feasible_bytes=least.floor[1].peak_bytes, note=least.note,
                               floor_schedule=least.floor[0])


def from_kept(problem: Problem, budget_bytes: int, kept: frozenset[int],
              chosen: frozenset[int], name: str, deadline: float) -> SolveResult:
    """The fastest pass within the budget (each weight of WEIGHTS, each pass given up once it
    is slower than the fastest so far) whose forward keeps no more than `kept` (with variants
    `chosen`): the backward evicts and makes again what that set does not fit (NOTE [The
    bound's kept set] in solvers/bound_start.py); the result as `name`'s."""
    start = time.perf_counter()
    found: list[tuple[Schedule, Simulation]] = []
    for a, b in WEIGHTS:
        fastest = min((sim.time_s for _, sim in found), default=math.inf)
        try:
            schedule = rematerialize(problem, budget_bytes, a, b, chosen, fastest, deadline,
                                     kept=kept)
        except Timeout:
            break
        if schedule is not None:
            found.append((schedule, simulate(problem, schedule)))
    if not found:
        return SolveResult(solver=name, status=Status.INFEASIBLE, schedule=None,
                           objective_s=None, peak_bytes=None, bound_s=None, gap=None,
                           solve_time_s=time.perf_counter() - start, min_feasible_bytes=None)
    return best_of(name, problem, budget_bytes, found, start)


def least_until(problem: Problem, budget_bytes: int, deadline: float,
                below: int | None = None) -> SolveResult:
    """The least-peak search of remat() with its default weights gone on with until `deadline`
    (time.perf_counter()) below `below`, a peak met otherwise, its lowest pass the result and
    the floor schedule (NOTE [The least peak in the time left])."""
    start = time.perf_counter()
    least = _least(problem, WEIGHTS)
    least.run(deadline, below, LEFT_SHARE)
    result = best_of("remat", problem, budget_bytes, [least.floor], start)
    return dataclasses.replace(result, note=least.note, floor_schedule=least.floor[0])


def _least(problem: Problem, weights) -> _Least:
    """The bisection kept with the problem (another solve goes on where this one stops)."""
    least = problem.memo.get(("remat", weights))
    if least is None:
        least = problem.memo[("remat", weights)] = _Least(problem, weights)
    return least


def _passes(problem: Problem, weights) -> list[tuple[frozenset[int], tuple[float, float]]]:
    light = variants.lightest(problem)
    return [(chosen, w) for w in weights for chosen in ([frozenset(), light] if light
                                                        else [frozenset()])]


class _Least:
    """The bisection for the least budget a pass meets, as far as time has allowed: every
    budget at or above `hi` is met (by `floor`), every one below `lo` was not. Its probes try
    the first LEAST_WEIGHTS weights (with and without the lightest variants)."""

    def __init__(self, problem: Problem, weights) -> None:
        self.problem, self.passes = problem, _passes(problem, weights[:LEAST_WEIGHTS])
        store_all = rematerialize(problem, math.inf, *weights[0], frozenset())
        self.floor: tuple[Schedule, Simulation] = (store_all, simulate(problem, store_all))
        self.lo, self.hi = problem.fixed_bytes, self.floor[1].peak_bytes
        self.tolerance = max(1, int(LEAST_TOLERANCE * self.hi))
        self.probes = 0

    @property
    def done(self) -> bool:
        return self.hi - self.lo <= self.tolerance

    @property
    def note(self) -> str:
        state = "" if self.done else f", stopped by the clock above {self.lo:,} B"
        return (f"rematerialized under the budget (NOTE [Rematerializing under the budget]); "
                f"least peak by bisection in {self.probes} probes{state}")

    def offer(self, schedule: Schedule, sim: Simulation) -> None:
        """A pass's schedule, found elsewhere: the floor if its peak is lower."""
        if sim.peak_bytes < self.hi:
            self.floor, self.hi = (schedule, sim), sim.peak_bytes

    def run(self, deadline: float, below: int | None = None, share: float = 0.5) -> None:
        """Probes until done or `deadline`, each `share` of the way up from `lo` to `hi` (or to
        `below`, a peak known to be met otherwise, if lower: NOTE [The least peak in the time
        left])."""
        while not self.done and time.perf_counter() < deadline:
            top = self.hi if below is None else min(self.hi, below)
            if top - self.lo <= self.tolerance:
                return
            mid = self.lo + int((top - self.lo) * share)
            self.probes += 1
            for chosen, (a, b) in self.passes:
                try:
                    schedule = rematerialize(self.problem, mid, a, b, chosen, deadline=deadline)
                except Timeout:
                    return
                if schedule is not None:
                    sim = simulate(self.problem, schedule)
                    if sim.peak_bytes <= mid:
                        self.offer(schedule, sim)
                        break
            else:
                self.lo = mid
