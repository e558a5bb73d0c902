"""A Problem's checks: what its constructor refuses (solvers/problem.py)."""
from __future__ import annotations

from solvers.errors import InvalidProblemError
from solvers.sane_numbers import check_numbers
from solvers.variant_checks import check_variants

NO_PRODUCER = -1  # a tensor that exists from the start of the backward (an output gradient)


def validate(p) -> None:
    """Raise InvalidProblemError naming what is wrong with Problem `p`."""
    def fail(msg: str) -> None:
        raise InvalidProblemError(f"Problem {p.name!r}: {msg}")

    check_numbers(p, fail)  # NOTE [Numbers a problem may hold]
    seen_backward = False
    for i, op in enumerate(p.ops):
        seen_backward |= op.is_backward
        if seen_backward and not op.is_backward:
            fail(f"forward op {op.name!r} (#{i}) comes after a backward op")
        if op.state_bytes and (op.is_backward or not op.is_random):
            fail(f"op {op.name!r} keeps a generator state but is not a random forward op")
        if len(set(op.outputs)) != len(op.outputs):
            fail(f"op {op.name!r} lists an output twice ({list(op.outputs)})")
        for t in op.outputs:
            if not 0 <= t < len(p.tensors) or p.tensors[t].producer != i:
                fail(f"op {op.name!r} lists output {t} whose producer is not #{i}")
        for t in op.inputs:
            if not 0 <= t < len(p.tensors):
                fail(f"op {op.name!r} reads unknown tensor {t}")
            prod = p.tensors[t].producer
            if prod >= i:
                fail(f"op {op.name!r} (#{i}) reads {p.tensors[t].name!r} made later (#{prod})")
            if not op.is_backward and (prod == NO_PRODUCER or p.ops[prod].is_backward):
                fail(f"forward op {op.name!r} reads backward tensor {p.tensors[t].name!r}")
        for t in op.overwrites:
            if op.inplace_bytes or t not in op.inputs or len(op.outputs) != 1 or \
                    p.tensors[t].bytes != p.tensors[op.outputs[0]].bytes or \
                    not 0 <= p.tensors[t].producer < i or p.ops[p.tensors[t].producer].is_backward:
                fail(f"op {op.name!r} may overwrite tensor {t}, but it is not an op with one "
                     "output reading a forward tensor of that output's size, or it writes in "
                     "place already (NOTE [Writing into a dying input])")
    for t, ten in enumerate(p.tensors):
        if ten.producer != NO_PRODUCER and (ten.producer >= len(p.ops)
                                            or t not in p.ops[ten.producer].outputs):
            fail(f"tensor {ten.name!r} names producer {ten.producer}, which does not list it")
    for t in p.forward_outputs:
        if t not in p.forward_tensors:
            fail(f"forward output {t} is not made by a forward op")
    for t in p.backward_outputs:
        if not 0 <= t < len(p.tensors):
            fail(f"backward output {t} is unknown")
    inplace = [i for i, op in enumerate(p.ops) if op.inplace_bytes]
    if inplace:
        _validate_inplace(p, inplace, fail)
    check_variants(p, fail)


def last_readers(ops) -> dict[int, int]:
    """tensor id -> the index of the last of `ops` that reads it."""
    return {t: i for i, op in enumerate(ops) for t in op.inputs}


def _validate_inplace(p, inplace: list[int], fail) -> None:
    """NOTE [In-place accumulation]
      A backward op may write its output into the storage of an input that dies there whatever
      the schedule: a tensor another backward op made, which no later op reads and the step
      does not return (so it is never kept, recomputed or read again). Gradient accumulation is
      the case: `add(g1, g2)` run as `g2 += g1` where g2 was made for that sum alone. While the
      op runs, that input's storage holds its output: the op allocates `inplace_bytes` less
      than its outputs (`Op.extra_bytes`). The decision is static, so every solver sees it as
      a constant. Backward ops run in the problem's order in every schedule the solvers make,
      so an input other backward ops read before this one dies here too (a residual block's
      gradient, read by the shortcut, then by the branch's BatchNorm backward); the simulator
      refuses a schedule that reorders them (NOTE [Backward ops reordered])."""
    last = last_readers(p.ops)
    for i in inplace:
        op = p.ops[i]
        ok = any(p.tensors[t].bytes == op.inplace_bytes and 0 <= p.tensors[t].producer < i
                 and p.ops[p.tensors[t].producer].is_backward and last[t] == i
                 and t not in p.backward_outputs for t in op.inputs)
        if op.inplace_bytes < 0 or not op.is_backward or not ok or \
                op.inplace_bytes > sum(p.tensors[t].bytes for t in op.outputs):
            fail(f"op {op.name!r} writes in place into {op.inplace_bytes} B, but it is not a "
                 "backward op reading a tensor of that size that no later op reads, made by a "
                 "backward op and not returned, or its outputs are smaller (NOTE [In-place "
                 "accumulation])")
