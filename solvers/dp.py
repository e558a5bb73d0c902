"""Kusumoto et al.'s dynamic program over lower sets (NeurIPS 2019), judged by our simulator.

A lower set L is a set of forward ops closed under predecessors (along forward tensors). A
strategy is a chain of lower sets  {} = L_0 < L_1 < ... < L_k = all forward ops;  block
V_i = L_i - L_(i-1). The forward keeps W_i, the boundary of each block (NOTE [What is kept]); the
backward recomputes, on demand, what it reads of the rest of a block. The program walks the
chains with one Pareto list per lower set (kept bytes against recompute time, or against the
estimated peak) and turns the chains it ends with into schedules, which `simulate()` judges.

Exact: every lower set (exponential in the graph's width). Approximate: the empty set, every
op's ancestor closure and the whole forward (n + 2 sets at most).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from solvers.errors import SolverError
from solvers.lower_sets import Graph, Sets, Timeout, graph, lower_sets
from solvers.ondemand import schedule_from_kept
from solvers.problem import Problem
from solvers.schedule import Schedule, SolveResult, Status, gap_of
from solvers.simulate import Simulation, simulate


@dataclass(frozen=True)
class DpOptions:
    """mode: "time" (least simulated step time within the budget) or "memory" (least
    simulated peak). exact: every lower set (True), ancestor sets only (False), or exact when
    there are at most max_lower_sets lower sets (None). max_approx_sets: ancestor sets beyond it
    are thinned to that many, evenly spaced in order of bytes (the note says so). max_pareto:
    entries kept per lower set
    (evenly thinned beyond it; the note says so). max_searches: programs run by the search over
    the estimate's cap (NOTE [Estimate and truth])."""

    mode: Literal["time", "memory"] = "time"
    exact: bool | None = None
    max_lower_sets: int = 400
    time_limit_s: float = 10.0
    max_approx_sets: int = 200
    max_pareto: int = 16
    max_searches: int = 16


# NOTE [What is kept]
#   Backward ops here read forward tensors directly, so "keeping the boundary" means: for each
#   op of block V_i with a forward successor outside L_i (the boundary ops, W_i), keep every
#   output that anything reads. Boundary ops are then never recomputed (a boundary op keeping
#   only its forward-crossing outputs would be re-run for another output, and so make a second
#   copy of the kept one). Every other op of V_i is recomputed at most once, and only if some
#   backward read needs it: schedule_from_kept recomputes on demand, down to kept tensors, and
#   an input from an earlier block is always a boundary output, so recomputation stays inside
#   the block. Recompute time of a block: the time of its non-boundary ops that are ancestors of
#   a backward read (`need`), exact on chains, an upper bound elsewhere.
#
# NOTE [The last block]
#   Kusumoto's canonical strategy recomputes every block, the last one too (its W is empty).
#   Here the backward starts right after the forward, while the last block's values are still
#   there: all of its ops count as boundary ops, so the last block is kept, not recomputed. Its
#   bytes are already in the estimate (M(V_k) beside D_(k-1)), and with blocks of one op each
#   the chain is store-all.
#
# NOTE [Exact mode]
#   With every lower set listed, one program keeps D[L] as a Pareto list over (kept bytes,
#   recompute time, peak estimate) and so ends with the best chain of every cap at once. These
#   chains, with the least-peak pass's, are simulated, and each budget takes the fastest that
#   fits: the same candidates at every budget, so the time never rises as the budget grows and
#   the least peak is the same at every budget. (The approximate mode searches caps per budget.)
#
# NOTE [Estimate and truth]
#   The program's peak of a chain is  max_i (D_(i-1) + M(V_i))  where D_(i-1) is the bytes kept
#   by the earlier blocks and M(V_i) every byte block i makes (its recomputed values and its own
#   kept outputs): Kusumoto's backward peak without the gradient terms. The simulator's peak is
#   that plus fixed bytes, live gradients, forward outputs and workspace, which do not depend
#   on the chain when the backward handles blocks in reverse order, so the estimate is the
#   simulator's peak up to a chain-independent offset there; it over-counts what a block has
#   already freed, and under-counts when backward ops interleave blocks. So the estimate only
#   ranks chains; it never decides feasibility. The memory-centric pass finds the least cap
#   any chain meets and simulates that cap's chains. The time-centric pass guesses the cap from
#   the least-peak chain's offset (simulated minus estimated peak), gallops or bisects from
#   there, simulates every chain each program ends with, and keeps the fastest that fits
#   (NOTE [Exact mode] for the exact one). The budget is only
#   ever checked against simulate().


