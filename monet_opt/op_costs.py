"""A lowered problem with what the profiler measured of each op: its time, its
recomputation's, its workspace (its first run's apart, with its state captured and without:
NOTE [A first run's workspace] in solvers/simulate.py) and its outputs' bytes (NOTE [Outputs
larger than their shapes])."""
from __future__ import annotations

import dataclasses

import torch.fx as fx

from monet_opt import output_bytes
from monet_opt.lower import Lowered
from monet_opt.misread_layouts import as_laid_out


def measured_ops(lowered: Lowered, measured, joint: fx.GraphModule) -> Lowered:
    """`lowered` with `measured`'s (a ProfileResult's) per-op costs. A workspace the lowering
    set (bn_split's) is a floor: an op's measured one is raised to it, its first run's too. An
    op writes into no argument that `joint`'s real run laid out otherwise than its result (NOTE
    [Writing into a tensor laid out otherwise than traced] in monet_opt/misread_layouts.py)."""
    problem = output_bytes.raised(lowered.problem, measured.op_output_bytes)
    firsts = measured.op_first_workspace_bytes or (None,) * len(problem.ops)
    captures = measured.op_captured_workspace_bytes or (None,) * len(problem.ops)
    ops = []
    for op, t, r, w, f, c in zip(problem.ops, measured.op_time_s, measured.op_rerun_s,
                                 measured.op_workspace_bytes, firsts, captures):
        workspace = max(op.workspace_bytes, w)
        first, captured = (None if v is None else min(workspace, max(op.workspace_bytes, v))
                           for v in (f, c))
        if first is not None and captured is not None:  # the capture runs the op too: what
            captured = max(captured, first)  # it measured less is noise (the bound takes both)
        ops.append(dataclasses.replace(op, time_s=t, recompute_time_s=r,
                                       workspace_bytes=workspace, first_workspace_bytes=first,
                                       captured_workspace_bytes=captured))
    problem = dataclasses.replace(problem, ops=tuple(ops))
    return as_laid_out(dataclasses.replace(lowered, problem=problem), joint,
                       dict(measured.relaid))
