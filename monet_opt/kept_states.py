"""The generator states of a step's problem (NOTE [States kept only where used] in
monet_opt/recompute.py): each random op's, on the op as `Op.state_bytes` and in the fixed
memory, which the simulator leaves out where the schedule keeps none of it."""
from __future__ import annotations

import dataclasses

from solvers import Problem


def with_states(problem: Problem, lowered) -> Problem:
    """`problem` with the states `lowered.states` names on their random ops (the caller
    counts them in the fixed memory)."""
    if not lowered.states:
        return problem
    index = {name: i for i, name in enumerate(lowered.op_nodes)}
    sizes = {index[name]: size for name, size in lowered.states}
    return dataclasses.replace(problem, ops=tuple(
        dataclasses.replace(op, state_bytes=sizes[i]) if i in sizes else op
        for i, op in enumerate(problem.ops)))


def stateless(problem: Problem, ops: set[int] | None = None) -> Problem:
    """`problem` where `ops` (None: every op) keep no state: their states out of the fixed
    memory, and their first runs without the capture (NOTE [The capture's copy])."""
    gone = [i for i, op in enumerate(problem.ops)
            if op.state_bytes and (ops is None or i in ops)]
    if not gone:
        return problem
    new = list(problem.ops)
    for i in gone:
        new[i] = dataclasses.replace(new[i], state_bytes=0, captured_workspace_bytes=None)
    return dataclasses.replace(problem, ops=tuple(new), fixed_bytes=problem.fixed_bytes - sum(
        problem.ops[i].state_bytes for i in gone))


def held(problem: Problem, made: frozenset[int]) -> Problem:
    """`problem` where the random ops whose outputs the step holds anyway (`made`: NOTE [Held
    tensors made again] in monet_opt/held_outputs.py) keep no state: recomputed, they are read,
    not run again; one whose output a chosen variant draws again keeps its state."""
    replayed = {problem.tensors[v.replaces].producer for v in problem.variants if v.replays}
    return stateless(problem, {i for i, op in enumerate(problem.ops) if op.state_bytes and
                               i not in replayed and op.outputs and set(op.outputs) <= made})


def all_counted(problem: Problem) -> Problem:
    """`problem` as the solvers count it: every state held whatever the schedule."""
    return dataclasses.replace(problem, ops=tuple(
        dataclasses.replace(op, state_bytes=0) if op.state_bytes else op for op in problem.ops))
