"""A lower bound on the step time of every schedule within a budget: what the memory at a few
moments of the backward forces to be recomputed.

NOTE [The boundary bound]
  Look at any schedule while its first backward op runs. The forward copies alive then are
  the kept ones that the backward still reads (NOTE [Lifetimes] in simulate.py); with the fixed
  memory, the output gradients and that op's own outputs and workspace they must fit in the
  budget. Call a forward tensor u `live` if a copy of it is alive then, and a forward op o
  `rerun` if it runs in the backward phase. Then, for the schedule's own choice of variants:
    - a backward op reads each forward tensor t it needs: live_t or rerun_{producer(t)}, unless
      a variant v of that (op, t) is chosen (y_v), which needs its own reads the same way;
    - a rerun op reads its forward inputs: live_u or rerun_{producer(u)};
    - fixed + tangents + the op's outputs and workspace + sum of live bytes <= budget, its
      workspace with what each chosen variant v of it adds or takes off (y_v times its extra,
      of either sign: NOTE [A variant's workspace below its op's] in variant_checks.py);
  and its time is at least base time + sum of rerun op times + the chosen variants' time. So the
  least value of that 0/1 program, or any lower bound of it (HiGHS's dual bound when it stops
  at the time limit), is a lower bound on every schedule's time within the budget; and if the
  program is infeasible, so is the budget.

NOTE [Cuts through the backward]
  One moment sees none of the pressure later in the backward, where the gradients made so far
  are alive too. So the program looks at several: backward positions q_0 = 0 < q_1 < ... cut
  the backward into segments, segment j running from q_j up to q_{j+1}. Per segment j:
  live^j_x (a copy of x is alive while the op at q_j runs) and rerun^j_o (forward op o runs in
  the segment, its time counted once per segment). The rows above hold per segment, except
  that the op at q_j reads only live^j copies (nothing of the segment has run before it).
  Segments are chained: a copy alive at q_j was made before q_{j-1} (and so was alive at
  q_{j-1}, a copy living from its making to its last read) or in segment j-1:
  live^j_x <= live^{j-1}_x + rerun^{j-1}_{producer(x)}. The memory row at q_j counts, besides
  live^j, the backward tensors made before q_j that are read at or after it or are gradients
  of the step (alive then, whatever the schedule), and q_j's outputs and workspace. Every
  schedule gives a solution of this program with its own time or less, so its least value
  bounds every schedule. More cuts only add rows: the bound never drops.
"""
from __future__ import annotations

import math
import time

from solvers.mip import Mip, beyond, solve_mip
from solvers.problem import Problem
from solvers.stages import reading_positions

# The most moments of the backward the bound looks at (NOTE [Cuts through the backward]).
MAX_BOUND_CUTS = 64
# The bounds proved lately, by (problem, budget): the joint MILP proves one, and "auto", which
# runs it, reports it beside its own (solvers/registry.py). A few: a problem may be large.
_PROVED: dict[tuple[Problem, int], float] = {}
_PROVED_KEPT = 32


def boundary_bound(problem: Problem, budget_bytes: int, time_limit_s: float = 5.0,
                   cuts: int | None = None) -> float | None:
    """NOTE [The boundary bound], at `cuts` moments of the backward (NOTE [Cuts through the
    backward]): a lower bound on the step time (seconds) of every schedule whose peak is
    within `budget_bytes`; math.inf if no schedule fits; None if HiGHS proved nothing within
    `time_limit_s`. With `cuts` None: 1, 2, 4, ... cuts (each set holding the last) while
    time is left and HiGHS finishes, and the highest bound of them."""
    deadline = time.monotonic() + time_limit_s
    best, last = None, None
    key, problem = problem, problem.stateless()  # a bound for every schedule: NOTE [Bounds
    #                                              without the states] in solvers/counted.py
    for k in ([cuts] if cuts is not None else _doubling()):
        left = deadline - time.monotonic()
        positions = cut_positions(problem, k)
        if left <= 0 or positions == last:
            break
        res = solve_mip(build_program(problem, budget_bytes, positions).mip, "highs",
                        time_limit_s=left, rel_gap=1e-4)
        if res.status == "infeasible":
            return math.inf
        if res.bound is not None:
            best = res.bound if best is None else max(best, res.bound)
        if res.status != "optimal":
            break
        last = positions
    if best is not None:
        before = _PROVED.pop((key, budget_bytes), best)  # then made the newest
        _PROVED[key, budget_bytes] = max(best, before)
        while len(_PROVED) > _PROVED_KEPT:
            del _PROVED[next(iter(_PROVED))]
    return best


def proved_bound(problem: Problem, budget_bytes: int) -> float | None:
    """The highest boundary bound proved lately for `problem` at `budget_bytes` (None if
    none)."""
    return _PROVED.get((problem, budget_bytes))


def _doubling():
    k = 1
    while k <= MAX_BOUND_CUTS:
        yield k
        k *= 2


