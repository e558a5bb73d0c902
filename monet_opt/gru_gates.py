"""NOTE [A GRU's gates by rows]
  Eager's GRU cell (ATen's C++ composite, nn.GRU's and nn.GRUCell's) computes its reset and
  update gates in place on slices of one gate tensor, `hgates[:, :H].add_(igates[:, :H])
  .sigmoid_()`: each gate a (batch, H) view whose rows lie 3H apart. ATen's CPU loop runs such
  a view row by row, each row in steps of two vector widths from its start and its last
  `H % step` elements as scalar code, whose sigmoid rounds otherwise than the vector one. The
  traced graph computes the same gate as `sigmoid(add(...))` on a fresh contiguous tensor,
  which the loop runs as one long row: where H is not a multiple of the step (32 floats on
  AVX-512), other elements took the scalar code, and a GRU 100 wide (two layers) measured
  outputs 4.5e-8 and every gradient up to 9.5e-7 from eager's; 40 and 48 wide one layer
  already. So a sigmoid its cell recorded (tagged by eager_kernels, NOTE [Eager's own
  kernels]) runs as `monet_opt::sigmoid_by_rows`: the first H - H % step columns of every row
  in one call, the rest in another, into one contiguous result, which is eager's split (rows
  shorter than a step, all scalar in eager, as every other column twice: a GRU 16 wide). The
  step is found, per dtype and width, by running eager's in-place form beside the split on
  random rows (`step_for`: the first of the candidates that gives eager's bits where the plain
  sigmoid does not); where none does, or the plain one does, the sigmoid stays as it is.
  CPU only (a GRU on CUDA runs cuDNN's kernel). Gates large enough for ATen to split them
  over threads gave eager's bits too: with 2 threads, batch x width 25,600, 38,400 and 64,000
  (one layer 100, 300 and 1,000 wide; outputs and gradients, 2026-12-04).
"""
from __future__ import annotations

import functools

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from monet_opt.eager_kernels import GATES

aten = torch.ops.aten
_CANDIDATES = (64, 32, 16, 8, 4)
_ROWS = 256  # random rows a step is tried on


@torch.library.custom_op("monet_opt::sigmoid_by_rows", mutates_args=())
def sigmoid_by_rows(x: torch.Tensor, step: int) -> torch.Tensor:
    """sigmoid(x) computed as eager's GRU cell computes a gate (NOTE [A GRU's gates by
    rows]): the first `width - width % step` elements of each row, then the rest."""
    out = torch.empty_like(x)
    main = x.shape[-1] - x.shape[-1] % step
    if main:
        torch.sigmoid(x[..., :main], out=out[..., :main])
        torch.sigmoid(x[..., main:], out=out[..., main:])
    else:  # rows shorter than a step: scalar code throughout, which every other element
        for start in (0, 1):  # (not laid out contiguously) gets
            torch.sigmoid(x[..., start::2], out=out[..., start::2])
    return out


@sigmoid_by_rows.register_fake
def _(x: torch.Tensor, step: int) -> torch.Tensor:
    return torch.empty_like(x)


def by_rows(joint: fx.GraphModule) -> int:
    """Point every sigmoid a GRU's cell recorded on CPU at sigmoid_by_rows where its width
    needs it; returns how many."""
    count = 0
    for node in joint.graph.find_nodes(op="call_function", target=aten.sigmoid.default):
        val = node.meta.get("val")
        if not (node.meta.get("custom") or {}).get(GATES) or not isinstance(
                val, torch.Tensor) or val.device.type != "cpu" or val.dim() == 0 or \
                not val.is_contiguous():
            continue
        step = step_for(val.dtype, val.shape[-1])
        if step is not None:
            node.target, node.args = torch.ops.monet_opt.sigmoid_by_rows.default, \
                (node.args[0], step)
            count += 1
    if count:
        joint.recompile()
    return count


@functools.cache
def step_for(dtype: torch.dtype, width: int) -> int | None:
    """The step eager's in-place sigmoid takes on rows `width` wide (NOTE [A GRU's gates by
    rows]), where splitting by it is needed and gives eager's bits; else None."""
    with unset_fake_temporarily(), torch.no_grad():  # called while AOTAutograd traces
        generator = torch.Generator().manual_seed(width)
        base = (torch.randn(_ROWS, 3 * width, generator=generator) * 4).to(dtype)
        gate = base[:, :width]
        eager = base.clone()[:, :width].sigmoid_()
        if torch.equal(torch.sigmoid(gate.contiguous()), eager):
            return None
        for step in _CANDIDATES:
            if width % step and torch.equal(sigmoid_by_rows(gate.contiguous(), step), eager):
                return step
    return None
