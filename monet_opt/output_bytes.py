"""What an op's outputs hold, measured where their storages are larger than their shapes.

NOTE [Outputs larger than their shapes]
  The lowering counts each op's outputs by their fake tensors: shape and dtype. Some kernels
  return a result whose storage is larger: on CPU, mse_loss, smooth_l1_loss,
  binary_cross_entropy and soft_margin_loss reduced to a scalar return it in the storage of the
  elementwise losses (98,304 B for an 8x3x32x32 batch, counted as 4 B). A step that returns
  such a loss holds that storage to its end: WithLoss(model, F.mse_loss), exact for any loss by
  its word, and a diffusion model's loss inside its forward measured 98,300 B over their plans,
  at the least limit over the limit. The profiler's warm-up run measures each output's storages
  (`held`: one shared with an argument, or with an earlier output of the same op, as nothing),
  and the planner raises a tensor's bytes to that where it is more (`raised`).
  The loss is held as fixed memory from the step's start (monet_opt/held_outputs.py), as a
  loop that keeps `loss` holds the last step's through the next forward: a step measured
  alone whose peak is in its forward measures up to that storage under its prediction (a
  64x256 target: 3.5 %, where `(o - t).square().mean()` is exact; ops probe, 2026-12-06).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from monet_opt.memory import allocated_bytes, dense_parts
from monet_opt.stats_in_place import MARK
from solvers import Problem


def held(out, read, node: fx.Node | None = None) -> tuple[int, ...]:
    """Each tensor in `out` (a tensor, or a tuple or list of values): the bytes of its storages
    not among those of the tensors in `read` nor of an earlier output; none for the new values
    of buffers that the step's forward updates in place (`node`'s, NOTE [Statistics updated in
    place] in monet_opt/stats_in_place.py)."""
    seen = {p.untyped_storage().data_ptr() for t in pytree.tree_leaves(read)
            if isinstance(t, torch.Tensor) for p in dense_parts(t)}
    in_place = () if node is None else node.meta.get(MARK, ())
    found = []
    for k, t in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
        if not isinstance(t, torch.Tensor):
            continue
        if k in in_place:
            found.append(0)
            continue
        nbytes = 0
        for part in dense_parts(t):
            storage = part.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                nbytes += allocated_bytes(storage.nbytes(), t.device)
        found.append(nbytes)
    return tuple(found)


def raised(problem: Problem, measured: Sequence[tuple[int, ...] | None]) -> Problem:
    """`problem` with each op output's bytes raised to what `held` measured of it (per op, in
    the problem's order; None: not run), where the op made as many tensors as the problem
    says."""
    tensors, grown = list(problem.tensors), set()
    for op, nbytes in zip(problem.ops, measured):
        if nbytes is not None and len(nbytes) == len(op.outputs):
            for t, n in zip(op.outputs, nbytes):
                if n > tensors[t].bytes:
                    tensors[t] = dataclasses.replace(tensors[t], bytes=n)
                    grown.add(t)
    # an op writes its output into a dying input of the same size only (NOTE [Writing into a
    # dying input] in solvers/simulate.py, NOTE [In-place accumulation] in solvers/problem.py):
    # not where one of them has grown (a loss added to the mse_loss scalar); counted as made
    ops = tuple(dataclasses.replace(op, overwrites=(), inplace_bytes=0)
                if (op.overwrites or op.inplace_bytes) and
                (set(op.inputs) | set(op.outputs)) & grown else op
                for op in problem.ops)
    return dataclasses.replace(problem, ops=ops, tensors=tuple(tensors))
