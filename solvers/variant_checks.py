"""The checks a Problem's variants must pass (solvers/problem.py's validation)."""
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
