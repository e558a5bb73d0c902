"""The abstract training step that every solver optimizes.

A `Problem` is the joint forward+backward graph of one training step, reduced to what scheduling
needs: operators (with their measured time and workspace) and the tensors they produce and read
(with their bytes). Ids are dense ints; ops are in topological order with every forward op before
every backward op. Names exist only for messages and for mapping back to the framework.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property

from solvers.errors import InvalidProblemError

NO_PRODUCER = -1  # a tensor that exists from the start of the backward (an output gradient)


@dataclass(frozen=True)
class Tensor:
    """One storage the step allocates.

    name: for messages.  bytes: its size.  producer: the op that creates it, or NO_PRODUCER for an
    output gradient (a tangent), which autograd hands to the backward.
    """

    name: str
    bytes: int
    producer: int


@dataclass(frozen=True)
class Op:
    """One operator. inputs/outputs are tensor ids; tensors that are always resident (parameters,
    buffers, inputs) are not listed: they are part of `Problem.fixed_bytes`."""

    name: str
    is_backward: bool
    time_s: float
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    workspace_bytes: int = 0
    is_random: bool = False


@dataclass(frozen=True)
class Problem:
    """ops: topological, forward ops first.  fixed_bytes: parameters, buffers and inputs, resident
    for the whole step.  forward_outputs: tensors the forward returns (alive until its end).
    backward_outputs: tensors the backward returns (parameter/input gradients, alive to the end)."""

    ops: tuple[Op, ...]
    tensors: tuple[Tensor, ...]
    fixed_bytes: int
    forward_outputs: tuple[int, ...] = ()
    backward_outputs: tuple[int, ...] = ()
    name: str = field(default="problem", compare=False)

    def __post_init__(self) -> None:
        _validate(self)

    # ---- derived views (computed once; the dataclass is frozen) ----
    @cached_property
    def forward_ops(self) -> tuple[int, ...]:
        return tuple(i for i, op in enumerate(self.ops) if not op.is_backward)

    @cached_property
    def backward_ops(self) -> tuple[int, ...]:
        return tuple(i for i, op in enumerate(self.ops) if op.is_backward)

    @cached_property
    def tangents(self) -> tuple[int, ...]:
        return tuple(t for t, ten in enumerate(self.tensors) if ten.producer == NO_PRODUCER)

    @cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        users: list[list[int]] = [[] for _ in self.tensors]
        for i, op in enumerate(self.ops):
            for t in op.inputs:
                users[t].append(i)
        return tuple(tuple(u) for u in users)

    @cached_property
    def forward_tensors(self) -> tuple[int, ...]:
        return tuple(t for t, ten in enumerate(self.tensors)
                     if ten.producer != NO_PRODUCER and not self.ops[ten.producer].is_backward)

    @cached_property
    def saved_for_backward(self) -> frozenset[int]:
        """Forward tensors that some backward op reads (what store-all keeps)."""
        fwd = set(self.forward_tensors)
        needed = {t for i in self.backward_ops for t in self.ops[i].inputs if t in fwd}
        needed |= {t for t in self.backward_outputs if t in fwd}
        return frozenset(needed)

    @cached_property
    def no_recompute_time_s(self) -> float:
        """Every op once: a lower bound on the step time of any schedule."""
        return sum(op.time_s for op in self.ops)

    # ---- JSON round trip (for the cache and for reproducing failures) ----
    def to_json(self) -> str:
        return json.dumps({"name": self.name, "fixed_bytes": self.fixed_bytes,
                           "forward_outputs": list(self.forward_outputs),
                           "backward_outputs": list(self.backward_outputs),
                           "ops": [asdict(op) for op in self.ops],
                           "tensors": [asdict(t) for t in self.tensors]})

    @staticmethod
    def from_json(text: str) -> Problem:
        d = json.loads(text)
        ops = tuple(Op(**{**o, "inputs": tuple(o["inputs"]), "outputs": tuple(o["outputs"])})
                    for o in d["ops"])
        return Problem(ops=ops, tensors=tuple(Tensor(**t) for t in d["tensors"]),
                       fixed_bytes=d["fixed_bytes"], forward_outputs=tuple(d["forward_outputs"]),
                       backward_outputs=tuple(d["backward_outputs"]), name=d["name"])


def _validate(p: Problem) -> None:
    def fail(msg: str) -> None:
        raise InvalidProblemError(f"Problem {p.name!r}: {msg}")

    if p.fixed_bytes < 0:
        fail(f"fixed_bytes is negative ({p.fixed_bytes})")
    seen_backward = False
    for i, op in enumerate(p.ops):
        seen_backward |= op.is_backward
        if seen_backward and not op.is_backward:
            fail(f"forward op {op.name!r} (#{i}) comes after a backward op")
        if op.time_s < 0 or op.workspace_bytes < 0:
            fail(f"op {op.name!r} has a negative time or workspace")
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
    for t, ten in enumerate(p.tensors):
        if ten.bytes < 0:
            fail(f"tensor {ten.name!r} has negative bytes")
        if ten.producer != NO_PRODUCER and (ten.producer >= len(p.ops)
                                            or t not in p.ops[ten.producer].outputs):
            fail(f"tensor {ten.name!r} names producer {ten.producer}, which does not list it")
    for t in p.forward_outputs:
        if t not in p.forward_tensors:
            fail(f"forward output {t} is not made by a forward op")
    for t in p.backward_outputs:
        if not 0 <= t < len(p.tensors):
            fail(f"backward output {t} is unknown")
