"""The joint MILP: which tensors to keep, what to recompute before which backward op, within the
budget, at the least step time. The math, with the reasoning for every row, is in
docs/formulation.md; names below follow it.

The backward ops run in problem order, cut into stages: a stage starts at a backward op that
reads a forward tensor and runs the ops up to the next such start; its recomputations run
before its first op. (Large graphs merge several such runs into one stage, so the program
stays small; the result's note says so.) Variables:
  S[a][x]  a copy of forward tensor x is held entering stage a (S[0] is the kept set);
  R[a][i]  forward op i is recomputed in stage a (only for ancestors of what stage a reads);
  M[a][j]  forward bytes held while the j-th candidate of stage a runs (a prefix sum);
  P[k]     kept bytes already past their last forward read at forward step k (a prefix sum);
  E[v]     operator variant v is in use (its encode ops run in the forward; its op reads the
           variant's tensors instead of the one it replaces).
Every memory row is an upper bound on what simulate() measures, so an extracted schedule's
simulated peak never exceeds the budget; simulate() checks it anyway.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from solvers.encode_reads import encode_reads, last_forward_read, written_in_forward
from solvers.mip import Mip, solve_mip, within
from solvers.problem import NO_PRODUCER, Problem
from solvers.schedule import Schedule
from solvers.stages import Stages, build_stages


@dataclass(frozen=True)
class MilpOptions:
    """backend: "highs" | "cbc" | "cpsat". time_limit_s: wall time for the whole solve (LP
    rounding, least-peak program and MILP). max_held_vars: stages are merged until the S
    variables fit; max_recompute_vars: then recomputation is limited to a window of nearby
    ancestors until the R variables fit (the result's note says which). rel_gap: stop once the
    proven gap is below this. least_start: a low-peak schedule found before (NOTE [Least peaks
    remembered]); the least-peak program reports it where it is lower than what it finds.
    least_time_limit_s: the least-peak program's time (default a quarter of time_limit_s).
    refine_left: the time left after a schedule the program did not find goes to fine windows
    on it (NOTE [Time left near the floor] in solvers/joint.py); "auto" refines its best itself.
    min_program_s: the least time a program gets, however little is left (NOTE [Short limits];
    None: a tenth of time_limit_s, at most a second)."""

    backend: str = "highs"
    time_limit_s: float = 60.0
    max_recompute_vars: int = 4000
    max_held_vars: int = 6000
    rel_gap: float = 1e-3
    least_start: Schedule | None = None
    least_time_limit_s: float | None = None
    refine_left: bool = True
    min_program_s: float | None = None


class BuildTimeout(Exception):
    """A Program's deadline passed while its rows were being made."""


class Program:
    """The MILP of `stages` at `budget_bytes` (or, with budget None, the least-peak program:
    the budget becomes a variable and the objective; with `fits_only`, no objective: any
    schedule within the budget is optimal)."""

    def __init__(self, stages: Stages, budget_bytes: int | None,
                 deadline: float = math.inf, fits_only: bool = False) -> None:
        """deadline (time.perf_counter()): raises BuildTimeout once it passes while the rows
        are made (a graph of thousands of ops takes seconds: NOTE [Heuristics in their time]
        in solvers/registry.py)."""
        self.st = st = stages
        p = st.problem
        self.mip = mip = Mip()
        self.min_memory = budget_bytes is None
        if self.min_memory:
            self.budget_var = mip.var(0.0, math.inf, cost=1.0, integer=False)
        elif not fits_only:
            mip.offset = p.base_time_s
        self.budget = budget_bytes
        self.S = [{x: mip.var() for x in held} for held in st.held]
        time_cost = 0.0 if self.min_memory or fits_only else 1.0
        self.E = [mip.var(cost=time_cost * p.variant_time_s(v)) for v in range(len(p.variants))]
        self._variant_rows()
        self.R = [{i: mip.var(cost=time_cost * p.ops[i].rerun_s) for i in c} for c in st.cand]
        self.M: list[dict[int, int]] = []
        self.P: dict[int, int] = {}
        self._mem_row([], float(p.fixed_bytes))  # fixed memory alone must fit
        self._forward_rows()
        bw_const = _backward_constants(p)
        for a in range(len(st.groups)):
            if time.perf_counter() > deadline:
                raise BuildTimeout
            self._stage_rows(a, bw_const)
        self._end_rows()
        self._gap_rows(bw_const)

    # ---- helpers ----
    def _size(self, x: int) -> float:
        return float(self.st.problem.tensors[x].bytes)

    def _mem_row(self, terms: list[tuple[int, float]], const: float) -> None:
        if self.min_memory:
            self.mip.row(terms + [(self.budget_var, -1.0)], hi=-const)
        else:
            self.mip.row(terms, hi=within(self.budget) - const)  # NOTE in solvers/mip.py

    def _have(self, a: int, x: int) -> list[tuple[int, float]]:
        """Terms that are >= 1 exactly when x is readable in stage a: held, or recomputed."""
        terms = []
        if x in self.S[a]:
            terms.append((self.S[a][x], 1.0))
        prod = self.st.problem.tensors[x].producer
        if prod in self.R[a]:
            terms.append((self.R[a][prod], 1.0))
        return terms

    # ---- rows ----
    def _variant_rows(self) -> None:
        """One variant per (op, replaced tensor); an encoded tensor is kept only if made."""
        p, mip = self.st.problem, self.mip
        groups: dict[tuple[int, int], list[int]] = {}
        for v, var in enumerate(p.variants):
            groups.setdefault(var.group, []).append(v)
            for i in var.encode_ops:
                for y in p.ops[i].outputs:
                    if y in self.S[0]:
                        mip.row([(self.S[0][y], 1.0), (self.E[v], -1.0)], hi=0.0)
        for vs in groups.values():
            if len(vs) > 1:
                mip.row([(self.E[v], 1.0) for v in vs], hi=1.0)

    def _forward_rows(self) -> None:
        """Forward step k holds what it reads later, its outputs, its workspace, every kept
        tensor already past its last forward read (P[k]) and what chosen encode ops read later
        (NOTE [Read by a later encode op] in solvers/encode_reads.py)."""
        p, mip = self.st.problem, self.mip
        last_read = last_forward_read(p)
        dies_after: dict[int, list[int]] = {}
        for x, k in last_read.items():
            dies_after.setdefault(k, []).append(x)
        waiting = encode_reads(p, mip, self.S[0], self.E, last_read)
        alive = 0  # bytes of tensors made earlier and read at or after this step
        prev = None
        kept = self.S[0]
        written = written_in_forward(p, last_read)
        for k, i in enumerate(p.forward_ops):
            out = sum(p.tensors[x].bytes for x in p.ops[i].outputs)
            own = out + p.ops[i].first_extra_bytes  # NOTE [A first run's workspace]
            const = p.fixed_bytes + alive + (own if i not in p.encode_ops else 0)
            var = mip.var(0.0, math.inf, integer=False)
            terms = [(var, 1.0)]
            over = []  # NOTE [Written into in the forward] in encode_reads.py
            if k in written:
                x = written[k]
                const -= p.tensors[x].bytes
                over = [(kept[x], float(p.tensors[x].bytes))] if x in kept else []
            newly = [(kept[x], -float(p.tensors[x].bytes)) for x in dies_after.get(k - 1, [])
                     if x in kept]
            mip.row(terms + ([(prev, -1.0)] if prev is not None else []) + newly, lo=0.0, hi=0.0)
            self.P[k] = var
            made = [(self.E[p.encode_ops[i]], float(own))] if i in p.encode_ops else []
            self._mem_row([(var, 1.0)] + made + over + waiting.get(k, []), const)
            prev = var
            alive += out
            alive -= sum(p.tensors[x].bytes for x in dies_after.get(k, []))

    # NOTE [One copy held on]
    #   A recomputed y held on into the next stage is counted once. After its last reader in
    #   the stage its new copy's R term goes and S[a+1,y] comes in, as the held-in copy
    #   S[a,y] goes. (For an output no candidate reads, such as max-pool's indices recomputed
    #   with its values, the swap is where it is made: counting S[a+1,y] from the stage's start
    #   over-counted 8 MiB before the recomputation on ResNet-50.)
    #   An extra A[a,y] = R and S[a+1,y] used to keep the new copy as well, so every recomputed
    #   tensor held on was counted twice (36 MiB at one step of ResNet-50 b16): schedules that
    #   simulate within the budget were infeasible in the program, and on diamonds(3) it
    #   proved 46 s "optimal" where Checkmate finds 45 s. Before the last read, S[a,y] and
    #   R[a,p(y)] both 1 would still count two copies; nothing forces S[a,y] then, so an
    #   optimum sets it 0, as start_values does.
    def _stage_rows(self, a: int, bw_const) -> None:
        st, p, mip = self.st, self.st.problem, self.mip
        S, S_next, R = self.S[a], self.S[a + 1], self.R[a]
        D, reads = st.D[a], st.stage_reads[a]
        size = self._size
        for x, v in S_next.items():  # a copy is held on only if it was held or just made
            mip.row([(v, 1.0)] + [(j, -c) for j, c in self._have(a, x)], hi=0.0)
        for i, r in R.items():  # recomputing needs the inputs
            for x in p.ops[i].inputs:
                if p.tensors[x].producer != NO_PRODUCER and x in reads:
                    mip.row([(r, 1.0)] + [(j, -c) for j, c in self._have(a, x)], hi=0.0)
        for q in st.groups[a]:  # the backward ops' forward inputs exist
            self._need_rows(a, q)
        # memory while the candidates run, in order
        last_reader: dict[int, int] = {}
        for i in st.cand[a]:
            for x in p.ops[i].inputs:
                last_reader[x] = i
        for x in S:  # an unread output of a candidate: its copy is swapped where it is made
            if x not in reads and p.tensors[x].producer in R:
                last_reader[x] = p.tensors[x].producer
        start = []
        for x, v in S.items():
            if x in reads or x in last_reader:
                start.append((v, size(x)))
            elif x in S_next:
                start.append((S_next[x], size(x)))
        gpre = bw_const[st.groups[a][0]][0]
        dying: dict[int, list[tuple[int, float]]] = {}  # after candidate i: terms to subtract
        for x in S:
            if x not in D and x in last_reader:
                dying.setdefault(last_reader[x], []).append((S[x], size(x)))
                if x in S_next:
                    dying[last_reader[x]].append((S_next[x], -size(x)))
        for i in st.cand[a]:  # NOTE [One copy held on]
            for y in p.ops[i].outputs:
                if y not in D:
                    dying.setdefault(last_reader.get(y, i), []).append((R[i], size(y)))
        Ma = {}
        prev_var = None
        for i in st.cand[a]:
            m = mip.var(0.0, math.inf, integer=False)
            out = sum(size(y) for y in p.ops[i].outputs)
            terms = [(m, 1.0), (R[i], -out)]
            terms += [(j, -c) for j, c in start] if prev_var is None else [(prev_var, -1.0)]
            mip.row(terms, lo=0.0, hi=0.0)
            self._mem_row([(m, 1.0), (R[i], float(p.ops[i].extra_bytes))], gpre)
            Ma[i] = m
            prev_var = m
            if dying.get(i):
                m2 = mip.var(0.0, math.inf, integer=False)
                mip.row([(m2, 1.0), (m, -1.0)] + [(j, c) for j, c in dying[i]], lo=0.0, hi=0.0)
                prev_var = m2
        self.M.append(Ma)
        self._backward_op_rows(a, bw_const)

    def _need_rows(self, a: int, q: int) -> None:
        """have(x) >= 1 for a plain read; >= 1 - chosen(v) where variants v replace it;
        >= chosen(v) for what variant v reads instead."""
        for x, const, terms in self.st.needs[q]:
            self.mip.row(self._have(a, x) + [(self.E[v], c) for v, c in terms], lo=const)

    def _backward_op_rows(self, a: int, bw_const) -> None:
        """While each backward op of the stage runs: its own memory, the stage's forward inputs
        not yet read for the last time (at most `have` copies of each), and everything held on
        to later stages. Between two ops that read forward tensors the forward part is the
        same: one row for the worst (ops with variant workspace get their own rows, E[v] times
        the extra, of either sign: NOTE [A variant's workspace below its op's] in
        solvers/variant_checks.py)."""
        st, p = self.st, self.st.problem
        S_next = self.S[a + 1]
        size = self._size
        last_read = {x: q for q in st.groups[a] for x in st.reads[q]}
        extra_ws: dict[int, list[tuple[int, float]]] = {}
        for v, var in enumerate(p.variants):
            if var.extra_workspace_bytes:
                extra_ws.setdefault(var.op, []).append(
                    (self.E[v], float(var.extra_workspace_bytes)))
        worst: dict[tuple, float] = {}
        for q in st.groups[a]:
            pending = frozenset(x for x, lq in last_read.items() if lq >= q)
            key = (pending, st.bwd[q] if st.bwd[q] in extra_ws else None)
            worst[key] = max(worst.get(key, 0.0), bw_const[q][1])
        for (pending, op), const in worst.items():
            terms = [(v, size(x)) for x, v in S_next.items() if x not in pending]
            terms += [(j, c * size(x)) for x in pending for j, c in self._have(a, x)]
            self._mem_row(terms + extra_ws.get(op, []), const)

    def _end_rows(self) -> None:
        a = len(self.st.groups)
        for x in self.st.D[a]:
            self.mip.row(self._have(a, x), lo=1.0)

    def _gap_rows(self, bw_const) -> None:
        """Backward ops before the first stage hold what it needs (the kept set)."""
        st, p = self.st, self.st.problem
        first = st.groups[0][0] if st.groups else len(st.bwd)
        if first:
            self._mem_row([(v, float(p.tensors[x].bytes)) for x, v in self.S[0].items()],
                          max(bw_const[q][1] for q in range(first)))

    # ---- to and from schedules ----
    def schedule(self, values: list[float]) -> Schedule:
        st = self.st
        kept = frozenset(x for x, v in self.S[0].items() if values[v] > 0.5)
        chosen = frozenset(v for v, e in enumerate(self.E) if values[e] > 0.5)
        order: list[int] = []
        stage_of = {g[0]: a for a, g in enumerate(st.groups)}
        for q, b in enumerate(st.bwd):
            a = stage_of.get(q)
            if a is not None:
                order.extend(i for i, v in self.R[a].items() if values[v] > 0.5)
            order.append(b)
        return Schedule(kept=kept, backward=tuple(order), variants=chosen)

    def start_values(self, schedule: Schedule) -> list[float] | None:
        """The variable values of a heuristic schedule, or None if it is outside this
        program's space (recomputation where the program allows none)."""
        st, p = self.st, self.st.problem
        bwd_pos = {b: q for q, b in enumerate(st.bwd)}
        stage_of = {q: a for a, g in enumerate(st.groups) for q in g}
        recomputed: list[set[int]] = [set() for _ in st.D]
        q = 0
        for i in schedule.backward:
            if p.ops[i].is_backward:
                q = bwd_pos[i] + 1
                continue
            a = stage_of.get(q)
            if a is None or i not in self.R[a] or i in recomputed[a]:
                return None
            recomputed[a].add(i)
        vals = [0.0] * self.mip.num_vars
        for v in schedule.variants:
            vals[self.E[v]] = 1.0
        # events per tensor: reads and re-makes, stage by stage
        made_in = [{y for i in rs for y in p.ops[i].outputs} for rs in recomputed]
        read_in = []
        for a, rs in enumerate(recomputed):
            r = set(st.D[a])
            for i in rs:
                r.update(x for x in p.ops[i].inputs if x in st.last_need)
            read_in.append(r)
        avail = set(schedule.kept)
        for a in range(len(st.D)):
            for x, v in self.S[a].items():
                if x in avail and x not in made_in[a]:
                    vals[v] = 1.0 if self._read_before_remake(x, a, read_in, made_in) else 0.0
            avail |= made_in[a]
            for i in recomputed[a]:
                vals[self.R[a][i]] = 1.0
        self._fill_continuous(vals)
        return vals

    @staticmethod
    def _read_before_remake(x, a, read_in, made_in) -> bool:
        for b in range(a, len(read_in)):
            if b > a and x in made_in[b]:
                return False
            if x in read_in[b]:
                return True
        return False

    def _fill_continuous(self, vals: list[float]) -> None:
        """Continuous variables are defined by equality rows: solve them in order."""
        mip = self.mip
        for r_idx, r_val, lo, hi in mip.rows:
            if lo != hi or not r_idx or mip.integer[r_idx[0]] or r_val[0] != 1.0:
                continue
            j = r_idx[0]
            vals[j] = lo - sum(c * vals[k] for k, c in zip(r_idx[1:], r_val[1:]))
        if self.min_memory:
            vals[self.budget_var] = 0.0
            need = 0.0
            for r_idx, r_val, lo, hi in mip.rows:
                if self.budget_var in r_idx:
                    need = max(need, sum(c * vals[k] for k, c in zip(r_idx, r_val)) - hi)
            vals[self.budget_var] = need


def _backward_constants(p: Problem) -> list[tuple[float, float]]:
    """Per backward op q: (fixed + backward tensors held while the recomputations before it
    run, fixed + backward tensors held while it runs + its workspace). Output gradients
    (tangents) exist from the first backward-phase step."""
    bwd = p.backward_ops
    pos = {b: q for q, b in enumerate(bwd)}
    born: dict[int, int] = {t: -1 for t in p.tangents}
    last: dict[int, int] = {t: 0 for t in p.tangents}
    for b in bwd:
        for y in p.ops[b].outputs:
            born[y] = last[y] = pos[b]
    for b in bwd:
        for x in p.ops[b].inputs:
            if x in born:
                last[x] = max(last[x], pos[b])
    for x in p.backward_outputs:
        if x in born:
            last[x] = len(bwd) - 1
    enter = [0] * len(bwd)
    during = [0] * len(bwd)
    for t, b0 in born.items():
        for q in range(max(b0, 0), min(last[t], len(bwd) - 1) + 1):
            during[q] += p.tensors[t].bytes
            if q > b0:
                enter[q] += p.tensors[t].bytes
    return [(float(p.fixed_bytes + enter[q]),
             float(p.fixed_bytes + during[q] + p.ops[b].extra_bytes))
            for q, b in enumerate(bwd)]


def solve_program(program: Program, options: MilpOptions, start: Schedule | None):
    """Run the backend from `start` (if the program can express it); returns the MipResult
    and its schedule (None if the backend found none)."""
    values = program.start_values(start) if start is not None else None
    res = solve_mip(program.mip, options.backend, options.time_limit_s, values, options.rel_gap)
    return res, (program.schedule(res.values) if res.values is not None else None)


__all__ = ["MilpOptions", "Program", "Stages", "build_stages", "solve_program"]
