"""Checkmate's program (Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization", MLSys 2020), a baseline: rematerialization only, no operator variants.
Solved by solvers/checkmate.py.

Checkmate's program has one stage per node t of the joint graph, in topological order. Stage t
runs node t (R[t][t] = 1) after the earlier nodes it recomputes (R[t][i], i < t), in topological
order; S[t][i] says node i's value is held entering stage t. Rows: a value is held only if it was
held or made in the stage before; a node runs only if its inputs are held or made in the same
stage; memory within a stage is a running sum U that adds each value made and subtracts a value
after its last use in the stage (FREE[t][(i, k)], one binary per stage and edge, linearized with
Checkmate's hazard count); U <= budget. Minimize the time of everything computed.

Our Schedule model is narrower, and the program is restricted to it: the forward runs every
forward op once, in order; the kept forward tensors survive into the backward; the backward
phase runs the backward ops in problem order, interleaved with recomputed forward ops. So:
  * forward stages recompute nothing (R[t][i] = 0 for i < t). S in the forward is then forced
    by the kept set S[0] up to dominated choices (holding a tensor past its last forward read
    only to drop it before the backward), so each forward stage reduces to one memory row over
    the kept set, written as a running sum;
  * backward stages q (one per backward op b_q, in problem order) recompute forward ops only,
    never a backward op; backward tensors are made once and freed after their last read, so
    their bytes are constants per stage;
  * values are tensors (an op may make several): S is per tensor, R per op.
Beyond Checkmate: every memory row holds the fixed memory and the running op's workspace
(Checkmate's has neither). Variables exist only where they can matter: R[q][i] for ancestors
of forward tensors read at stage q or later, S[q][x] for tensors read at stage q or later.
Every memory row is an upper bound on what simulate() counts for the schedule read off a
solution (exact for its least-memory representation), and simulate() checks it anyway.

The program is O(stages x forward ops): DenseNet-121 (1,820 ops) has 2.6M integer variables,
about 16 s of Python to build here, so building stops at a deadline (OutOfTime).
"""
from __future__ import annotations

import gc
import math
import time

from solvers.milp import _backward_constants
from solvers.mip import Mip, within
from solvers.ondemand import schedule_from_kept
from solvers.problem import Problem
from solvers.schedule import Schedule
from solvers.stages import ancestors

ROUNDING_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # Checkmate's sweep


FREEING_SHARE = 0.1


class OutOfTime(Exception):
    """The deadline passed before Checkmate's program was built."""