def cut_positions(p: Problem, cuts: int) -> list[int]:
    """Position 0 and up to cuts-1 more among the backward positions that read forward
    tensors, evenly spread."""
    reading = reading_positions(p)
    if not p.backward_ops:
        return []
    if not reading:
        return [0]
    return sorted({0} | {reading[k * len(reading) // cuts] for k in range(1, max(1, cuts))})


class BoundProgram:
    """The program's variables, made as rows first need them (NOTE [Cuts through the
    backward])."""

    def __init__(self, p: Problem, cuts: list[int]) -> None:
        self.p = p
        self.mip = Mip(offset=p.base_time_s)
        self.fwd = set(p.forward_tensors)
        self.live: list[dict[int, int]] = [{} for _ in cuts]
        self.rerun: list[dict[int, int]] = [{} for _ in cuts]
        self.pending: list[tuple[int, int]] = []  # (segment, op) whose input rows are unwritten
        self.chosen = {v: self.mip.var(cost=p.variant_time_s(v)) for v in range(len(p.variants))}
        self.groups: dict[tuple[int, int], list[int]] = {}
        for v, var in enumerate(p.variants):
            self.groups.setdefault(var.group, []).append(v)

    def live_var(self, j: int, x: int) -> int:
        """live^j_x, chained to segment j-1 (NOTE [Cuts through the backward])."""
        if x not in self.live[j]:
            self.live[j][x] = self.mip.var()
            if j > 0:
                self.mip.row([(self.live_var(j - 1, x), 1.0), (self.rerun_var(j - 1, x), 1.0),
                              (self.live[j][x], -1.0)], lo=0.0)
        return self.live[j][x]

    def rerun_var(self, j: int, x: int) -> int:
        """rerun^j of x's producer."""
        op = self.p.tensors[x].producer
        if op not in self.rerun[j]:
            self.rerun[j][op] = self.mip.var(cost=self.p.ops[op].rerun_s)
            self.pending.append((j, op))
        return self.rerun[j][op]

    def have(self, j: int, x: int, at_cut: bool) -> list[tuple[int, float]]:
        """Terms that are >= 1 exactly when forward tensor x is readable in segment j (at its
        first op, only a live copy is)."""
        terms = [(self.live_var(j, x), 1.0)]
        return terms if at_cut else terms + [(self.rerun_var(j, x), 1.0)]

    def reads(self, j: int, b: int, at_cut: bool) -> None:
        p, mip = self.p, self.mip
        for t in set(p.ops[b].inputs) & self.fwd:
            alts = self.groups.get((b, t), [])
            mip.row(self.have(j, t, at_cut) + [(self.chosen[v], 1.0) for v in alts], lo=1.0)
            for v in alts:
                for r in set(p.variants[v].reads) & self.fwd:
                    mip.row(self.have(j, r, at_cut) + [(self.chosen[v], -1.0)], lo=0.0)

    def close(self) -> None:
        """Input rows of every rerun op, and encode ops rerun only for their chosen variant."""
        p, mip = self.p, self.mip
        while self.pending:
            j, o = self.pending.pop()
            for u in set(p.ops[o].inputs) & self.fwd:
                mip.row(self.have(j, u, False) + [(self.rerun[j][o], -1.0)], lo=0.0)
            if o in p.encode_ops:
                mip.row([(self.rerun[j][o], 1.0), (self.chosen[p.encode_ops[o]], -1.0)], hi=0.0)


def build_program(p: Problem, budget_bytes: int, cuts: list[int]) -> BoundProgram:
    """The program of NOTE [Cuts through the backward] at backward positions `cuts`."""
    prog = BoundProgram(p, cuts)
    mip = prog.mip
    bwd = p.backward_ops
    for ids in prog.groups.values():
        mip.row([(prog.chosen[k], 1.0) for k in ids], hi=1.0)
    ends = cuts[1:] + [len(bwd)]
    for j, (q, end) in enumerate(zip(cuts, ends)):
        for pos in range(q, end):
            prog.reads(j, bwd[pos], at_cut=pos == q)
    if cuts:
        for t in set(p.backward_outputs) & prog.fwd:
            mip.row(prog.have(len(cuts) - 1, t, False), lo=1.0)
    prog.close()
    for j, q in enumerate(cuts):
        cut_row(prog, j, q, budget_bytes)
        b = bwd[q]  # at the least workspace its variants leave it
        if budget_bytes < _resident_at(p, q) - p.ops[b].workspace_bytes + p.least_workspaces[b]:
            mip.trivially_infeasible = True
    if not cuts and budget_bytes < p.fixed_bytes:
        mip.trivially_infeasible = True
    return prog


def cut_row(prog: BoundProgram, j: int, q: int, budget_bytes: int, taken: int = 0) -> None:
    """The memory row of cut j, at backward position q, with `taken` bytes less room: its live
    copies, and what the op's chosen variants add to its workspace or take off (either sign:
    NOTE [A variant's workspace below its op's] in solvers/variant_checks.py), within the
    budget less what is resident whatever the schedule, the op at its own workspace."""
    p, b = prog.p, prog.p.backward_ops[q]
    terms = [(x, float(p.tensors[t].bytes)) for t, x in prog.live[j].items()]
    terms += [(prog.chosen[v], float(var.extra_workspace_bytes))
              for v, var in enumerate(p.variants) if var.op == b and var.extra_workspace_bytes]
    # NOTE [Rows that must hold to the byte] in solvers/mip.py: a bound, so the budget widened
    prog.mip.row(terms, hi=float(beyond(budget_bytes) - _resident_at(p, q) - taken))


def _resident_at(p: Problem, q: int) -> int:
    """Bytes resident while backward position q runs, whatever the schedule: fixed memory, the
    backward tensors (tangents included) made before it that are read at or after it or are
    gradients of the step, and its own outputs and workspace (not its output where it may
    take over a dying input's storage: NOTE [Writing into a dying input]); its workspace its
    own, what its chosen variants change left to `cut_row`."""
    bwd = p.backward_ops
    b = bwd[q]
    replaceable = {var.group for var in p.variants}
    made_before = set(p.tangents) | {t for i in bwd[:q] for t in p.ops[i].outputs}
    needed = {t for i in bwd[q:] for t in p.ops[i].inputs if (i, t) not in replaceable}
    needed |= set(p.backward_outputs)
    alive = (made_before & needed) | (set() if p.ops[b].overwrites else set(p.ops[b].outputs))
    return p.fixed_bytes + p.ops[b].extra_bytes + sum(p.tensors[t].bytes for t in alive)
