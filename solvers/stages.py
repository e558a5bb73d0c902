"""The budget-independent structure of the joint MILP: stages, candidates, held sets, and the
coarsening that keeps the program small (docs/formulation.md)."""
from __future__ import annotations

import functools
from typing import Sequence

from solvers.problem import Problem


class Stages:
    """The budget-independent structure of the program for one problem."""

    def __init__(self, problem: Problem, window: int | None = None,
                 max_stages: int | None = None, starts: Sequence[int] | None = None,
                 only: dict[int, frozenset[int]] | None = None) -> None:
        """window: recomputation limited to ancestors within that many forward ops;
        max_stages: positions merged into about that many stages; starts: the stages' first
        backward positions, given (then max_stages is ignored); only: per stage index, the
        forward ops it may recompute, in place of its candidates."""
        p = problem
        self.problem = p
        fwd = set(p.forward_tensors)
        self.fwd_pos = {i: k for k, i in enumerate(p.forward_ops)}
        self.bwd = p.backward_ops
        self.needs = _needs(p, fwd)
        self.reads = [tuple(dict.fromkeys(x for x, _, _ in n)) for n in self.needs]
        self.groups = _group(self.reads, max_stages) if starts is None else \
            _from_starts(starts, len(self.reads))
        self.end_reads = tuple(x for x in p.backward_outputs if x in fwd)
        anc = ancestors(p)
        self.window = window
        self.max_stages = max_stages
        # stages 0..len(groups)-1 run backward ops; stage len(groups) is the end of the step.
        self.cand: list[tuple[int, ...]] = []
        reads = [frozenset(x for q in g for x in self.reads[q]) for g in self.groups]
        tiny = _tiny(p, fwd)
        for a, r in enumerate(reads):
            if only is not None and a in only:
                self.cand.append(tuple(sorted(only[a])))
                continue
            ops: set[int] = set()
            for x in r - tiny:
                src = p.tensors[x].producer
                ops |= {i for i in anc[src] if (window is None or src - i <= window)
                        and i not in p.encode_ops}
            self.cand.append(tuple(sorted(ops)))
        self.cand.append(())
        self.D = reads + [frozenset(self.end_reads)]
        self.stage_reads = []
        for a, d in enumerate(self.D):
            r = set(d)
            for i in self.cand[a]:
                r.update(x for x in p.ops[i].inputs if x in fwd)
            self.stage_reads.append(frozenset(r))
        last_need: dict[int, int] = {}
        for a, r in enumerate(self.stage_reads):
            for x in r:
                last_need[x] = a
        self.last_need = last_need
        self.held = [tuple(sorted(x for x, la in last_need.items() if a <= la))
                     for a in range(len(self.D))]

    @property
    def num_recompute_vars(self) -> int:
        return sum(len(c) for c in self.cand)

    @property
    def num_held_vars(self) -> int:
        return sum(len(h) for h in self.held)


Need = tuple[int, float, tuple[tuple[int, float], ...]]

# NOTE [Tiny reads are held]: a forward tensor of at most 1/TINY of the forward's bytes is
# not recomputed for a stage that reads it; the stage reads it held. Recomputing it could save
# no more than its bytes, and offering it made every one of its ancestors a candidate there,
# held to that stage from the forward on: ResNet-50's fully connected layer's weight gradient,
# made at the end of the backward (NOTE [Results made late] in monet_opt/late_grads.py),
# reads the pooled features (128 KiB of 380 MiB); offered for recomputation there, the
# program's held sets grew past their limit, its stages were merged from 27 to 15 and its
# least peak rose from 293.9 to 315.1 MiB.
TINY = 1024


def _tiny(p: Problem, fwd: set[int]) -> frozenset[int]:
    total = sum(p.tensors[x].bytes for x in fwd)
    return frozenset(x for x in fwd if p.tensors[x].bytes * TINY <= total)


def _needs(p: Problem, fwd: set[int]) -> list[tuple[Need, ...]]:
    """Per backward position: (x, c, terms) meaning "x must be readable when
    1*have(x) + sum(coef * chosen[v]) >= c" — 1 with no terms for a plain read; 1 and +1 for
    each variant that replaces the read; 0 and -1 for a variant's own read."""
    by_op: dict[int, list[int]] = {}
    for v, var in enumerate(p.variants):
        by_op.setdefault(var.op, []).append(v)
    out = []
    for b in p.backward_ops:
        needs: list[Need] = []
        mine = by_op.get(b, [])
        for x in dict.fromkeys(p.ops[b].inputs):
            if x in fwd:
                vs = [v for v in mine if p.variants[v].replaces == x]
                needs.append((x, 1.0, tuple((v, 1.0) for v in vs)))
        for v in mine:
            needs.extend((x, 0.0, ((v, -1.0),)) for x in p.variants[v].reads)
        out.append(tuple(needs))
    return out


def _group(reads: list[tuple[int, ...]], max_stages: int | None) -> list[tuple[int, ...]]:
    """Cut backward positions into stages, each starting at a position that reads forward
    tensors. With max_stages, merge runs so each stage has about an equal share of reads."""
    starts = [q for q, d in enumerate(reads) if d]
    if max_stages is not None and len(starts) > max_stages:
        total = sum(len(d) for d in reads)
        share, acc, kept = total / max_stages, 0.0, []
        for q in starts:
            if not kept or acc >= share:
                kept.append(q)
                acc = 0.0
            acc += len(reads[q])
        starts = kept
    bounds = starts + [len(reads)]
    return [tuple(range(bounds[k], bounds[k + 1])) for k in range(len(starts))]


def reading_positions(p: Problem) -> list[int]:
    """The backward positions whose op reads a forward tensor."""
    fwd = set(p.forward_tensors)
    return [q for q, b in enumerate(p.backward_ops) if fwd & set(p.ops[b].inputs)]


def _from_starts(starts: Sequence[int], n: int) -> list[tuple[int, ...]]:
    if not starts:
        return []
    bounds = sorted(set(starts)) + [n]
    if bounds[0] < 0 or bounds[-2] >= n:
        raise ValueError(f"stage starts must lie in [0, {n}), got {sorted(set(starts))}")
    return [tuple(range(bounds[k], bounds[k + 1])) for k in range(len(bounds) - 1)]


@functools.lru_cache(maxsize=8)
def build_stages(problem: Problem, max_recompute_vars: int, max_held_vars: int) -> Stages:
    """The finest stages and widest recomputation window that fit the variable limits. Built
    once per (problem, limits) and only read after: auto asks whether the MILP is coarsened
    before the MILP builds its program from the same stages (DenseNet-121: 0.5 s each)."""
    stages = None
    for max_stages in (None, 96, 64, 48, 32, 24, 16, 12, 8):
        stages = Stages(problem, None, max_stages)
        if stages.num_held_vars <= max_held_vars:
            break
    max_stages = stages.max_stages
    if stages.num_recompute_vars <= max_recompute_vars:
        return stages
    lo, hi = 0, len(problem.forward_ops)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if Stages(problem, mid, max_stages).num_recompute_vars <= max_recompute_vars:
            lo = mid
        else:
            hi = mid - 1
    return Stages(problem, lo, max_stages)


def ancestors(p: Problem) -> dict[int, frozenset[int]]:
    """Each forward op's ancestors among the forward ops, itself included."""
    anc: dict[int, frozenset[int]] = {}
    for i in p.forward_ops:
        a = {i}
        for x in p.ops[i].inputs:
            a |= anc[p.tensors[x].producer]
        anc[i] = frozenset(a)
    return anc