class CheckmateProgram:
    """Checkmate's program for `problem` at `budget_bytes`, restricted to our Schedule model
    (module docstring); with budget None, the least-peak program (the budget is a variable
    and the objective)."""

    def __init__(self, problem: Problem, budget_bytes: int | None,
                 deadline: float = math.inf) -> None:
        """Raises OutOfTime where `deadline` (time.perf_counter()) passes while building."""
        # Millions of small lists, tuples and dicts, none in a cycle: the cyclic collector's
        # passes over them took 38 % of DenseNet-121's build (27.0 s, 16.7 s without them)
        # and once ran it 1.2 s past its deadline, so it is paused. Freeing the program takes
        # about a tenth of building it (DenseNet-121: 1.4-2.1 s after 15-17 s): a build stops
        # where freeing it would still end by the deadline, and `freeing_s` is what a caller
        # keeps for that after solving.
        start = time.perf_counter()
        self._stop = start + (deadline - start) / (1 + FREEING_SHARE)
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._build(problem, budget_bytes)
        finally:
            if collecting:
                gc.enable()
        self.freeing_s = FREEING_SHARE * (time.perf_counter() - start)

    def _build(self, problem: Problem, budget_bytes: int | None) -> None:
        p = self.problem = problem
        self.mip = mip = Mip()
        self.budget = budget_bytes
        self.min_memory = budget_bytes is None
        self.mem_rows: list[tuple[int, float]] = []  # (row, constant): row <= budget - constant
        self.bare: list[float] = []                   # constants of memory rows without terms
        if self.min_memory:
            self.budget_var = mip.var(0.0, math.inf, cost=1.0, integer=False)
        else:
            mip.offset = p.no_recompute_time_s
        fwd = set(p.forward_tensors)
        self.bwd = p.backward_ops
        # reads[q]: forward tensors backward op q reads; reads[Q]: those the backward returns
        self.reads = [frozenset(x for x in p.ops[b].inputs if x in fwd) for b in self.bwd]
        self.reads.append(frozenset(x for x in p.backward_outputs if x in fwd))
        cand, held = _structure(p, self.reads)
        time_cost = 0.0 if self.min_memory else 1.0
        self._size = sum(map(len, held)) + sum(map(len, cand))
        # S[q][x]: a copy of forward tensor x is held entering stage q (S[0]: the kept set)
        self.S = [self._on_time() or {x: mip.var() for x in h} for h in held]
        # R[q][i]: forward op i is recomputed in stage q, before backward op q
        self.R = [self._on_time() or {i: mip.var(cost=time_cost * p.ops[i].rerun_s) for i in c}
                  for c in cand]
        self.num_free = 0
        self._mem_row([], float(p.fixed_bytes))
        self._forward_rows()
        constants = _backward_constants(p)
        for q in range(len(self.bwd)):
            self._on_time()
            self._correctness_rows(q)
            self._memory_rows(q, *constants[q])
        for x in self.reads[-1]:
            mip.row([(self.S[-1][x], 1.0)], lo=1.0)
        self.structurally_infeasible = mip.trivially_infeasible
        if not self.min_memory:
            self.rebudget(budget_bytes)

    def _on_time(self) -> None:
        if time.perf_counter() > self._stop:
            raise OutOfTime(f"Checkmate's program ({self._size:,} S and R variables, and its "
                            f"FREE variables) was not built within the time limit")

    def rebudget(self, budget_bytes: int) -> None:
        """The same program at another budget: only the memory rows' bounds change."""
        rows = self.mip.rows
        for r, const in self.mem_rows:
            idx, val, lo, _ = rows[r]
            rows[r] = (idx, val, lo, within(budget_bytes) - const)  # NOTE in solvers/mip.py
        self.budget = budget_bytes
        self.mip.trivially_infeasible = self.structurally_infeasible or any(
            const > budget_bytes for const in self.bare)

    @property
    def num_integer_vars(self) -> int:
        return sum(map(len, self.S)) + sum(map(len, self.R)) + self.num_free

    def _mem_row(self, terms: list[tuple[int, float]], const: float) -> None:
        """sum(terms) + const <= budget."""
        if self.min_memory:
            self.mip.row(terms + [(self.budget_var, -1.0)], hi=-const)
            return
        before = len(self.mip.rows)
        self.mip.row(terms, hi=0.0)  # its bound is set by rebudget()
        if len(self.mip.rows) > before:
            self.mem_rows.append((before, const))
        else:
            self.bare.append(const)

    def _have(self, q: int, x: int) -> list[tuple[int, float]]:
        """Terms that are >= 1 exactly when x is readable in stage q: held or recomputed."""
        terms = [(self.S[q][x], 1.0)] if x in self.S[q] else []
        prod = self.problem.tensors[x].producer
        if prod in self.R[q]:
            terms.append((self.R[q][prod], 1.0))
        return terms

    def _forward_rows(self) -> None:
        """Forward step k holds fixed memory, what was made earlier and is read at or after k
        (or returned by the forward), its outputs and workspace, and the kept tensors already
        past their last forward read: P[k], a running sum over S[0]."""
        p, mip, kept = self.problem, self.mip, self.S[0]
        pos = {i: k for k, i in enumerate(p.forward_ops)}
        last = {x: pos[p.tensors[x].producer] for x in p.forward_tensors}
        for i in p.forward_ops:
            for x in p.ops[i].inputs:
                last[x] = max(last[x], pos[i])
        for x in p.forward_outputs:
            last[x] = len(p.forward_ops) - 1
        dies_after: dict[int, list[int]] = {}
        for x, k in last.items():
            dies_after.setdefault(k, []).append(x)
        alive, prev = 0, None
        for k, i in enumerate(p.forward_ops):
            out = sum(p.tensors[x].bytes for x in p.ops[i].outputs)
            P = mip.var(0.0, math.inf, integer=False)
            newly = [(kept[x], -float(p.tensors[x].bytes)) for x in dies_after.get(k - 1, [])
                     if x in kept]
            mip.row([(P, 1.0)] + ([(prev, -1.0)] if prev is not None else []) + newly,
                    lo=0.0, hi=0.0)
            self._mem_row([(P, 1.0)], float(p.fixed_bytes + alive + out
                                            + p.ops[i].extra_bytes))
            prev = P
            alive += out - sum(p.tensors[x].bytes for x in dies_after.get(k, []))

    def _correctness_rows(self, q: int) -> None:
        """Checkmate's S[t+1,i] <= S[t,i] + R[t,i] and R[t,v] <= R[t,u] + S[t,u]; the backward
        op's forward inputs exist."""
        p, mip = self.problem, self.mip
        for x, v in self.S[q + 1].items():
            mip.row([(v, 1.0)] + [(j, -c) for j, c in self._have(q, x)], hi=0.0)
        for i, r in self.R[q].items():
            for x in p.ops[i].inputs:
                mip.row([(r, 1.0)] + [(j, -c) for j, c in self._have(q, x)], hi=0.0)
        for x in self.reads[q]:
            mip.row(self._have(q, x), lo=1.0)

    def _memory_rows(self, q: int, enter_bytes: float, during_bytes: float) -> None:
        """Checkmate's U recurrence over the stage's candidates, then the backward op.
        enter_bytes: fixed memory and backward tensors alive while the stage recomputes;
        during_bytes: the same while backward op q runs, with its outputs and workspace."""
        p, mip, R, S = self.problem, self.mip, self.R[q], self.S[q]
        frees = self._free_vars(q)
        U = None
        freed_before: list[tuple[int, float]] = []
        for k, r in R.items():
            out = float(sum(p.tensors[y].bytes for y in p.ops[k].outputs))
            u = mip.var(0.0, math.inf, integer=False)
            if U is None:  # U[q,k0] = sum of what is held + k0's outputs
                base = [(v, -float(p.tensors[x].bytes)) for x, v in S.items()]
            else:          # U[q,k] = U[q,prev] + k's outputs - what died after prev
                base = [(U, -1.0)] + freed_before
            mip.row([(u, 1.0), (r, -out)] + base, lo=0.0, hi=0.0)
            self._mem_row([(u, 1.0), (r, float(p.ops[k].extra_bytes))], enter_bytes)
            U = u
            freed_before = [(f, float(p.tensors[x].bytes)) for x, f in frees.get(k, [])]
        if U is None:
            self._mem_row([(v, float(p.tensors[x].bytes)) for x, v in S.items()], during_bytes)
        else:
            self._mem_row([(U, 1.0)] + [(f, -c) for f, c in freed_before], during_bytes)

    def _free_vars(self, q: int) -> dict[int, list[tuple[int, int]]]:
        """FREE[q][(x, k)]: x is freed right after candidate k reads it, or makes it where no
        candidate reads it (k ran, no later reader in the stage ran, x is not held into stage
        q+1), with Checkmate's hazard count
        h = (1 - R[k]) + S[q+1,x] + sum of R[j] over later readers j:
        1 - FREE <= h and kappa (1 - FREE) >= h. A tensor backward op q reads stays to its end.
        Returns, per candidate k, the (tensor, FREE variable) pairs freed after it."""
        p, mip, R = self.problem, self.mip, self.R[q]
        frees: dict[int, list[tuple[int, int]]] = {}
        seen = {x for k in R for x in p.ops[k].inputs}
        made = {y for k in R for y in p.ops[k].outputs}
        for x in sorted((seen | made) - self.reads[q]):
            self._on_time()
            # an output no candidate reads goes right after it is made, as the simulator has
            # it (counted to the stage's end, Checkmate was 4 % slower than the MILP at one
            # budget: solvers fuzzing, 2026-12-02)
            readers = [k for k in p.consumers[x] if k in R] or [p.tensors[x].producer]
            for n, k in enumerate(readers):
                hazard = [(R[k], -1.0)] + [(R[j], 1.0) for j in readers[n + 1:]]
                if x in self.S[q + 1]:
                    hazard.append((self.S[q + 1][x], 1.0))
                kappa = float(len(hazard))
                f = mip.var()
                self.num_free += 1
                mip.row([(f, 1.0)] + hazard, lo=0.0)                  # FREE >= 1 - h
                mip.row([(f, kappa)] + hazard, hi=kappa - 1.0)        # kappa (1-FREE) >= h
                frees.setdefault(k, []).append((x, f))
        return frees

    def schedule(self, values: list[float]) -> Schedule:
        kept = frozenset(x for x, v in self.S[0].items() if values[v] > 0.5)
        order: list[int] = []
        for q, b in enumerate(self.bwd):
            order.extend(i for i, v in self.R[q].items() if values[v] > 0.5)
            order.append(b)
        return Schedule(kept=kept, backward=tuple(order))

    def roundings(self, values: list[float], deadline: float = math.inf) -> list[Schedule]:
        """Checkmate's two-phase deterministic rounding, for each threshold tau (the first,
        then others until `deadline`): round the relaxation's S (S >= tau), then take the
        least recomputation that realizes it (Checkmate's solve_r_opt); and, from the rounded
        kept set S[0] alone, the recompute-on-demand schedule."""
        out: list[Schedule] = []
        for tau in ROUNDING_THRESHOLDS:
            if out and time.perf_counter() > deadline:
                break
            held = [{x for x, v in S.items() if values[v] >= tau - 1e-9} for S in self.S]
            for sched in (self._realize(held), schedule_from_kept(self.problem, held[0])):
                if sched not in out:
                    out.append(sched)
        return out

    def _realize(self, held: list[set[int]]) -> Schedule:
        """Stage by stage, recompute what backward op q reads or stage q+1 holds and stage q
        does not hold, with its missing ancestors (solve_r_opt)."""
        p = self.problem
        held[-1] |= self.reads[-1]
        order: list[int] = []
        for q, b in enumerate(self.bwd):
            have, run = held[q], set()
            stack = [x for x in self.reads[q] | held[q + 1] if x not in have]
            while stack:
                i = p.tensors[stack.pop()].producer
                if i not in run:
                    run.add(i)
                    stack.extend(x for x in p.ops[i].inputs if x not in have)
            order.extend(sorted(run))
            order.append(b)
        return Schedule(kept=frozenset(held[0]), backward=tuple(order))


def _structure(p: Problem, reads: list[frozenset[int]]):
    """Per stage q: the forward ops that may run (ancestors of what stage q or a later one
    reads) and the forward tensors that may be held entering it (read at q or later)."""
    anc = ancestors(p)
    ops: set[int] = set()
    later: set[int] = set()
    cand: list[tuple[int, ...]] = []
    held: list[tuple[int, ...]] = []
    for q in reversed(range(len(reads))):
        for x in reads[q]:
            ops |= anc[p.tensors[x].producer]
        later |= reads[q]
        if q < len(reads) - 1:
            cand.append(tuple(sorted(ops)))
            held.append(tuple(sorted(later | {x for i in ops for x in p.ops[i].inputs})))
        else:  # the end of the step runs nothing
            held.append(tuple(sorted(later)))
    return cand[::-1], held[::-1]
