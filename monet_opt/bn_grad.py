"""A BatchNorm's backward writing its input's gradient into its output's gradient.

NOTE [BatchNorm's gradient in place]
  native_batch_norm_backward reads dy, the gradient of its output, and makes dx, the gradient
  of its input, of the same size. Where dy dies there (the backward made it for this op alone:
  a ReLU's backward, usually), the executor runs the op's out= form with dx written into dy's
  storage. ATen's CPU kernels take their per-channel sums over dy first and then make each dx
  element from the dy element it replaces, so dx is bitwise the functional op's (checked over
  NCHW and channels-last, 2 to 5 dimensions, float32, float64 and bfloat16, training and eval:
  tests/test_bn_grad.py). The step then holds one activation-sized tensor less while each such
  op runs: GoogLeNet (b32, 128², CPU, the kept problem) reaches a least peak of 143.5 MiB where
  it reached 152.6 (its activations there 96.0 -> 86.9 MiB), at the same predicted cost with
  half or a third of its activations (+5.0 / +12.9 %); ResNet-50's least peak, at another op,
  is unchanged. Only where all three gradients are asked for (the out= form cannot leave one
  out) and on CPU (on CUDA the step runs cuDNN's BatchNorm: NOTE [cuDNN's BatchNorm]). The
  lowering marks the op as an in-place accumulation is marked (`Op.inplace_bytes`, NOTE
  [In-place accumulation] in solvers/problem.py); a variant run in its place (NOTE [BatchNorm
  from its output]) makes dx anew, so its workspace counts dx again (lower_variants.with_costs).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from monet_opt import cudnn_bn

BACKWARD = torch.ops.aten.native_batch_norm_backward.default
_OUT = torch.ops.aten.native_batch_norm_backward.out


def may_write(node: fx.Node) -> bool:
    """Whether `node` is a BatchNorm backward on CPU, run as ATen's kernel (not cuDNN's),
    asked for all three gradients: its dx may go into its dy (the caller checks that dy dies
    there, laid out as dx)."""
    vals = node.meta.get("val")
    return node.target is BACKWARD and len(node.args) == 10 and not node.kwargs and \
        list(node.args[9]) == [True, True, True] and isinstance(node.args[0], fx.Node) and \
        isinstance(vals, (tuple, list)) and isinstance(vals[0], torch.Tensor) and \
        vals[0].device.type == "cpu" and cudnn_bn.kernel(node) is BACKWARD


def backward_into(dy: torch.Tensor, *args):
    """native_batch_norm_backward(dy, *args) with dx written into dy."""
    weight = args[1]
    return _OUT(dy, *args, out0=dy, out1=torch.empty_like(weight),
                out2=torch.empty_like(weight))
