"""Cheapest-first eviction: keep what the backward reads, except what is cheapest to recompute
per byte, and no more of it than the budget needs.

Chen's segmentations cut the forward by position and recompute whole segments, matmuls
included. Where a model's memory sits in tensors that cheap ops make (a transformer's attention
probabilities, dropout masks, activations after a norm), recomputing those alone frees most of
the memory for a fraction of the time: what torch.compile's partitioner does by banning the
recomputation of expensive ops. This solver ranks the store-all kept set by recompute seconds
per byte and evicts the fewest leading tensors of that ranking that fit the budget (the
simulator judges every candidate), then re-ranks against what is left and repeats, then puts
back, most expensive first, whatever still fits.

NOTE [Recompute cost]
  Evicting x means its producer runs again in the backward, and so does every producer of an
  input that is no longer held (on-demand recomputation stops at kept tensors). cost(x | kept)
  sums the time of that closure (Problem.remake_s, which rematerializing scores by too); it is
  re-ranked each round, since every eviction lengthens the closures of what reads the evicted
  tensor. The ranking is a heuristic; the simulator's time and peak are what the result
  reports.
"""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass

from solvers.baselines import best_of
from solvers.ondemand import schedule_from_kept
from solvers.problem import NO_PRODUCER, Problem
from solvers.schedule import Schedule, SolveResult, Status
from solvers.simulate import Simulation, simulate


@dataclass(frozen=True)
class EvictOptions:
    """rounds: how often the ranking is recomputed against what is still kept. probes: how many
    eviction counts each round simulates before bisecting. time_limit_s: wall time for the
    whole solve (the least-peak search gets its first LEAST_SHARE; putting back stops at the
    end: NOTE [Least peak over rankings])."""

    rounds: int = 8
    probes: int = 24
    time_limit_s: float = 10.0


def evict(problem: Problem, budget_bytes: int, options: EvictOptions) -> SolveResult:
    """The fastest schedule found within the budget by cheapest-first eviction.
    min_feasible_bytes is the least peak of the same search aimed at zero bytes (then at that
    peak: NOTE [Aimed at the least peak]), whatever the budget; a budget below it is answered
    INFEASIBLE, so the answer does not depend on luck
    (on graphs of thousands of ops, on how many rankings its time allowed: NOTE [Least peak
    over rankings])."""
    start = time.perf_counter()
    least_peak, least_kept = _least_peak(problem, options.rounds, options.probes,
                                         start + options.time_limit_s * LEAST_SHARE)
    seen: list[tuple[Schedule, Simulation]] = []

    def judge(k: frozenset[int]) -> Simulation:
        sched = schedule_from_kept(problem, k)
        sim = simulate(problem, sched)
        seen.append((sched, sim))
        return sim

    floor = schedule_from_kept(problem, least_kept)  # NOTE [The least peak's schedule]
    if budget_bytes < least_peak:
        return SolveResult(solver="evict", status=Status.INFEASIBLE, schedule=None,
                           objective_s=None, peak_bytes=None, bound_s=problem.no_recompute_time_s,
                           gap=None, solve_time_s=time.perf_counter() - start,
                           min_feasible_bytes=least_peak, floor_schedule=floor)
    deadline = start + options.time_limit_s
    kept = _search(problem, frozenset(problem.saved_for_backward), budget_bytes, judge, options,
                   deadline)
    _put_back(problem, kept, budget_bytes, judge, deadline)
    judge(least_kept)  # fits: budget_bytes >= least_peak
    return dataclasses.replace(best_of("evict", problem, budget_bytes, seen, start),
                               min_feasible_bytes=least_peak, floor_schedule=floor)


# NOTE [The least peak's schedule]
#   The least peak comes with the schedule that reaches it (floor_schedule), as the other
#   solvers' do, so that a caller can keep it and meet that peak later (optimize() recalls it
#   in the process, NOTE [Least peaks recalled in the process]). Eviction returned none: where
#   its least peak was auto's, nothing was recalled, and a second optimize() at that least peak,
#   on a profile taken again, was refused with a higher one (a tiny Swin V2: 747,980 B named,
#   then refused at 757,196 B, 4 runs of 6; torchvision probe, 2026-12-06).


