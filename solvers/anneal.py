"""Simulated annealing over kept sets, each recomputed on demand.

NOTE [Annealing kept sets]
  At a tight budget on a deep CNN the memory binds at one moment early in the backward, where
  every kept tensor is still held: what to keep is then a knapsack over the whole network, whose
  item costs depend on one another (dropping a tensor lengthens the recomputation of everything
  that reads it). The joint MILP has to merge ResNet-50's backward into 27 stages and gets no
  further than +46 % on its own (b32, 160², a third of its activations, 90 s); windows, coarse
  or fine, trade only within their stretch of the backward; polishing's drop-and-refill is
  greedy and stops at the first local optimum. Annealing trades across the whole network: from
  the fastest kept set that fits, a move toggles one tensor or swaps a kept one for a dropped
  one; the on-demand schedule of the result is simulated (the one simulator judges every move);
  a move over the budget is refused, a slower one accepted with probability exp(-slowdown / T),
  T falling linearly to zero at the deadline (or after a given number of moves), from half the
  mean forward op's recompute time (ResNet-50's 4.4 ms: 2.2 ms). Seeded, so the same number of
  moves gives the same answer; the clock decides how many moves there are. It stops early after
  STALL_MOVES_PER_TENSOR moves per candidate tensor without a faster schedule (ResNet-50: 211
  tensors, about 10,000 moves, some 12 s at 1.2 ms a move), and auto does not anneal a
  schedule that recomputes nothing: a small problem's solve is not held to its time limit.
  On that ResNet-50 problem at a third, a standalone run from auto's +14.1 % schedule reached
  +9.9 % predicted in 120 s (T0 5 ms). Inside auto (60 s, on saved profiles, the matrix in
  docs/benchmarks/solvers.md), with AUTO_ANNEAL_SHARE of auto's time taken from the MILP's
  (where the MILP is coarsened, as on all of these), before the stall stop: ResNet-50 b32
  160² at a third +12.07 % -> +10.80 %, at half +5.89 -> +5.68 %; ResNet-50 b16 128² at 33 %
  +10.51 -> +9.23 %; DenseNet-121 b16 160² at 40 % +5.36 -> +5.01 %; GoogLeNet b32 128² at 40 %
  +13.35 -> +12.41 %; GPT-2 (narrow) and MobileNetV2 at 40 % unchanged (eviction's schedule
  stays the best: +9.56 % and +7.26 / +7.31 %). With the stall stop, one run on the first:
  +10.40 %.
"""
from __future__ import annotations

import itertools
import math
import random
import time

from solvers.ondemand import schedule_from_kept
from solvers.problem import Problem
from solvers.schedule import Schedule
from solvers.simulate import Simulation, simulate

# The starting temperature, as a share of the mean forward op's recompute time.
START_TEMPERATURE = 0.5
# Annealing stops after this many moves per candidate tensor without a faster schedule.
STALL_MOVES_PER_TENSOR = 50


def anneal(problem: Problem, budget_bytes: int, starts: list[Schedule], deadline: float,
           seed: int = 0, moves: int | None = None) -> tuple[Schedule, Simulation] | None:
    """(schedule, simulation) of the fastest on-demand schedule within `budget_bytes` that
    annealing finds from the fastest kept set of `starts` that fits recomputed on demand (with
    its variants), by `deadline` (time.perf_counter()) or after `moves` moves, whichever
    comes first (the temperature falls with whichever is nearer); None if no start fits so."""
    state = _start(problem, budget_bytes, starts)
    if state is None:
        return None
    chosen, kept, best = state
    plain = problem.with_variants(chosen)
    forward = frozenset(plain.forward_tensors)
    items = sorted((frozenset(plain.saved_for_backward) | kept) & forward)
    if not items:  # the chosen variants leave the backward reading no forward tensor
        return best
    rng = random.Random(seed)
    t0 = time.perf_counter()
    span = max(deadline - t0, 1e-9)
    reruns = [plain.ops[i].rerun_s for i in plain.forward_ops]
    top = START_TEMPERATURE * sum(reruns) / max(1, len(reruns))
    current = best[1].time_s
    stall, last_better = STALL_MOVES_PER_TENSOR * len(items), 0
    for n in itertools.count():
        now = time.perf_counter()
        if (moves is not None and n >= moves) or n - last_better > stall:
            return best
        done = max((now - t0) / span, n / moves if moves is not None else 0.0)
        if done >= 1.0:
            return best
        trial = _move(rng, items, kept)
        schedule = schedule_from_kept(problem, trial, chosen)
        sim = simulate(problem, schedule)
        if sim.peak_bytes > budget_bytes:
            continue
        slower = sim.time_s - current
        temperature = top * (1.0 - done)
        if slower <= 0 or (temperature > 0 and rng.random() < math.exp(-slower / temperature)):
            kept, current = trial, sim.time_s
            if (sim.time_s, sim.peak_bytes) < (best[1].time_s, best[1].peak_bytes):
                best, last_better = (schedule, sim), n


def _start(problem: Problem, budget_bytes: int, starts: list[Schedule]):
    """(variants, kept set, (schedule, simulation)) of the fastest start that fits on demand."""
    best = None
    for s in starts:
        kept = frozenset(s.kept)
        schedule = schedule_from_kept(problem, kept, s.variants)
        sim = simulate(problem, schedule)
        if sim.peak_bytes <= budget_bytes and (best is None or sim.time_s < best[2][1].time_s):
            best = (s.variants, schedule.kept, (schedule, sim))
    return best


def _move(rng: random.Random, items: list[int], kept: frozenset[int]) -> frozenset[int]:
    """One tensor toggled, or (half the time, where both exist) a kept one swapped for a
    dropped one."""
    if rng.random() < 0.5:
        held = [x for x in items if x in kept]
        dropped = [x for x in items if x not in kept]
        if held and dropped:
            return (kept - {rng.choice(held)}) | {rng.choice(dropped)}
    return kept ^ {rng.choice(items)}
