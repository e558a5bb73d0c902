"""Build a Schedule from a set of kept tensors: recompute whatever is missing, just in time.

Every heuristic here (store-all, Chen's segments) chooses only what to keep; this turns that
choice into a runnable backward order. Before each backward op (in problem order), the forward
ops that produce its missing inputs are recomputed, recursively down to kept tensors, in
topological order. A recomputed tensor stays readable for later steps (the simulator frees it
after its last read), so each forward op is recomputed at most once.
"""
from __future__ import annotations

from solvers.problem import NO_PRODUCER, Problem
from solvers.schedule import Schedule


def schedule_from_kept(problem: Problem, kept: frozenset[int] | set[int],
                       variants: frozenset[int] = frozenset()) -> Schedule:
    """The recompute-on-demand schedule for `kept`, with `variants` in use."""
    return schedule_from_cuts(problem, [0], [kept], variants)


def schedule_from_cuts(problem: Problem, cuts: list[int], live: list[frozenset[int] | set[int]],
                       variants: frozenset[int] = frozenset()) -> Schedule:
    """The recompute-on-demand schedule that keeps `live[0]` and, at each later backward
    position `cuts[j]`, holds the forward copies in `live[j]` alone: before it, those not alive
    are recomputed, and the others are let go of (read again later, they are recomputed).
    `cuts[0]` is 0 (NOTE [Cuts where the schedule goes over] in solvers/lazy_cuts.py)."""
    chosen = frozenset(variants)
    problem = problem.with_variants(chosen)
    fwd = frozenset(problem.forward_tensors)
    kept = frozenset(live[0]) & fwd
    available = set(kept) | set(problem.tangents)
    order: list[int] = []

    def ensure(tensors) -> None:
        missing_ops: set[int] = set()
        stack = [problem.tensors[t].producer for t in tensors if t not in available]
        while stack:
            i = stack.pop()
            if i in missing_ops:
                continue
            missing_ops.add(i)
            for t in problem.ops[i].inputs:
                if t not in available and problem.tensors[t].producer not in missing_ops:
                    stack.append(problem.tensors[t].producer)
        for i in sorted(missing_ops):
            order.append(i)
            available.update(problem.ops[i].outputs)

    bwd = problem.backward_ops
    for j, (q, end) in enumerate(zip(cuts, list(cuts[1:]) + [len(bwd)])):
        if j > 0:
            ensure(live[j] & fwd)
            available.difference_update(fwd - live[j])
        for b in bwd[q:end]:
            ensure(problem.ops[b].inputs)
            order.append(b)
            available.update(problem.ops[b].outputs)
    ensure([t for t in problem.backward_outputs if problem.tensors[t].producer != NO_PRODUCER])
    return Schedule(kept=kept, backward=tuple(order), variants=chosen)
