"""A start for auto from the boundary bound's program: the kept set its solution at the first
backward op holds, made into schedules that fit.

NOTE [The bound's kept set]
  The program at the first backward op alone (one cut) is small (HiGHS solves it in 0.1-0.6 s
  on the kept problems), and its least-time solution is a kept set, the copies alive then,
  with variants: what that moment's memory forces out, chosen across the whole network at
  once, the knapsack annealing walks toward one swap at a time (NOTE [Annealing kept sets]).
  Recomputed on demand it took exactly the bound's time on every kept problem, but the
  moments later in the backward, where recomputed copies and gradients are alive too, go over
  the budget: by 1-6 % on GoogLeNet (CPU) and DenseNet-121 (H200), 13 % on BERT-base (H200),
  26-62 % on ResNet-50 (CPU, H200). Eviction's rounds from it (cheapest per byte first, NOTE
  [Recompute cost] in solvers/evict.py) make it fit where the excess is small: GoogLeNet at a
  third of its activations +16.2 % predicted (the bound +12.0 %; eviction's own +32 %),
  DenseNet-121 at a quarter +14.4 %; not on ResNet-50. Lowering the program's budget does not
  help there (ResNet-50 at a third, CPU: at 50-100 % of the activations' budget every kept
  set overshoots by 18-26 %), nor do the later live sets of a program with more cuts, used to
  drop copies at each cut (2-16 cuts: 1-48 % over): the excess comes between the moments
  looked at, where a chain recomputed on demand is held to its last read. So the kept set is
  also rematerialized: the forward keeps no more than it, and the backward evicts and makes
  again what does not fit (NOTE [Rematerializing under the budget] in solvers/remat.py),
  in under a second: GoogLeNet (CPU) at a half / a third / a quarter of its activations
  +5.1 / +13.3 / +23.2 % predicted (on demand and evicted +5.6 / +16.2 % / none fits),
  BERT-base (H200) at a third +12.2 % (+12.4 %); far slower where the on-demand one fits
  (DenseNet-121, H200, +16.9-29.7 % against +6.7-14.4 %) and on ResNet-50 (+10.1-38.5 %, not
  faster than auto's own; nor when the pass also drops, at each cut of a 2-16-cut program,
  the copies its solution does not hold there: CPU ResNet-50 at a quarter of its activations
  +15.5-20.2 % predicted, the kept set alone +14.3-18.2 %, auto in 30 s +12.8 %, the bound
  +8.3 %). Auto adds both to the schedules it refines by windows, the one
  recomputing once also to those it polishes and anneals (AUTO_BOUND_KEPT_SHARE in
  solvers/registry.py), not to the heuristics that decide whether to search at all. Auto in
  30 s, predicted, before -> after: the bench's GoogLeNet profile at 848ef6b at a third of its
  activations +21.3 -> +16.1 %; the bench's DenseNet-121 profile (1,577 ops) at 40 % of
  eager's peak +10.6 -> +6.5 %, at a third of its activations +9.8 -> +6.6 %; the kept
  problems (`python docs/benchmarks/auto_shares.py`, docs/benchmarks/auto_shares.md): H200
  DenseNet-121 at a half / a third / a quarter +10.6 / +14.8 / +17.5 -> +6.7 / +11.1 /
  +13.9 %, CPU GoogLeNet at a half +6.5 -> +5.4 %, the rest within their spread; with the
  rematerialized start too, CPU GoogLeNet at a half / a third / a quarter +5.35 / +14.65 /
  +25.12 -> +5.09 / +13.33 / +23.10 %, the rest within their spread (sum of the 11 cells
  +151.03 -> +147.92 %).

NOTE [Forward rows]
  The program at the first backward op says nothing of the forward, where a kept copy is alive
  from its making on, beside the copies later forward ops still read. Its kept sets on the
  kept problems go over the budget in the forward by 1-2 % (ResNet-50, DenseNet-121 at a
  quarter), 7 % (BERT-base, H200, at a third: at a GELU) and 18 % (GoogLeNet, CPU, at a
  quarter: at max-pool's compact-indices encoding, its outputs and workspace alive while the
  kept set is nearly all made). A row per forward op says it: at forward op f, fixed memory,
  the copies made before f that a forward op at or after f reads or that are forward outputs,
  f's outputs and workspace, and live_x for every other copy made before f, within the
  budget. But 157-759 such rows made HiGHS up to 9x slower on DenseNet-121 (H200; 0.4 ->
  3.6 s at a third of its activations), whose kept set goes over in the forward at a quarter
  only. So rows are added where the kept set found goes over, and the program solved again
  (at most FORWARD_ROUNDS times; a solution the clock cut short ends the rounds, and each
  round's kept set is rematerialized, the fastest kept: at a third of GoogLeNet's
  activations the second round's was 1.8 points slower than the first's). A schedule that
  keeps through the forward every copy alive at the first backward op satisfies these rows
  (an encode op's reads, which extend copies only where its variant is chosen, are left out:
  tests/test_bound.py); one that makes some of them again before that op need not (solvers
  fuzzing, 2026-12-02: a bound of 20 s where schedules of 15 s fit), so no bound is taken
  from a program with them (NOTE [Cuts where the schedule goes over] in lazy_cuts.py). The
  starts, before -> after (kept problems, 2 s): GoogLeNet at a quarter +23.2 -> +21.1 %,
  BERT-base at a third +12.2 -> +11.5 %, DenseNet-121 at a quarter +14.4 -> +13.7 %, the
  rest the same or within 1 point; auto in 30 s (docs/benchmarks/auto_shares.md): GoogLeNet
  at a quarter +23.10 -> +21.02 %, DenseNet-121 +13.85 -> +13.59 %, the rest within their
  spread (sum of the 11 cells +147.92 -> +145.95 %).
"""
from __future__ import annotations

