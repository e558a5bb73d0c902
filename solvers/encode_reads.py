"""The joint MILP's forward rows: when each forward tensor's last plain read is, what the
encode ops of chosen variants keep alive past it, and which input each step writes its output
into (solvers/milp.py's Program)."""
from __future__ import annotations

from solvers.mip import Mip
from solvers.problem import NO_PRODUCER, Problem


def last_forward_read(p: Problem) -> dict[int, int]:
    """Forward step after which each forward tensor is freed if it is not kept (reads by
    variants' encode ops not counted: the forward rows add those where chosen)."""
    pos = {i: k for k, i in enumerate(p.forward_ops)}
    last = {x: pos[p.tensors[x].producer] for x in p.forward_tensors}
    for i in p.forward_ops:
        if i in p.encode_ops:
            continue
        for x in p.ops[i].inputs:
            last[x] = max(last[x], pos[i])
    for x in p.forward_outputs:
        last[x] = len(p.forward_ops) - 1
    return last


# NOTE [Read by a later encode op]
#   An encode op runs only where its variant is chosen, and may read a tensor past that
#   tensor's last plain forward read (an op's mask made after the op's output was last read).
#   Then the tensor lives on to the encode op, and every forward step between holds it, unless
#   it is kept (then P counts it). At each such step the row counts its bytes times
#   w >= E[v] - S[0][x] for every chosen encode op at or after the step; w is E[v] itself where
#   one encode op waits on an unkept tensor. Counting it only at the encode op's own step, an
#   earlier encode op's workspace met it uncounted: the schedule the program found peaked at
#   111 B over a budget of 80 B (an internal SolverError of "milp" and "auto", solvers
#   fuzzing, 2026-12-02).
def encode_reads(p: Problem, mip: Mip, kept: dict[int, int], chosen: list[int],
                 last_read: dict[int, int]) -> dict[int, list[tuple[int, float]]]:
    """Per forward step, the terms of tensors waiting there for a chosen encode op (kept: the
    S[0] variables; chosen: the E variables, by variant)."""
    pos = {i: k for k, i in enumerate(p.forward_ops)}
    readers: dict[int, list[tuple[int, int]]] = {}  # x -> (step, E) of late encode reads
    for i, v in p.encode_ops.items():
        for x in set(p.ops[i].inputs):
            if p.tensors[x].producer != NO_PRODUCER and last_read[x] < pos[i]:
                readers.setdefault(x, []).append((pos[i], chosen[v]))
    terms: dict[int, list[tuple[int, float]]] = {}
    for x, reads in readers.items():
        for k in range(last_read[x] + 1, max(step for step, _ in reads) + 1):
            later = [e for step, e in reads if step >= k]
            if len(later) == 1 and x not in kept:
                w = later[0]
            else:
                w = mip.var(0.0, 1.0, integer=False)
                for e in later:
                    mip.row([(w, 1.0), (e, -1.0)] + ([(kept[x], 1.0)] if x in kept else []),
                            lo=0.0)
            terms.setdefault(k, []).append((w, float(p.tensors[x].bytes)))
    return terms


# NOTE [Written into in the forward]
#   A forward op writes its output into an input whose copy dies at it (NOTE [Writing into a
#   dying input] in solvers/simulate.py): in the forward, that is an input last read there, not
#   kept and not a forward output. The row of that step counts the output's bytes less the
#   input's times (1 - S[0][x]), for the first input of `Op.overwrites` that can qualify; where
#   that one is kept the simulator may take a later one, which the row still counts (an upper
#   bound, as every row). An input a variant's encode op may read later is left out: chosen, it
#   outlives the step. Counted at full size, ResNet's in-place ReLUs made every forward row
#   one activation too high.
def written_in_forward(p: Problem, last_read: dict[int, int]) -> dict[int, int]:
    """Forward step -> the input it writes its output into unless that input is kept."""
    encoded = {x for i in p.encode_ops for x in p.ops[i].inputs}
    outputs = set(p.forward_outputs)
    written = {}
    for k, i in enumerate(p.forward_ops):
        if i in p.encode_ops:
            continue
        for x in p.ops[i].overwrites:
            if last_read.get(x) == k and x not in outputs and x not in encoded:
                written[k] = x
                break
    return written
