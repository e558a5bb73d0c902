"""A lower bound on every schedule's peak from the problem's sizes alone: no op's time is read,
so it holds for a problem before its ops are timed (and after: timing only raises sizes).

NOTE [A least peak from sizes]
  Whatever a schedule keeps or recomputes, every op runs at least once, and while it runs the
  simulator (NOTE [Lifetimes] in simulate.py) holds the fixed memory, the op's inputs and
  outputs and its workspace, and every gradient of the step made before it (gradients live
  to the step's end). An op's inputs are counted except
    - those a variant of the op may replace (the variant's reads may be smaller: counted 0),
    - those it may write its output into (NOTE [Writing into a dying input]: counted 0);
  an input it accumulates into (NOTE [In-place accumulation]) is counted, and the op's
  `inplace_bytes` taken off, as the simulator does. The gradients made before a backward op
  are those of the backward ops it depends on, whichever order a schedule runs them in; a
  variant's encode ops are not counted (unchosen, they make nothing), and an op's workspace
  is the least it runs with over its variants (a variant's run may need less scratch than its
  op: NOTE [A variant's workspace below its op's] in solvers/variant_checks.py). So the
  largest of these sums, and the fixed memory with every gradient of the step (held at its
  end), is at most the peak of every schedule, the least included. It is what
  `largest_batch` asks of a batch before profiling it (NOTE [The largest batch] in
  monet_opt/batch_size.py): a step that cannot fit is refused in the time of a trace. It
  sees no recomputation's cost and no schedule: where the least peak is set by what must be
  kept across the backward rather than by one op, it is low.
"""
from __future__ import annotations

from dataclasses import dataclass

from solvers.problem import NO_PRODUCER, Problem


@dataclass(frozen=True)
class PeakBound:
    """bytes: no schedule of the problem peaks below this. op: the op that sets it (its name),
    or "" where it is the fixed memory with every gradient, held at the step's end."""

    bytes: int
    op: str


def least_peak_bound(problem: Problem) -> PeakBound:
    """NOTE [A least peak from sizes]: a lower bound on the peak of every schedule of
    `problem`, whatever its variants."""
    sizes = [t.bytes for t in problem.tensors]
    grads = _gradient_makers(problem)
    # a schedule may keep no generator state (NOTE [States kept only where used])
    fixed = problem.fixed_bytes - sum(op.state_bytes for op in problem.ops)
    best = PeakBound(fixed + sum(sizes[t] for t in set(problem.backward_outputs)), "")
    replaceable: dict[int, set[int]] = {}
    for var in problem.variants:
        replaceable.setdefault(var.op, set()).add(var.replaces)
    local = [(_while_running(problem, i, sizes, replaceable.get(i, set())), i)
             for i in range(len(problem.ops)) if i not in problem.encode_ops]
    all_grads = sum(sizes[t] for made in grads.values() for t in made)
    ancestors = _backward_ancestors(problem) if grads else {}
    for held, i in sorted(local, key=lambda entry: (-entry[0], entry[1])):  # ties: first op
        if fixed + held + all_grads <= best.bytes:
            break  # sorted: no later op can set it
        made, own = ancestors.get(i, 0), set(problem.ops[i].inputs)
        before = sum(sizes[t] for j, ts in grads.items() if made >> j & 1 for t in ts
                     if t not in own)
        total = fixed + held + before
        if total > best.bytes:
            best = PeakBound(total, problem.ops[i].name)
    return best


def _while_running(problem: Problem, i: int, sizes: list[int], replaceable: set[int]) -> int:
    """What op i holds while it runs beyond the fixed memory and earlier gradients: its
    inputs (less those a variant may replace, `replaceable`, or the op may write into), its
    outputs and its workspace less what it accumulates in place (its first run's: NOTE [A
    first run's workspace] in solvers/simulate.py; the least over its variants)."""
    op = problem.ops[i]
    open_ = replaceable | set(op.overwrites)
    inputs = sum(sizes[t] for t in set(op.inputs) - open_)
    # a random op's first run copies its generator state only where a schedule keeps it
    # (NOTE [The capture's copy] in monet_opt/recompute.py): the run without is the bound
    extra = min(op.run_workspace_bytes(True), op.run_workspace_bytes(True, True),
                problem.least_workspaces[i]) - op.inplace_bytes
    return inputs + sum(sizes[t] for t in set(op.outputs)) + extra


def _gradient_makers(problem: Problem) -> dict[int, list[int]]:
    """Backward op -> the step's gradients it makes (alive to the step's end)."""
    makers: dict[int, list[int]] = {}
    for t in sorted(set(problem.backward_outputs)):
        j = problem.tensors[t].producer
        if j != NO_PRODUCER and problem.ops[j].is_backward:
            makers.setdefault(j, []).append(t)
    return makers


def _backward_ancestors(problem: Problem) -> dict[int, int]:
    """Backward op -> the backward ops it depends on (through the tensors they make), as a
    bit set over op ids."""
    found: dict[int, int] = {}
    for i in problem.backward_ops:
        bits = 0
        for t in problem.ops[i].inputs:
            j = problem.tensors[t].producer
            if j != NO_PRODUCER and problem.ops[j].is_backward:
                bits |= found[j] | 1 << j
        found[i] = bits
    return found