# NOTE [Least peak over rankings]
#   Where eviction aimed at zero bytes ends depends on the order of its ranking, and so on the
#   profiled times: on GoogLeNet (b32, 128², the lightest variants; its kept problem in
#   docs/benchmarks/problems_cpu.json.gz) ten draws of its times jittered by up to 10 % ended it
#   anywhere from 155.4 to 163.6 MiB, and fresh profiles of that model gave "auto" least peaks
#   of 156.2 MiB (eviction's) and 162.6 MiB (the MILP's; eviction ended higher). So the search
#   aimed at zero also runs under LEAST_RANKINGS more rankings, each tensor's cost jittered by up to
#   LEAST_JITTER (seeded: the same problem always gives the same answer), and the lowest peak
#   of all is the least peak. The same ten draws then end at 155.4 MiB seven times, 156.2 once,
#   159.4 twice. It costs four more searches: on GoogLeNet 0.1 -> 0.5 s, on DenseNet-121 (b16,
#   128², plain and with the lightest variants) 0.5 -> 2.8 s, where its eviction's least went
#   from 259.5 to 247.0 MiB (auto's least there, the MILP's, is far lower: 160.9 MiB).
#   On a graph of thousands of ops the five searches take seconds (an LSTM cell unrolled over
#   256 steps, 9,731 ops: 11.5 s of eviction's), so they run only in the first LEAST_SHARE of
#   eviction's time limit (the profiled ranking's always begins; each stops between rounds),
#   and a later solve of the problem goes on with the rankings not begun.
#
# NOTE [Aimed at the least peak]
#   A search ends lower aimed at a budget than aimed at zero, once putting back follows it:
#   re-keeping a tensor can lower the peak (its recomputed copy was held longer than the kept
#   one). On a fuzzed problem (rich5) the search aimed at zero ended at 282 B, and the solve at
#   282 B returned a schedule peaking at 252 B, while every budget in [252, 282) was answered
#   infeasible with a least peak of 282 B. So, after the rankings, the least peak is searched
#   again aimed at itself, with putting back, until it no longer falls (282 -> 252 B there):
#   what a solve at the least peak finds is in the least peak (at most LEAST_AIMED searches).
LEAST_RANKINGS = 4
LEAST_AIMED = 8
LEAST_JITTER = 0.1
LEAST_SHARE = 0.5
# The share of polishing's time in which each schedule's kept set is put back into, split
# evenly among the schedules (NOTE [Polishing]); drop and refill gets the rest.
PUT_BACK_SHARE = 0.5


def _least_peak(problem: Problem, rounds: int, probes: int,
                deadline: float) -> tuple[int, frozenset[int]]:
    """The search aimed at a budget of zero: the least peak it reaches, and its kept set
    (NOTE [Least peak over rankings]); the jittered rankings only until `deadline`, and the
    search running then stops after its round (a later call on the problem goes on with the
    rankings not begun)."""
    memo = problem.memo.setdefault(("evict_least", rounds, probes), {"best": [], "seeds": 0})
    best = memo["best"]

    def judge(k: frozenset[int]) -> Simulation:
        sim = simulate(problem, schedule_from_kept(problem, k))
        best.append((sim.peak_bytes, k))
        return sim

    options = EvictOptions(rounds=rounds, probes=probes, time_limit_s=float("inf"))
    kept = frozenset(problem.saved_for_backward)
    for seed in range(memo["seeds"], LEAST_RANKINGS + 1):
        if seed and time.perf_counter() > deadline:
            break
        rng = random.Random(seed)
        jitter = None if seed == 0 else \
            {x: rng.uniform(1 - LEAST_JITTER, 1 + LEAST_JITTER) for x in sorted(kept)}
        _search(problem, kept, 0, judge, options, deadline, jitter)
        memo["seeds"] = seed + 1
    least = min(best, key=lambda b: (b[0], sorted(b[1])))
    while memo["seeds"] > LEAST_RANKINGS and memo.get("aimed", 0) < LEAST_AIMED \
            and memo.get("aimed_at") != least[0] and time.perf_counter() <= deadline:
        memo["aimed"], memo["aimed_at"] = memo.get("aimed", 0) + 1, least[0]
        _put_back(problem, _search(problem, kept, least[0], judge, options, deadline),
                  least[0], judge, deadline)  # NOTE [Aimed at the least peak]
        least = min(best, key=lambda b: (b[0], sorted(b[1])))
    return least