@dataclass(frozen=True)
class _Chain:
    """A strategy: indices into Sets from the empty set to the whole forward, with the
    program's own figures (estimated peak, estimated recompute time)."""

    sets: tuple[int, ...]
    peak_est_bytes: int
    recompute_est_s: float


def _program(sets: Sets, cap: float | None, options: DpOptions,
             deadline: float) -> tuple[list[_Chain], bool]:
    """One pass of the time-centric program: D[L] is a Pareto list of (kept bytes, recompute
    time); a transition L -> L' is taken only if D[L] + M(L' - L) <= cap. cap None: every cap
    at once, D[L] a Pareto list of (kept bytes, recompute time, peak estimate). Returns the
    chains at the whole forward (least recompute first), and whether a list was thinned."""
    count = len(sets.masks)
    raw: list[list[tuple]] = [[] for _ in range(count)]
    raw[0].append((0, 0.0, 0, -1, -1))  # (kept bytes, recompute s, peak est, prev set, prev k)
    done: list[list[tuple]] = [[] for _ in range(count)]
    thinned = False
    for s in range(count):
        if time.perf_counter() > deadline:
            raise Timeout
        if cap is None:
            done[s], cut = _pareto3(raw[s], 8 * options.max_pareto)
        else:
            done[s], cut = _pareto(raw[s], options.max_pareto)
        raw[s] = []
        thinned |= cut
        if done[s] and s < count - 1:
            _relax(sets, s, done[s], raw, float("inf") if cap is None else cap)
    chains = [_trace(done, count - 1, k) for k in range(len(done[-1]))]
    return sorted(chains, key=lambda c: (c.recompute_est_s, c.peak_est_bytes)), thinned


def _transitions(sets: Sets, s: int, cap: float):
    """(L', block bytes M(L' - L), kept bytes M(W), recompute time) for every superset L' of
    set s whose block alone fits under `cap`."""
    low, made, need = sets.masks[s], sets.made_bytes[s], sets.need_time_s[s]
    for s2 in range(s + 1, len(sets.masks)):
        block_bytes = sets.made_bytes[s2] - made
        if block_bytes > cap:
            return  # sets come in order of bytes: every later block is as large
        if low & ~sets.masks[s2]:
            continue  # not a superset
        kept_bytes, recompute = 0, sets.need_time_s[s2] - need
        for v, kb, t in sets.boundary[s2]:
            if not low >> v & 1:
                kept_bytes += kb
                recompute -= t
        yield s2, block_bytes, kept_bytes, max(0.0, recompute)


def _relax(sets: Sets, s: int, entries: list[tuple], raw: list[list[tuple]],
           cap: float) -> None:
    for s2, block_bytes, kept_bytes, recompute in _transitions(sets, s, cap - entries[0][0]):
        target = raw[s2]
        for k, (kept, rec, peak, _, _) in enumerate(entries):
            here = kept + block_bytes
            if here > cap:
                break  # entries come in order of kept bytes
            target.append((kept + kept_bytes, rec + recompute, max(peak, here), s, k))


def _reachable(sets: Sets, cap: float, deadline: float) -> bool:
    """Whether some chain's estimated peak is at most `cap` (least kept bytes per set is all
    that matters for that)."""
    least = [float("inf")] * len(sets.masks)
    least[0] = 0
    for s in range(len(sets.masks) - 1):
        if least[s] == float("inf"):
            continue
        if time.perf_counter() > deadline:
            raise Timeout
        for s2, _, kept_bytes, _ in _transitions(sets, s, cap - least[s]):
            least[s2] = min(least[s2], least[s] + kept_bytes)
    return least[-1] < float("inf")


def _pareto(raw: list[tuple], limit: int) -> tuple[list[tuple], bool]:
    """Entries not dominated in (kept bytes, recompute time), ties to the lower peak."""
    raw.sort(key=lambda e: (e[0], e[1], e[2]))
    out, best = [], float("inf")
    for e in raw:
        if e[1] < best:
            out.append(e)
            best = e[1]
    if len(out) <= limit:
        return out, False
    step = (len(out) - 1) / (limit - 1)
    return [out[round(k * step)] for k in range(limit)], True


def _pareto3(raw: list[tuple], limit: int) -> tuple[list[tuple], bool]:
    """Entries not dominated in (kept bytes, recompute time, peak estimate)."""
    raw.sort(key=lambda e: (e[0], e[1], e[2]))
    out: list[tuple] = []
    for e in raw:  # no later entry can dominate an earlier one in this order
        if not any(o[1] <= e[1] and o[2] <= e[2] for o in out):
            out.append(e)
    if len(out) <= limit:
        return out, False
    step = (len(out) - 1) / (limit - 1)
    return [out[round(k * step)] for k in range(limit)], True


