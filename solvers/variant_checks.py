"""The checks a Problem's variants must pass (solvers/problem.py's validation), and the least
workspace an op runs with over its variants."""
from __future__ import annotations

from typing import Any, Callable


def check_variants(p: Any, fail: Callable[[str], None]) -> None:
    """fail(message) where one of Problem `p`'s variants names ops or tensors it cannot: a
    forward op for its op, an input its op does not read, a backward op for an encode op or
    one another variant owns, a read that is not a forward tensor; or where an op reads what
    only another variant's encode ops make, or a step output is such a tensor."""
    fwd = set(p.forward_tensors)
    owner: dict[int, int] = {}
    for v, var in enumerate(p.variants):
        what = f"variant {var.name!r} (#{v})"
        if not 0 <= var.op < len(p.ops) or not p.ops[var.op].is_backward:
            fail(f"{what} names op {var.op}, which is not a backward op")
        if var.replaces not in p.ops[var.op].inputs:
            fail(f"{what} replaces tensor {var.replaces}, which its op does not read")
        for i in var.encode_ops:
            if not 0 <= i < len(p.ops) or p.ops[i].is_backward:
                fail(f"{what}: encode op {i} is not a forward op")
            if i in owner:
                fail(f"{what}: encode op {p.ops[i].name!r} already belongs to variant {owner[i]}")
            owner[i] = v
        for t in var.reads:
            if t not in fwd:
                fail(f"{what} reads {t}, which is not a forward tensor")
    encoded = {t for i in owner for t in p.ops[i].outputs}
    for i, op in enumerate(p.ops):
        bad = [t for t in op.inputs if t in encoded and owner.get(i) != owner.get(
            p.tensors[t].producer)]
        if bad:
            fail(f"op {op.name!r} reads {p.tensors[bad[0]].name!r}, which only a variant makes")
    if encoded & (set(p.forward_outputs) | set(p.backward_outputs)):
        fail("a variant's encoded tensor is also a step output")


# NOTE [A variant's workspace below its op's]
#   A variant's `extra_workspace_bytes` may be negative: its run needs less scratch than its op
#   (on the CPU, a convolution's backward with oneDNN off, conv.other_backend, measured 147,456 B
#   where the op's took 9,437,184 B, a weight gradient's worth: resnet18_small, 64x64). Variants
#   of different tensors of one op combine, their extras summed (Problem.with_variants), so the
#   most each group of an op's variants takes off, summed, must leave it a workspace of at least
#   0 (solvers/sane_numbers.py refuses a problem where it does not). The simulator counts the
#   op at its own workspace plus what its chosen variants add or take off; the joint MILP's
#   memory rows carry that as E[v] times the extra, of either sign (solvers/milp.py), and the
#   boundary bound's cut rows as chosen(v) times it (solvers/bound.py); the variant-blind
#   solvers see the plain problem of the variants they are given. What holds whatever the
#   variants (the least peak from sizes, solvers/peak_bound.py) takes the least workspace the
#   op runs with, `least_workspaces`.
def least_workspaces(p: Any) -> tuple[int, ...]:
    """Per op of Problem `p`, the least workspace it runs with over every choice of its
    variants: its own, less the most each group of its variants takes off (NOTE [A variant's
    workspace below its op's]). A variant naming no op of `p` is passed over."""
    off: dict[tuple[int, int], int] = {}
    for var in p.variants:
        if 0 <= var.op < len(p.ops):
            off[var.group] = min(off.get(var.group, 0), var.extra_workspace_bytes)
    least = [op.workspace_bytes for op in p.ops]
    for (i, _), taken in off.items():
        least[i] += taken
    return tuple(least)