def _search(problem: Problem, kept: frozenset[int], budget_bytes: int, judge,
            options: EvictOptions, deadline: float,
            jitter: dict[int, float] | None = None) -> frozenset[int]:
    """Rounds of ranking and evicting until the budget fits (or nothing more helps); `jitter`
    scales each tensor's cost in the ranking."""
    if judge(kept).peak_bytes <= budget_bytes:
        return kept
    evictable = {x for x in kept if problem.tensors[x].producer != NO_PRODUCER}
    for _ in range(options.rounds):
        ranked = _ranked(problem, kept, evictable & kept, jitter)
        k, fits = _evict_count(ranked, kept, budget_bytes, judge, options.probes)
        kept = kept - frozenset(ranked[:k])
        if fits or k == 0 or time.perf_counter() > deadline:
            break
    return kept


def _ranked(problem: Problem, kept: frozenset[int], candidates: set[int],
            jitter: dict[int, float] | None = None) -> list[int]:
    """Candidates by recompute seconds per byte, cheapest first (NOTE [Recompute cost]), each
    cost scaled by its `jitter` where given."""
    def key(x: int) -> tuple[float, int]:
        size = problem.tensors[x].bytes
        scale = jitter.get(x, 1.0) if jitter else 1.0
        return (problem.remake_s(x, kept) * scale / size if size else float("inf"), x)
    return sorted(candidates, key=key)


def _evict_count(ranked: list[int], kept: frozenset[int], budget_bytes: int, judge,
                 probes: int) -> tuple[int, bool]:
    """How many leading tensors of `ranked` to evict: the fewest that fit (probed on a grid,
    then bisected below the first fit), else the count with the lowest peak. NOTE [Why not
    evict everything]: recomputed copies live until their last read, so evicting a long
    chain brings it all back at once; the peak is not monotone in the count."""
    grid = sorted({round(j * len(ranked) / probes) for j in range(probes + 1)})
    peaks = {k: judge(kept - frozenset(ranked[:k])).peak_bytes for k in grid}
    fitting = [k for k in grid if peaks[k] <= budget_bytes]
    if not fitting:
        return min(grid, key=lambda k: (peaks[k], k)), False
    hi = fitting[0]
    lo = max((k for k in grid if k < hi), default=hi)
    while lo + 1 < hi:  # evicting ranked[:hi] fits, ranked[:lo] did not
        mid = (lo + hi) // 2
        if judge(kept - frozenset(ranked[:mid])).peak_bytes <= budget_bytes:
            hi = mid
        else:
            lo = mid
    return hi, True


def polish(problem: Problem, budget_bytes: int, schedules: list[Schedule],
           time_limit_s: float) -> SolveResult:
    """NOTE [Polishing]: other solvers' schedules, each reduced to its kept set (and variants),
    recomputed on demand and then put back into greedily (most expensive per byte first) while
    the budget holds. At budgets below what eviction itself reaches, the DP's and the MILP's
    schedules keep less than they could: on ResNet-50 near its least peak this takes 6-13 % off
    their step time. Then, while time is left, a local search from the fastest of them
    (NOTE [Drop and refill]). The fastest of all (the schedules themselves included) that
    fits.
    Putting back tries every evicted tensor, one simulation each: on DenseNet-121 (the bench's
    CPU profile, 1,577 ops) over a second a schedule, and auto polishes in what is left of its
    limit, there a second. The first schedule (the fastest, often eviction's own, which gains
    nothing) took it all: at 269.6 MiB polishing eviction's, the MILP's and the DP's schedules
    in 1 s gave eviction's +16.9 %, the DP's alone +11.0 %. So each schedule is put back into
    in its share of the first PUT_BACK_SHARE of the time (what one leaves goes to the next):
    the three in 1 s +11.0 %. Auto on that profile, 30 s, before -> after: 40 % of eager's peak
    +13.7 -> +10.6 %, the floor and a third of eager's activations +15.2 / +16.9 (two runs) ->
    +9.8 %, half +8.9 -> +8.2 %; the kept CPU and H200 problems (ResNet-50, GoogLeNet, U-Net,
    BERT-base, DenseNet-121, at 50 / 33 / 25 % of their activations) within their spread
    (GoogLeNet CPU at 25 %: +25.3 / +25.8 / +25.8 % before, +27.5 / +25.1 / +25.8 % after)."""
    start = time.perf_counter()
    deadline = start + time_limit_s
    seen: list[tuple[Schedule, Simulation]] = [(s, simulate(problem, s)) for s in schedules]
    refilled: list[tuple[float, frozenset[int], frozenset[int]]] = []
    shares_end = start + time_limit_s * PUT_BACK_SHARE
    for i, sched in enumerate(schedules):
        now = time.perf_counter()
        if now > deadline:
            break
        own = now + max(0.0, shares_end - now) / (len(schedules) - i)
        plain = problem.with_variants(sched.variants)
        judge = _judge_into(problem, sched.variants, seen)
        kept = frozenset(sched.kept) & frozenset(plain.forward_tensors)
        if judge(kept).peak_bytes <= budget_bytes:
            kept = _put_back(plain, kept, budget_bytes, judge, own)
            refilled.append((judge(kept).time_s, kept, sched.variants))
    if refilled:
        _, kept, chosen = min(refilled, key=lambda r: r[0])
        _drop_and_refill(problem.with_variants(chosen), kept, budget_bytes,
                         _judge_into(problem, chosen, seen), deadline)
    return best_of("polish", problem, budget_bytes, seen, start)