def _trace(done: list[list[tuple]], s: int, k: int) -> _Chain:
    _, rec, peak, _, _ = done[s][k]
    path = []
    while s >= 0:
        path.append(s)
        s, k = done[s][k][3], done[s][k][4]
    return _Chain(sets=tuple(reversed(path)), peak_est_bytes=peak, recompute_est_s=rec)


def _kept(g: Graph, sets: Sets, chain: _Chain) -> frozenset[int]:
    kept: set[int] = set()
    for a, b in zip(chain.sets, chain.sets[1:]):
        for v, _, _ in sets.boundary[b]:
            if not sets.masks[a] >> v & 1:
                kept.update(g.kept[v])
    return frozenset(kept)


@dataclass(frozen=True)
class _Found:
    schedule: Schedule
    sim: Simulation
    chain: _Chain | None  # None: store-all's, not read off a program


class _Search:
    """One problem's lower sets, with every chain simulated so far (memoized by kept set)."""

    def __init__(self, problem: Problem, options: DpOptions, deadline: float):
        self.problem, self.options, self.deadline = problem, options, deadline
        self.graph = graph(problem)
        self.sets = lower_sets(self.graph, options.exact, options.max_lower_sets,
                               options.max_approx_sets, deadline)
        self.thinned = False
        self.timed_out = False
        self.programs = 0
        self.least_cap = 0
        self.exhausted = False  # the last program's fastest chain recomputes nothing
        self.last_peak = 0  # and its simulated peak
        self.every: list[_Found] = []  # exact mode: the chains of every cap, simulated
        self.best: _Found | None = None  # the fastest chain found within the budget
        self._seen: dict[frozenset[int], _Found] = {}

    def run(self, cap: float | None) -> list[_Found]:
        """The chains one program ends with, simulated (least estimated recompute first)."""
        chains, cut = _program(self.sets, cap, self.options, self.deadline)
        self.thinned |= cut
        self.programs += 1
        out = []
        for c in chains:
            kept = _kept(self.graph, self.sets, c)
            if kept not in self._seen:
                sched = schedule_from_kept(self.problem, kept)
                self._seen[kept] = _Found(sched, simulate(self.problem, sched), c)
            out.append(self._seen[kept])
        return out

    def seen(self) -> list[_Found]:
        """Every chain simulated so far."""
        return list(self._seen.values())

    def least_peak(self) -> _Found:
        """Memory-centric: the least cap any chain meets (doubling, then bisection, with the
        one-number program), and the least simulated peak among that cap's chains."""
        lo, hi = -1, max(1, *self.graph.made_bytes) if self.graph.n else 1
        while not _reachable(self.sets, hi, self.deadline):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _reachable(self.sets, mid, self.deadline) else (mid, hi)
        found = self.run(hi)
        self.least_cap = hi
        if self.sets.exact:  # NOTE [Exact mode]
            self.every = found + self.run(None)
            found = self.every
        else:  # NOTE [Caps above the least]
            try:
                for step in LEAST_PROBES:
                    found = found + self.run(hi + hi * step // 100)
            except Timeout:
                pass
        return min(found, key=lambda f: (f.sim.peak_bytes, f.sim.time_s))

    def fastest(self, budget_bytes: int, least: _Found) -> None:
        """Time-centric: search the cap from where the least-peak chain's offset between
        estimate and simulation says the budget lies; bisect between a cap whose fastest
        chain fits and one whose does not. `best`: the fastest chain that fits, of all seen."""
        self.best = least
        if self.every:  # exact: the fastest of every cap's chains that fits
            # least fits the budget; it may be store-all, below every chain (rich1045's 55 B)
            fit = [f for f in self.every if f.sim.peak_bytes <= budget_bytes] + [least]
            self.best = min(fit, key=lambda f: (f.sim.time_s, f.sim.peak_bytes))
            return

        def fits(cap: int) -> bool:
            found = self.run(cap)
            for f in found:
                if f.sim.peak_bytes <= budget_bytes and (f.sim.time_s, f.sim.peak_bytes) < (
                        self.best.sim.time_s, self.best.sim.peak_bytes):
                    self.best = f
            self.exhausted = bool(found) and found[0].chain.recompute_est_s == 0.0
            self.last_peak = found[0].sim.peak_bytes if found else budget_bytes
            return bool(found) and found[0].sim.peak_bytes <= budget_bytes

        floor, top = self.least_cap, self.sets.made_bytes[-1]
        close = max(1, budget_bytes // 512)  # a cap this near the last one changes little
        guess = min(top, floor + budget_bytes - least.sim.peak_bytes)
        if guess <= floor:
            return
        lo, hi = floor, guess
        if fits(guess):  # gallop up from the room the fastest chain left under the budget
            step = max(close, budget_bytes - self.last_peak)
            lo, hi = guess, None
            while hi is None and not self.exhausted and lo < top:
                cap = min(top, lo + step)
                lo, hi = (cap, None) if fits(cap) else (lo, cap)
                step *= 2
            if hi is None:
                return
        while hi - lo > close and self.programs < self.options.max_searches:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)


# NOTE [Caps above the least]
#   Over ancestor sets (not exact), a cap is the program's estimate of what a chain holds, and
#   a chain under a larger cap may simulate lower than every chain under the least cap met: on
#   a residual CNN the least-peak pass said 391,320 B, and the time-centric search at a limit of
#   392,571 B returned a chain peaking at 372,888 B, so every limit between was refused with a
#   least above a plan the DP makes (prediction probe, 2026-12-06). The pass runs the program
#   at a few caps above the least too, and takes the least simulated peak of all.
LEAST_PROBES = (5, 10, 25)  # percent above the least cap


def dp(problem: Problem, budget_bytes: int, options: DpOptions) -> SolveResult:
    """Kusumoto's lower-set program: the fastest (mode "time") or least-peak (mode "memory")
    canonical strategy whose simulated peak fits the budget. min_feasible_bytes: the least
    simulated peak of every chain it ran, the memory-centric pass's and those above its cap
    (NOTE [Caps above the least]; its schedule: floor_schedule). Optimal only
    within canonical strategies, so OPTIMAL only when nothing is recomputed."""
    if options.mode not in ("time", "memory"):
        raise SolverError(f"dp: mode must be 'time' or 'memory', got {options.mode!r}")
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    search, least = None, None
    try:
        search = _Search(problem, options, deadline)
        # store-all is a canonical strategy too, and a chain of the least cap may simulate above
        # it: the least peak said was over store-all's, which fits (a GRU between two Linears:
        # 77,648 B where store-all peaks at 71,312 B, refused there; layer zoo, 2026-12-02)
        least = min(search.least_peak(), _store_all(problem),
                    key=lambda f: (f.sim.peak_bytes, f.sim.time_s))
        if least.sim.peak_bytes <= budget_bytes:
            if options.mode == "memory":
                search.best = least
            else:
                search.fastest(budget_bytes, least)
    except Timeout:
        if search is not None:
            search.timed_out = True
    return _result(problem, budget_bytes, search, least, time.perf_counter() - start)


def _store_all(problem: Problem) -> _Found:
    schedule = schedule_from_kept(problem, problem.saved_for_backward)
    return _Found(schedule, simulate(problem, schedule), None)


def _result(problem: Problem, budget_bytes: int, search: _Search | None, least: _Found | None,
            elapsed: float) -> SolveResult:
    bound = problem.no_recompute_time_s
    best = search.best if search is not None else None
    if least is not None and search is not None:  # NOTE [Caps above the least]: any chain seen
        least = min([least, *search.seen()], key=lambda f: (f.sim.peak_bytes, f.sim.time_s))
    min_feasible = least.sim.peak_bytes if least else None
    note = "time limit before the lower sets were listed"
    if search is not None:
        used, listed = len(search.sets.masks), search.sets.listed
        note = f"exact over all {used} lower sets" if search.sets.exact else \
            f"approximate over {used} of {listed} ancestor sets" if used < listed else \
            f"approximate over {used} ancestor sets"
        note += f", {search.programs} programs"
        note += "; Pareto lists thinned" if search.thinned else ""
        note += "; stopped by the time limit" if search.timed_out else ""
    if least is None:
        return SolveResult(solver="dp", status=Status.TIMEOUT, schedule=None, objective_s=None,
                           peak_bytes=None, bound_s=bound, gap=None, solve_time_s=elapsed,
                           min_feasible_bytes=None, note=note)
    if best is None:
        return SolveResult(solver="dp", status=Status.INFEASIBLE, schedule=None,
                           objective_s=None, peak_bytes=None, bound_s=bound, gap=None,
                           solve_time_s=elapsed, min_feasible_bytes=min_feasible, note=note,
                           floor_schedule=least.schedule)
    t = best.sim.time_s
    gap = gap_of(t, bound)
    return SolveResult(solver="dp", status=Status.OPTIMAL if gap == 0.0 else Status.FEASIBLE,
                       schedule=best.schedule, objective_s=t, peak_bytes=best.sim.peak_bytes,
                       bound_s=bound, gap=gap, solve_time_s=elapsed,
                       min_feasible_bytes=min_feasible, note=note,
                       floor_schedule=least.schedule)
