"""The lower sets of a forward graph, for the DP over them (dp.py): the graph as bitsets,
every lower set (exact) or the ancestor closures (approximate)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from solvers.problem import Problem


class Timeout(Exception):
    """The time limit passed while enumerating or solving."""


@dataclass(frozen=True)
class Sets:
    """The lower sets, ordered by (bytes, size), so a subset always comes before its
    supersets; index 0 is the empty set and the last is the whole forward."""

    masks: tuple[int, ...]
    made_bytes: tuple[int, ...]     # M(L): every byte the ops of L make
    need_time_s: tuple[float, ...]  # time of the ops of L that some backward read needs
    boundary: tuple[tuple[tuple[int, int, float], ...], ...]  # (op, kept bytes, need time)
    exact: bool
    listed: int  # lower sets listed, before thinning


@dataclass(frozen=True)
class Graph:
    n: int
    preds: tuple[int, ...]          # bitset of each forward op's forward predecessors
    succs: tuple[int, ...]
    made_bytes: tuple[int, ...]     # bytes of each op's outputs
    kept_bytes: tuple[int, ...]     # bytes kept if the op is a boundary op
    kept: tuple[tuple[int, ...], ...]
    need_time_s: tuple[float, ...]  # its time if a backward read needs it, else 0


def graph(problem: Problem) -> Graph:
    n = len(problem.forward_ops)  # forward ops are 0..n-1 (they come first)
    preds, succs = [0] * n, [0] * n
    needed = set(problem.saved_for_backward)
    for v in range(n):
        for t in problem.ops[v].inputs:
            u = problem.tensors[t].producer
            preds[v] |= 1 << u
            succs[u] |= 1 << v
    need = [False] * n
    for v in reversed(range(n)):
        need[v] = any(t in needed for t in problem.ops[v].outputs) or any(
            need[u] for u in bits(succs[v]))
    kept = tuple(tuple(t for t in problem.ops[v].outputs
                       if problem.consumers[t] or t in problem.backward_outputs)
                 for v in range(n))
    return Graph(n=n, preds=tuple(preds), succs=tuple(succs),
                  made_bytes=tuple(sum(problem.tensors[t].bytes for t in problem.ops[v].outputs)
                                   for v in range(n)),
                  kept_bytes=tuple(sum(problem.tensors[t].bytes for t in k) for k in kept),
                  kept=kept,
                  need_time_s=tuple(problem.ops[v].rerun_s if need[v] else 0.0 for v in range(n)))


def bits(x: int):
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low


def alllower_sets(g: Graph, limit: int, deadline: float) -> list[int] | None:
    """Every lower set (depth-first, adding one addable op at a time); None past `limit`."""
    seen = {0}
    stack = [(0, sum(1 << v for v in range(g.n) if not g.preds[v]))]
    while stack:
        if time.perf_counter() > deadline:
            raise Timeout
        low, addable = stack.pop()
        for v in bits(addable):
            grown = low | 1 << v
            if grown in seen:
                continue
            seen.add(grown)
            if len(seen) > limit:
                return None
            opened = sum(1 << u for u in bits(g.succs[v]) if g.preds[u] & ~grown == 0)
            stack.append((grown, (addable & ~(1 << v)) | opened))
    return list(seen)


def ancestor_sets(g: Graph) -> list[int]:
    closure = [0] * g.n
    for v in range(g.n):
        closure[v] = 1 << v
        for u in bits(g.preds[v]):
            closure[v] |= closure[u]
    return list({0, (1 << g.n) - 1, *closure})


def lower_sets(g: Graph, exact: bool | None, max_lower_sets: int, max_approx_sets: int,
               deadline: float) -> Sets:
    """Every lower set (exact True, or None with at most max_lower_sets of them), else the
    ancestor sets, thinned to max_approx_sets; sorted by bytes made."""
    masks = None
    if exact is not False:
        limit = 2 ** 62 if exact else max_lower_sets
        masks = alllower_sets(g, limit, deadline)
    listed_all = masks is not None
    if masks is None:
        masks = ancestor_sets(g)
    full = (1 << g.n) - 1
    rows = []
    for k, m in enumerate(masks):
        if k % 64 == 0 and time.perf_counter() > deadline:  # thousands of ops: seconds here
            raise Timeout
        made = sum(g.made_bytes[v] for v in bits(m))
        need = sum(g.need_time_s[v] for v in bits(m))
        outside = full & ~m
        if bin(m).count("1") <= g.n // 2:
            edge = [v for v in bits(m) if g.succs[v] & outside]
        else:
            union = 0
            for u in bits(outside):
                union |= g.preds[u]
            edge = list(bits(union & m))
        if m == full:
            edge = list(range(g.n))  # NOTE [The last block]
        rows.append((made, bin(m).count("1"), m, need,
                     tuple((v, g.kept_bytes[v], g.need_time_s[v]) for v in edge)))
    rows.sort(key=lambda r: (r[0], r[1]))
    listed = len(rows)
    if not listed_all and len(rows) > max_approx_sets:  # evenly spaced; {} and all stay
        step = (len(rows) - 1) / (max_approx_sets - 1)
        rows = [rows[round(k * step)] for k in range(max_approx_sets)]
    return Sets(masks=tuple(r[2] for r in rows), made_bytes=tuple(r[0] for r in rows),
                 need_time_s=tuple(r[3] for r in rows), boundary=tuple(r[4] for r in rows),
                 exact=listed_all, listed=listed)
