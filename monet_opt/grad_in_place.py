"""A BatchNorm's, ReLU's or ReLU6's backward writing its input's gradient into its output's.

NOTE [BatchNorm's gradient in place]
  native_batch_norm_backward reads dy, the gradient of its output, and makes dx, the gradient
  of its input, of the same size. Where dy dies there (the backward made it for this op alone:
  a ReLU's backward, usually), the executor runs the op's out= form with dx written into dy's
  storage. ATen's CPU kernels take their per-channel sums over dy first and then make each dx
  element from the dy element it replaces, so dx is bitwise the functional op's (checked over
  NCHW and channels-last, 2 to 5 dimensions, float32, float64 and bfloat16, training and eval:
  tests/test_grad_in_place.py). The step then holds one activation-sized tensor less while each such
  op runs: GoogLeNet (b32, 128², CPU, the kept problem) reaches a least peak of 143.5 MiB where
  it reached 152.6 (its activations there 96.0 -> 86.9 MiB), at the same predicted cost with
  half or a third of its activations (+5.0 / +12.9 %); ResNet-50's least peak, at another op,
  is unchanged. Only where all three gradients are asked for (the out= form cannot leave one
  out) and on CPU (on CUDA the step runs cuDNN's BatchNorm: NOTE [cuDNN's BatchNorm]). The
  lowering marks the op as an in-place accumulation is marked (`Op.inplace_bytes`, NOTE
  [In-place accumulation] in solvers/problem.py); a variant run in its place (NOTE [BatchNorm
  from its output]) makes dx anew, so its workspace counts dx again (lower_variants.with_costs).
  ReLU's and ReLU6's backwards (threshold_backward, hardtanh_backward) are elementwise and take
  dy as dx the same way (their grad_input= form); a ReLU whose 1-bit or bool mask is in use
  writes into dy too (NOTE [A ReLU's mask and its gradient in place] in
  monet_opt/variants_bits.py). MobileNetV2 (b32, 128², CPU) peaked least at a ReLU6's
  backward: 172.74 -> 136.52 MiB, the plan measured at its prediction, bitwise eager's.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from monet_opt import cudnn_bn

aten = torch.ops.aten
BACKWARD = aten.native_batch_norm_backward.default
_OUT = aten.native_batch_norm_backward.out
# elementwise backwards (ReLU's, ReLU6's) whose out= form may take dy as dx
_ELEMENTWISE = {aten.threshold_backward.default: aten.threshold_backward.grad_input,
                aten.hardtanh_backward.default: aten.hardtanh_backward.grad_input}


def may_write(node: fx.Node) -> bool:
    """Whether `node` is a BatchNorm backward on CPU, run as ATen's kernel (not cuDNN's),
    asked for all three gradients, or a ReLU's or ReLU6's backward on CPU: its dx may go into
    its dy (the caller checks that dy dies there, laid out as dx)."""
    vals = node.meta.get("val")
    dx = vals[0] if isinstance(vals, (tuple, list)) else vals
    if not isinstance(node.args[0], fx.Node) or node.kwargs or \
            not isinstance(dx, torch.Tensor) or dx.device.type != "cpu":
        return False
    if node.target in _ELEMENTWISE:
        return True
    return node.target is BACKWARD and len(node.args) == 10 and \
        list(node.args[9]) == [True, True, True] and cudnn_bn.kernel(node) is BACKWARD


def backward_into(dy: torch.Tensor, *args):
    """native_batch_norm_backward(dy, *args) with dx written into dy."""
    weight = args[1]
    return _OUT(dy, *args, out0=dy, out1=torch.empty_like(weight),
                out2=torch.empty_like(weight))


def _elementwise_into(out_form):
    """out_form(dy, *args) with dx written into dy (ReLU's or ReLU6's backward)."""
    def into(dy: torch.Tensor, *args) -> torch.Tensor:
        return out_form(dy, *args, grad_input=dy)
    into.__name__ = into.__qualname__ = f"{out_form.__name__.split('.')[0]}_into"
    return into


# what runs in each such op's place (NOTE [BatchNorm's gradient in place])
INTO = {BACKWARD: backward_into,
        **{op: _elementwise_into(out_form) for op, out_form in _ELEMENTWISE.items()}}