import dataclasses
import time

from solvers import evict, remat
from solvers.bound import BoundProgram, build_program, cut_positions
from solvers.mip import solve_mip
from solvers.ondemand import schedule_from_kept
from solvers.problem import Problem
from solvers.schedule import SolveResult
from solvers.simulate import simulate

KEPT_START = "bound_kept"  # kept_starts' results' solver names: recomputed on demand,
KEPT_REMAT = "bound_kept_remat"  # or rematerialized
FORWARD_ROUNDS = 4  # the most times the program is solved again with forward rows added


def kept_starts(problem: Problem, budget_bytes: int, time_limit_s: float
                ) -> list[SolveResult]:
    """NOTE [The bound's kept set]: the forward tensors alive at the first backward op, and the
    variants chosen, in the fastest solution HiGHS finds in `time_limit_s` of the program at
    that one moment (again with rows where that kept set goes over in the forward, NOTE
    [Forward rows]); the last recomputed on demand and made to fit by eviction in as long
    again, and each rematerialized under the budget in the backward in as long again: the
    fastest of each way that fits (none where HiGHS found no solution)."""
    deadline = time.perf_counter() + time_limit_s
    prog = build_program(problem, budget_bytes, cut_positions(problem, 1))
    if prog.mip.trivially_infeasible or not prog.live:
        return []
    rows, found = _ForwardRows(prog, budget_bytes), []  # each round's kept set, variants
    for _ in range(FORWARD_ROUNDS + 1):
        left = deadline - time.perf_counter()
        res = solve_mip(prog.mip, "highs", time_limit_s=left, rel_gap=1e-4) if left > 0 \
            else None
        if res is None or res.values is None or (found and res.status != "optimal"):
            break  # a solution cut short by the clock may be far slower than the last
        found.append((frozenset(x for x, v in prog.live[0].items() if res.values[v] > 0.5),
                      frozenset(v for v, var in prog.chosen.items() if res.values[var] > 0.5)))
        over = rows.over(*found[-1])
        if not over:
            break
        for k in over:
            rows.add(k)
    if not found:
        return []
    fitted = evict.fitted(problem, budget_bytes, *found[-1], KEPT_START, time_limit_s)
    end = time.perf_counter() + time_limit_s  # each round's kept set may remake best
    remade = min((remat.from_kept(problem, budget_bytes, kept, chosen, KEPT_REMAT, end)
                  for kept, chosen in found), key=_fastest)
    how = {KEPT_START: "recomputed on demand and evicted from until it fits",
           KEPT_REMAT: "rematerialized under the budget in the backward"}
    return [dataclasses.replace(r, note=f"the boundary bound's kept set at the first backward "
                                f"op, {how[r.solver]} (NOTE [The bound's kept set])")
            for r in (fitted, remade) if r.feasible]


def _fastest(r: SolveResult) -> tuple[bool, float, float]:
    return (not r.feasible, r.objective_s or 0.0, r.peak_bytes or 0)


class _ForwardRows:
    """NOTE [Forward rows]: the rows of a program at forward positions, added on demand."""

    def __init__(self, prog: BoundProgram, budget_bytes: int) -> None:
        self.prog, self.budget = prog, budget_bytes
        p = prog.p
        self.born = {t: k for k, i in enumerate(p.forward_ops) for t in p.ops[i].outputs}
        self.last_read: dict[int, int] = {}
        for k, i in enumerate(p.forward_ops):
            if i not in p.encode_ops:
                for t in p.ops[i].inputs:
                    self.last_read[t] = k
        self.added: set[int] = set()

    def over(self, kept: frozenset[int], chosen: frozenset[int]) -> list[int]:
        """The forward positions where `kept` goes over the budget and no row is yet."""
        p = self.prog.p
        sim = simulate(p, schedule_from_kept(p, kept, chosen))
        return [k for k in range(len(p.forward_ops))
                if sim.live_bytes[k] > self.budget and k not in self.added]

    def add(self, k: int) -> None:
        prog, p = self.prog, self.prog.p
        op = p.forward_ops[k]
        outputs = set(p.forward_outputs)
        forced = {t for t, b in self.born.items()
                  if b < k and (self.last_read.get(t, -1) >= k or t in outputs)}
        own = p.ops[op].extra_bytes + (0 if p.ops[op].overwrites else sum(
            p.tensors[t].bytes for t in p.ops[op].outputs))
        terms = [(v, float(p.tensors[x].bytes)) for x, v in prog.live[0].items()
                 if self.born.get(x, k) < k and x not in forced]
        if op in p.encode_ops:  # it runs where its variant is chosen
            terms.append((prog.chosen[p.encode_ops[op]], float(max(own, 0))))
            own = 0
        room = self.budget - p.fixed_bytes - sum(p.tensors[t].bytes for t in forced) - own
        prog.mip.row(terms, hi=float(room))
        self.added.add(k)
