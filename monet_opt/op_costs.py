"""A lowered problem with what the profiler measured of each op: its time, its
recomputation's, its workspace (its first run's apart: NOTE [A first run's workspace] in
solvers/simulate.py) and its outputs' bytes (NOTE [Outputs larger than their shapes])."""
from __future__ import annotations

import dataclasses

from monet_opt import output_bytes
from solvers import Problem


def measured_ops(problem: Problem, measured) -> Problem:
    """`problem` with `measured`'s (a ProfileResult's) per-op costs. A workspace the lowering
    set (bn_split's) is a floor: an op's measured one is raised to it, its first run's too."""
    problem = output_bytes.raised(problem, measured.op_output_bytes)
    firsts = measured.op_first_workspace_bytes or (None,) * len(problem.ops)
    ops = []
    for op, t, r, w, f in zip(problem.ops, measured.op_time_s, measured.op_rerun_s,
                              measured.op_workspace_bytes, firsts):
        workspace = max(op.workspace_bytes, w)
        first = None if f is None else min(workspace, max(op.workspace_bytes, f))
        ops.append(dataclasses.replace(op, time_s=t, recompute_time_s=r,
                                       workspace_bytes=workspace, first_workspace_bytes=first))
    return dataclasses.replace(problem, ops=tuple(ops))
