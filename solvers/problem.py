"""The abstract training step that every solver optimizes.

A `Problem` is the joint forward+backward graph of one training step, reduced to what scheduling
needs: operators (with their measured time and workspace) and the tensors they produce and read
(with their bytes). Ids are dense ints; ops are in topological order with every forward op before
every backward op. Names exist only for messages and for mapping back to the framework.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from functools import cached_property

from solvers.errors import InvalidProblemError, InvalidScheduleError
from solvers.problem_checks import NO_PRODUCER, last_readers, validate
from solvers.sane_numbers import plain_number
from solvers.variant_checks import least_workspaces

PLAIN_PROBLEMS_CACHED = 16  # with_variants results held per problem (NOTE [Plain problems cached])


def _tuples(obj, *names: str) -> None:
    """The fields `names` of frozen dataclass `obj` as tuples where given as lists (a problem
    built with lists passed its checks, then failed deep in the MILP: unhashable type 'list')."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, list):
            object.__setattr__(obj, name, tuple(value))


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
    buffers, inputs) are not listed: they are part of `Problem.fixed_bytes`.
    recompute_time_s: what a forward op costs when the backward runs it again, where that
    differs from its first run (None: time_s); see `rerun_s`. overwrites: forward tensors the
    op reads that it writes its output into where that input dies at it (NOTE [Writing into a
    dying input] in solvers/simulate.py). first_workspace_bytes: its forward run's workspace
    where less than its recomputations' (NOTE [A first run's workspace] in simulate.py).
    captured_workspace_bytes: a random op's forward run's where the schedule recomputes or
    replays it, its generator state copied in first (NOTE [The capture's copy] in
    monet_opt/recompute.py); None: as any forward run's. state_bytes: that state's slot, held
    from the step's start to its end where the schedule keeps the state (NOTE [States kept
    only where used] in monet_opt/recompute.py): counted in `Problem.fixed_bytes`, which the
    solvers take whole, and left out by the simulator where the schedule keeps none."""

    name: str
    is_backward: bool
    time_s: float
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    workspace_bytes: int = 0
    is_random: bool = False
    inplace_bytes: int = 0
    recompute_time_s: float | None = None
    overwrites: tuple[int, ...] = ()
    first_workspace_bytes: int | None = None
    captured_workspace_bytes: int | None = None
    state_bytes: int = 0

    def __post_init__(self) -> None:
        _tuples(self, "inputs", "outputs", "overwrites")

    @property
    def rerun_s(self) -> float:
        """The time of a recomputation (a BatchNorm's normalization from its kept statistics
        costs a tenth of the training op: NOTE [BatchNorm recomputed from its statistics] in
        monet_opt/bn_split.py)."""
        return self.time_s if self.recompute_time_s is None else self.recompute_time_s

    @property
    def extra_bytes(self) -> int:
        """What the op holds while it runs beyond its inputs and outputs: its workspace, less
        the storage of an input it writes its output into (NOTE [In-place accumulation])."""
        return self.workspace_bytes - self.inplace_bytes

    def run_workspace_bytes(self, first: bool, captured: bool = False) -> int:
        """Its workspace in its forward run (`first`; `captured`: its state copied in first)
        or in any other: a recomputation, the backward (NOTE [A first run's workspace] in
        simulate.py)."""
        if first and captured and self.captured_workspace_bytes is not None:
            return self.captured_workspace_bytes
        if first and self.first_workspace_bytes is not None:
            return self.first_workspace_bytes
        return self.workspace_bytes

    @property
    def first_extra_bytes(self) -> int:
        """`extra_bytes` of its forward run, captured or not (what the solvers price it at:
        they do not tell which ops a schedule captures)."""
        return max(self.run_workspace_bytes(True), self.run_workspace_bytes(True, True)) - \
            self.inplace_bytes


@dataclass(frozen=True)
class Variant:
    """Another way for backward op `op` to get what it needs from forward tensor `replaces`
    (MONeT's operator variants: a ReLU's backward reading a 1-bit sign mask instead of its output).

    Chosen, `op` reads the tensors `reads` in place of `replaces` (made by `encode_ops`, forward
    ops that run only when the variant is chosen, or tensors the forward makes anyway), and its
    time and workspace change by `extra_time_s` and `extra_workspace_bytes` (either sign: NOTE
    [A variant's workspace below its op's] in solvers/variant_checks.py).
    Variants of the same (op, replaces) exclude each other; the others combine. replays: it
    draws `replaces` again from the generator state its producer's forward run kept (NOTE
    [Generator-state replay] in monet_opt/variants.py): chosen, that run is captured."""

    name: str
    op: int
    replaces: int
    reads: tuple[int, ...] = ()
    encode_ops: tuple[int, ...] = ()
    extra_time_s: float = 0.0
    extra_workspace_bytes: int = 0
    replays: bool = False

    def __post_init__(self) -> None:
        _tuples(self, "reads", "encode_ops")

    @property
    def group(self) -> tuple[int, int]:
        return (self.op, self.replaces)


@dataclass(frozen=True)
class Problem:
    """ops: topological, forward ops first.  fixed_bytes: parameters, buffers and inputs, resident
    for the whole step.  forward_outputs: tensors the forward returns (alive until its end).
    backward_outputs: tensors the backward returns (parameter/input gradients, alive to the end).
    variants: optional alternatives (see Variant); a schedule names the ones it chooses, and
    `with_variants` gives the plain problem it then runs."""

    ops: tuple[Op, ...]
    tensors: tuple[Tensor, ...]
    fixed_bytes: int
    forward_outputs: tuple[int, ...] = ()
    backward_outputs: tuple[int, ...] = ()
    variants: tuple[Variant, ...] = ()
    name: str = field(default="problem", compare=False)

    def __post_init__(self) -> None:
        _tuples(self, "ops", "tensors", "forward_outputs", "backward_outputs", "variants")
        validate(self)

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

    def remake_s(self, t: int, held) -> float:
        """The time to make forward tensor t again from what is in `held`: its producer and the
        producer of every input not held, each once (NOTE [Recompute cost] in
        solvers/evict.py; rematerializing's evicted neighbourhood, solvers/remat.py)."""
        made, rerun = self._made_inputs
        seen, stack, cost = set(), [self.tensors[t].producer], 0.0
        while stack:
            j = stack.pop()
            if j not in seen:
                seen.add(j)
                cost += rerun[j]
                stack.extend(producer for u, producer in made[j] if u not in held)
        return cost

    @cached_property
    def _made_inputs(self) -> tuple[tuple[tuple[tuple[int, int], ...], ...], tuple[float, ...]]:
        """Per op, its inputs some op makes with their producers; per op, its rerun_s."""
        made = tuple(tuple((t, self.tensors[t].producer) for t in op.inputs
                           if self.tensors[t].producer != NO_PRODUCER) for op in self.ops)
        return made, tuple(op.rerun_s for op in self.ops)

    @cached_property
    def encode_ops(self) -> dict[int, int]:
        """Op id -> the variant whose encode op it is."""
        return {i: v for v, var in enumerate(self.variants) for i in var.encode_ops}

    @cached_property
    def least_workspaces(self) -> tuple[int, ...]:
        """Per op, the least workspace it runs with over its variants (NOTE [A variant's
        workspace below its op's] in solvers/variant_checks.py)."""
        return least_workspaces(self)

    @cached_property
    def base_time_s(self) -> float:
        """Every op once, no variant chosen, nothing recomputed."""
        return sum(op.time_s for i, op in enumerate(self.ops) if i not in self.encode_ops)

    @cached_property
    def no_recompute_time_s(self) -> float:
        """Every op once, with the cheapest variants: a lower bound on any schedule's time."""
        best: dict[tuple[int, int], float] = {}
        for v, var in enumerate(self.variants):
            best[var.group] = min(best.get(var.group, 0.0), self.variant_time_s(v))
        return self.base_time_s + sum(best.values())

    def variant_time_s(self, v: int) -> float:
        """What choosing variant v adds to the step time (its encode ops included)."""
        var = self.variants[v]
        return var.extra_time_s + sum(self.ops[i].time_s for i in var.encode_ops)

    def stateless(self, ops: set[int] | frozenset[int] | None = None) -> Problem:
        """This problem where `ops` (None: every op) keep no generator state: their states out
        of the fixed memory, their forward runs without the copy of one. Every schedule's peak
        on it is at most its own, so a bound on it holds for every schedule (NOTE [States kept
        only where used] in monet_opt/recompute.py)."""
        gone = [i for i, op in enumerate(self.ops) if (op.state_bytes or
                op.captured_workspace_bytes is not None) and (ops is None or i in ops)]
        if not gone:
            return self
        new = list(self.ops)
        for i in gone:
            new[i] = replace(new[i], state_bytes=0, captured_workspace_bytes=None)
        return replace(self, ops=tuple(new), fixed_bytes=self.fixed_bytes - sum(
            self.ops[i].state_bytes for i in gone))

    def only_variants(self, keep: set[int] | frozenset[int]) -> Problem:
        """The same problem offering only the variants in `keep` (renumbered in order); the
        others' encode ops cost nothing and make empty tensors, as if never chosen."""
        dropped = frozenset(range(len(self.variants))) - frozenset(keep)
        zeroed = _apply_variants(replace(self, variants=tuple(
            v for k, v in enumerate(self.variants) if k in dropped)), frozenset())
        return replace(zeroed, variants=tuple(v for k, v in enumerate(self.variants)
                                              if k not in dropped))

    def with_variants(self, chosen: frozenset[int] | set[int]) -> Problem:
        """The plain problem (no variants) that runs when `chosen` are the variants in use. Op
        and tensor ids stay the same; the encode ops of unchosen variants cost nothing, read
        nothing and make empty tensors."""
        if not self.variants:
            if chosen:
                raise InvalidProblemError(f"Problem {self.name!r} has no variants; "
                                          f"cannot choose {sorted(chosen)[:5]}")
            return self
        key = frozenset(chosen)
        plain = self._plain_problems.get(key)
        if plain is None:
            if len(self._plain_problems) >= PLAIN_PROBLEMS_CACHED:
                self._plain_problems.pop(next(iter(self._plain_problems)))
            plain = self._plain_problems[key] = _apply_variants(self, key)
        return plain

    @cached_property
    def _plain_problems(self) -> dict[frozenset[int], Problem]:
        """with_variants' results, oldest first. NOTE [Plain problems cached]: every
        simulation and every on-demand schedule starts from the plain problem of its variants;
        building and validating it anew took most of a heuristic's time on ResNet-50."""
        return {}

    @cached_property
    def memo(self) -> dict:
        """What solvers derive from this problem alone, whatever the budget, kept with it so
        that another solve of it starts where the last one stopped (Chen's greedy sweep,
        eviction's least peak: NOTE [Heuristics in their time] in solvers/timeshare.py)."""
        return {}

    # ---- JSON round trip (for the cache and for reproducing failures) ----
    def to_json(self) -> str:
        return json.dumps({"name": self.name, "fixed_bytes": self.fixed_bytes,
                           "forward_outputs": list(self.forward_outputs),
                           "backward_outputs": list(self.backward_outputs),
                           "ops": [_fields(op) for op in self.ops],
                           "tensors": [_fields(t) for t in self.tensors],
                           "variants": [_fields(v) for v in self.variants]},
                          default=plain_number)

    @staticmethod
    def from_json(text: str) -> Problem:
        return Problem.from_dict(json.loads(text))

    @staticmethod
    def from_dict(d: dict) -> Problem:
        """The problem whose to_json() parses to `d` (InvalidProblemError where it is none)."""
        try:
            return Problem(ops=[Op(**o) for o in d["ops"]],  # lists become tuples
                           tensors=[Tensor(**t) for t in d["tensors"]],
                           fixed_bytes=d["fixed_bytes"], forward_outputs=d["forward_outputs"],
                           backward_outputs=d["backward_outputs"],
                           variants=[Variant(**v) for v in d.get("variants", ())],
                           name=d["name"])
        except (KeyError, TypeError, AttributeError) as exc:  # a bare TypeError, deep inside
            raise InvalidProblemError(f"Problem.from_dict: not a problem's fields "
                                      f"({type(exc).__name__}: {exc})") from exc


def _fields(obj) -> dict:
    """dataclasses.asdict for the flat records here (ints, floats, strings and tuples of ints),
    without its deep copy: the same JSON, a quarter of the time (a cached optimize() hashes
    every profile it reads)."""
    return {name: getattr(obj, name) for name in _FIELD_NAMES[type(obj)]}


def _apply_variants(p: Problem, chosen: frozenset[int]) -> Problem:
    groups: dict[tuple[int, int], int] = {}
    for v in sorted(chosen):
        if not 0 <= v < len(p.variants):
            raise InvalidScheduleError(f"no variant #{v} (the problem has {len(p.variants)})")
        g = p.variants[v].group
        if g in groups:
            raise InvalidScheduleError(f"variants {p.variants[groups[g]].name!r} and "
                                       f"{p.variants[v].name!r} exclude each other")
        groups[g] = v
    ops = list(p.ops)
    tensors = list(p.tensors)
    for v, var in enumerate(p.variants):
        if v in chosen:
            op = ops[var.op]
            inputs = [t for x in op.inputs for t in ((x,) if x != var.replaces else var.reads)]
            workspace = op.workspace_bytes + var.extra_workspace_bytes  # either sign
            first = op.first_workspace_bytes
            ops[var.op] = replace(op, inputs=tuple(dict.fromkeys(inputs)),
                                  time_s=max(0.0, op.time_s + var.extra_time_s),
                                  workspace_bytes=workspace,
                                  first_workspace_bytes=None if first is None
                                  else min(first, workspace))
            if var.replays:  # its producer keeps its state, whatever the schedule recomputes
                j = p.tensors[var.replaces].producer  # (NOTE [The capture's copy])
                ops[j] = replace(ops[j], state_bytes=0, captured_workspace_bytes=None,
                                 first_workspace_bytes=ops[j].run_workspace_bytes(True, True))
            continue
        for i in var.encode_ops:
            ops[i] = replace(ops[i], time_s=0.0, workspace_bytes=0, first_workspace_bytes=None,
                             inputs=())
            for t in ops[i].outputs:
                tensors[t] = replace(tensors[t], bytes=0)
    return Problem(ops=tuple(ops), tensors=tuple(tensors), fixed_bytes=p.fixed_bytes,
                   forward_outputs=p.forward_outputs, backward_outputs=p.backward_outputs,
                   name=p.name)


_FIELD_NAMES = {cls: tuple(f.name for f in fields(cls)) for cls in (Op, Tensor, Variant)}


__all__ = ["NO_PRODUCER", "Op", "Problem", "Tensor", "Variant", "last_readers"]
