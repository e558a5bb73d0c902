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


def held(problem: Problem, made: frozenset[int]) -> Problem:
    """`problem` where the random ops whose outputs the step holds anyway (`made`: NOTE [Held
    tensors made again] in monet_opt/held_outputs.py) keep no state: recomputed, they are read,
    not run again; one whose output a variant may draw again keeps its state."""
    replayed = {problem.tensors[v.replaces].producer for v in problem.variants if v.replays}
    return problem.stateless({i for i, op in enumerate(problem.ops) if op.state_bytes and
                               i not in replayed and op.outputs and set(op.outputs) <= made})


def all_counted(problem: Problem) -> Problem:
    """`problem` as the solvers count it: every state held whatever the schedule."""
    return dataclasses.replace(problem, ops=tuple(
        dataclasses.replace(op, state_bytes=0) if op.state_bytes else op for op in problem.ops))
