"""Ops whose real output layout is not the one torch's tracer says.

NOTE [Layouts the tracer misreads]
  For a few CPU kernels torch's tracer says another output layout than the kernel makes:
  GroupNorm on a channels-last input (the kernel keeps channels-last, the trace says
  contiguous), copysign, xlogy and binary_cross_entropy with a transposed first operand,
  complex angle. Where the model then flattens or reshapes that output, the trace has a view
  where eager's reshape copied, and the real tensor cannot be viewed so: optimize() failed in
  the profiler with "view size is not compatible" and "please report the model" (a conv,
  channels-last, GroupNorm, flatten, Linear). torch.compile(backend="aot_eager") fails alike;
  inductor, which writes its own kernels, does not. The profiler runs every op on real tensors,
  so where an op fails on an argument laid out otherwise than the trace says, it now raises a
  CaptureError naming the op that made it and what to do: make that op's inputs contiguous
  (a `.contiguous()` of its output is traced as nothing, the tracer taking it for contiguous
  already); tests/test_grad_layout.py.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from monet_opt.errors import CaptureError
from monet_opt.lower import is_view_node


def refuse_misread_layout(node: fx.Node, env, exc: Exception) -> None:
    """CaptureError where `node` failed on an argument whose real layout is not the trace's
    (NOTE [Layouts the tracer misreads]); nothing otherwise."""
    for arg in node.all_input_nodes:
        real, traced = env.get(arg.name), arg.meta.get("val")
        if not (isinstance(real, torch.Tensor) and isinstance(traced, torch.Tensor)) or \
                tuple(real.stride()) == tuple(traced.stride()):
            continue
        maker = arg
        while is_view_node(maker) and isinstance(env.get(maker.args[0].name), torch.Tensor):
            maker = maker.args[0]
        if maker.target is operator.getitem:  # one output of several: the op's
            maker = maker.args[0]
        where = (maker.meta.get("stack_trace") or "").strip().splitlines()[-2:]
        raise CaptureError(
            f"monet_opt.optimize: {maker.target} returned a tensor of shape {tuple(real.shape)} "
            f"laid out with strides {tuple(real.stride())} where torch's tracer says "
            f"{tuple(traced.stride())}, and {node.target}, traced for the tracer's layout, "
            f"cannot run on it ({exc}). torch.compile(backend='aot_eager') fails alike. Make "
            f"that op's inputs contiguous before it (`x.contiguous()` before a GroupNorm of a "
            f"channels-last model; a .contiguous() after the op is no help: the tracer takes "
            f"its output for contiguous already)" + (
                f"; the op: {' '.join(w.strip() for w in where)}" if where else "") +
            " (NOTE [Layouts the tracer misreads] in monet_opt/misread_layouts.py).") from exc
