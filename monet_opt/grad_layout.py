"""Return each parameter's gradient in the parameter's own layout (a rewrite of the joint graph).

NOTE [Gradients in the parameter's layout]
  autograd's AccumulateGrad stores a new gradient as it is only if its strides match the
  parameter's (size-1 dimensions aside); otherwise it copies it into the parameter's layout
  first. Eager does that copy as soon as the gradient is made. A joint graph hands back all its
  gradients at the end of the backward, so the copy came after the last op, with every
  gradient alive: a moment no plan counted. ConvNeXt's downsampling convolutions read
  channels-last inputs and make channels-last weight gradients; at half its activations a
  ConvNeXt-T step measured 4.5 MiB (one such gradient) over its prediction and over its limit.
  The backward now makes that copy itself, right after the gradient (`clone` into the
  parameter's memory format: the values are the gradient's, bitwise), so the plan counts it
  where it happens and AccumulateGrad has nothing left to copy. Only contiguous and
  channels-last parameters are matched (clone can make no other layout); others are left as
  they were.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from monet_opt import phase
from monet_opt.errors import CaptureError
from monet_opt.refusals import DENSE
from monet_opt.placeholders import primal_placeholders

aten = torch.ops.aten


def match_gradient_layouts(gm: fx.GraphModule, num_fwd_outputs: int) -> int:
    """NOTE [Gradients in the parameter's layout], in place; returns how many gradients were
    copied."""
    output = gm.graph.output_node()
    outs = list(output.args[0])
    primals = primal_placeholders(gm)
    count = 0
    for k, (primal, grad) in enumerate(zip(primals, outs[num_fwd_outputs:]), num_fwd_outputs):
        if not isinstance(grad, fx.Node):
            continue
        param, value = primal.meta.get("val"), grad.meta.get("val")
        if isinstance(value, torch.Tensor) and value.layout != torch.strided:
            raise CaptureError(  # a module's is refused before the trace (refusals.py)
                "monet_opt.optimize: a parameter's gradient is a sparse tensor (an embedding "
                "looked up with sparse=True: F.embedding(..., sparse=True), F.embedding_bag), "
                "which a traced backward cannot make. Look it up with sparse=False" + DENSE)
        fmt = _format_of(param) if isinstance(value, torch.Tensor) else None
        if fmt is None or _same_strides(param, value):
            continue
        with gm.graph.inserting_after(grad):
            copy = gm.graph.call_function(aten.clone.default, (grad,), {"memory_format": fmt})
        copy.meta.update(grad.meta)
        phase.mark_backward(copy)
        with value.fake_mode:
            copy.meta["val"] = value.clone(memory_format=fmt)
        outs[k] = copy
        count += 1
    if count:
        output.args = (outs, *output.args[1:])
        gm.recompile()
    return count


def _format_of(param: object) -> torch.memory_format | None:
    if not isinstance(param, torch.Tensor):
        return None
    if param.is_contiguous():
        return torch.contiguous_format
    if param.dim() == 4 and param.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return None


def _same_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    """As AccumulateGrad judges: equal strides wherever the size is not 1."""
    return a.shape == b.shape and all(
        sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n != 1)