def fitted(problem: Problem, budget_bytes: int, kept: frozenset[int], chosen: frozenset[int],
           name: str, time_limit_s: float) -> SolveResult:
    """`kept` (with variants `chosen`) recomputed on demand, and where that is over the budget,
    eviction's rounds from it (cheapest per byte first) until it fits; the result as `name`'s,
    infeasible where none fits."""
    start = time.perf_counter()
    seen: list[tuple[Schedule, Simulation]] = []
    plain = problem.with_variants(chosen)
    _search(plain, kept & frozenset(plain.forward_tensors), budget_bytes,
            _judge_into(problem, chosen, seen), EvictOptions(), start + time_limit_s)
    return best_of(name, problem, budget_bytes, seen, start)


def _judge_into(problem: Problem, chosen: frozenset[int], seen: list):
    """A judge of kept sets (with variants `chosen`) that records every simulation in `seen`."""
    def judge(k: frozenset[int]) -> Simulation:
        s = schedule_from_kept(problem, k, chosen)
        sim = simulate(problem, s)
        seen.append((s, sim))
        return sim
    return judge


def _drop_and_refill(problem: Problem, kept: frozenset[int], budget_bytes: int, judge,
                     deadline: float) -> frozenset[int]:
    """NOTE [Drop and refill]: putting back greedily stops where the next tensor by cost per
    byte no longer fits, though dropping one cheap kept tensor may make room for dearer ones.
    So: drop one kept tensor (cheapest to recompute per byte first), put back greedily, and
    keep the result if it is faster; repeat until a whole pass finds nothing or time is up.
    On ResNet-50 (batch 16, 128x128) at a third of its activations it took auto's schedule
    from +15.5 % to +13.0 % predicted in 5 s of polishing, and to +12.8 % in 15 s."""
    best = judge(kept).time_s
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for x in _ranked(problem, kept, set(kept) & set(problem.saved_for_backward)):
            if time.perf_counter() > deadline:
                break
            trial = _put_back(problem, kept - {x}, budget_bytes, judge, deadline)
            sim = judge(trial)
            if sim.peak_bytes <= budget_bytes and sim.time_s < best - 1e-12:
                kept, best, improved = trial, sim.time_s, True
                break
    return kept


def _put_back(problem: Problem, kept: frozenset[int], budget_bytes: int, judge,
              deadline: float) -> frozenset[int]:
    """Re-keep evicted tensors, most expensive per byte first, while the budget holds."""
    out = sorted(set(problem.saved_for_backward) - kept, reverse=True,
                 key=lambda x: problem.remake_s(x, kept) / max(1, problem.tensors[x].bytes))
    for x in out:
        if time.perf_counter() > deadline:
            break
        if judge(kept | {x}).peak_bytes <= budget_bytes:
            kept = kept | {x}
    return kept
