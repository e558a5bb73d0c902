"""A lower bound on the step time of every schedule within a budget: what the memory at the start
of the backward forces to be recomputed.

NOTE [The boundary bound]
  Look at any schedule at the first step of its backward phase. The forward copies alive then
  are the kept ones that the backward still reads (NOTE [Lifetimes] in simulate.py); with the
  fixed memory and the output gradients they must fit in the budget. Call a forward tensor u
  `live` if its forward copy is alive then, and a forward op o `rerun` if it runs in the
  backward phase. Then, for the schedule's own choice of variants:
    - a backward op reads each forward tensor t it needs: live_t or rerun_{producer(t)}, unless
      a variant v of that (op, t) is chosen (y_v), which needs its own reads the same way;
    - a rerun op reads its forward inputs: live_u or rerun_{producer(u)};
    - fixed + tangents + sum of live bytes <= budget;
  and its time is at least base time + sum of rerun op times + the chosen variants' time. So the
  least value of that 0/1 program, or any lower bound of it (HiGHS's dual bound when it stops
  at the time limit), is a lower bound on every schedule's time within the budget; and if the
  program is infeasible, so is the budget. It ignores everything after that first step (the
  recomputations' own memory), which is where the bound is loose.
  Variables: one per forward tensor the backward or a rerun may read, one per forward op, one
  per variant; rows: one per (reader, forward input) pair and one for memory.
"""
from __future__ import annotations

import math

from solvers.mip import Mip, solve_mip
from solvers.problem import Problem


def boundary_bound(problem: Problem, budget_bytes: int, time_limit_s: float = 5.0) -> float | None:
    """NOTE [The boundary bound]: a lower bound on the step time (seconds) of every schedule
    whose peak is within `budget_bytes`; math.inf if no schedule fits; None if HiGHS proved
    nothing within `time_limit_s`."""
    mip = _program(problem, budget_bytes)
    res = solve_mip(mip, "highs", time_limit_s=time_limit_s, rel_gap=1e-4)
    if res.status == "infeasible":
        return math.inf
    return res.bound


def _program(p: Problem, budget_bytes: int) -> Mip:
    mip = Mip(offset=p.base_time_s)
    fwd_tensors = set(p.forward_tensors)
    live: dict[int, int] = {}
    rerun: dict[int, int] = {}
    pending: list[int] = []  # rerun ops whose input rows are not written yet

    def have(t: int) -> list[tuple[int, float]]:
        """Terms that are >= 1 exactly when forward tensor t is readable in the backward."""
        if t not in live:
            live[t] = mip.var()
        terms = [(live[t], 1.0)]
        op = p.tensors[t].producer
        if op not in rerun:
            rerun[op] = mip.var(cost=p.ops[op].time_s)
            pending.append(op)
        return terms + [(rerun[op], 1.0)]

    groups: dict[tuple[int, int], list[int]] = {}
    for v, var in enumerate(p.variants):
        groups.setdefault(var.group, []).append(v)
    chosen = {v: mip.var(cost=p.variant_time_s(v)) for v in range(len(p.variants))}
    for b in p.backward_ops:
        for t in set(p.ops[b].inputs) & fwd_tensors:
            alts = groups.get((b, t), [])
            mip.row(have(t) + [(chosen[v], 1.0) for v in alts], lo=1.0)
            for v in alts:
                for r in set(p.variants[v].reads) & fwd_tensors:
                    mip.row(have(r) + [(chosen[v], -1.0)], lo=0.0)
    for ids in groups.values():
        mip.row([(chosen[k], 1.0) for k in ids], hi=1.0)
    for t in set(p.backward_outputs) & fwd_tensors:
        mip.row(have(t), lo=1.0)
    while pending:
        o = pending.pop()
        for u in set(p.ops[o].inputs) & fwd_tensors:
            mip.row(have(u) + [(rerun[o], -1.0)], lo=0.0)
    # An encode op runs (and costs) only for its chosen variant: its rerun costs it again.
    for o, v in p.encode_ops.items():
        if o in rerun:
            mip.row([(rerun[o], 1.0), (chosen[v], -1.0)], hi=0.0)
    tangents = sum(p.tensors[t].bytes for t in p.tangents)
    room = budget_bytes - p.fixed_bytes - tangents
    mip.row([(x, float(p.tensors[t].bytes)) for t, x in live.items()], hi=float(room))
    if room < 0:
        mip.trivially_infeasible = True
    return mip
