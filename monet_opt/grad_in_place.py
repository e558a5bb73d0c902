"""Backward ops writing their result into an input that dies there: BatchNorm's, elementwise ones.

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

NOTE [Elementwise backward ops in place]
  The same holds for every elementwise op of the backward with an out= form, and for softmax's
  and log-softmax's backwards along a dimension (each row's sum is taken before any of its
  elements is written): mul, div, sub, neg, and the backwards of tanh, sigmoid, GELU, SiLU,
  softmax and log-softmax. Where one of their inputs is a gradient the backward made that no
  later op reads (NOTE [In-place accumulation] in solvers/problem.py), laid out exactly as the
  result (dtype, shape, strides) and aliased by no other of its inputs, the op runs its out=
  form into it: the same kernel, each element read before it is written, so bitwise the
  functional op (tests/test_grad_in_place.py: each op, both arguments of the binary ones,
  float32/bfloat16/float64, NaN and -0.0). Where that input is a forward tensor the backward
  recomputed and reads here last, whether it dies there depends on the schedule: the op lists
  it as one it may take over (`Op.overwrites`, NOTE [Writing into a dying input] in
  solvers/simulate.py) and runs in place where the simulator says it dies. On CPU only, as
  above (untried on CUDA). A transformer's backward is mostly such ops (a tanh-approximated
  GELU's gradient alone is a chain of muls and adds, each making a tensor the size of the
  MLP's hidden layer), yet the demo's GPT-2's least peak (b4, 256 tokens) did not move
  measurably: 95.76-95.78 MiB in three runs, 95.76-96.75 before (one run 93.75), its clock-cut
  search varying more than this gains (docs/benchmarks/in_place_backward.md).

NOTE [Dropout's gradient in place]
  On CPU native_dropout_backward is ATen's composite grad * mask * scale: two multiplications,
  each rounding once, in that order (torch's profiler shows its two aten::mul). Its out= form
  only copies a result made anew, so the executor runs the two as `mul(grad, mask, out=dy)`
  then `mul_(scale)` into the dying dy: bitwise the op (tests/test_grad_in_place.py: float32,
  bfloat16, float64, NaN, infinities, -0.0), the result of the size of the dropped tensor
  not made. A transformer has one or three per layer (GPT-2: attention probabilities,
  attention output, MLP output). A dropout whose mask is kept as bits writes in place the
  same way (`dropout_bit_run_into` in monet_opt/variants_bits.py); replayed from the
  generator's state it makes dx anew, and its workspace counts it. CPU only, as above.
"""
from __future__ import annotations

import functools

import torch
import torch.fx as fx

from monet_opt import cudnn_bn

aten = torch.ops.aten


def dropout_backward_out(grad: torch.Tensor, mask: torch.Tensor, scale: float, *,
                         out: torch.Tensor) -> torch.Tensor:
    """native_dropout_backward into `out` (NOTE [Dropout's gradient in place])."""
    return torch.mul(grad, mask, out=out).mul_(scale)


BACKWARD = aten.native_batch_norm_backward.default
_OUT = aten.native_batch_norm_backward.out
# NOTE [Elementwise backward ops in place]: op -> (its out= form, the out argument's name, the
# arguments it may write into)
ELEMENTWISE = {
    aten.threshold_backward.default: (aten.threshold_backward.grad_input, "grad_input", (0,)),
    aten.hardtanh_backward.default: (aten.hardtanh_backward.grad_input, "grad_input", (0,)),
    aten.tanh_backward.default: (aten.tanh_backward.grad_input, "grad_input", (0,)),
    aten.sigmoid_backward.default: (aten.sigmoid_backward.grad_input, "grad_input", (0,)),
    aten.gelu_backward.default: (aten.gelu_backward.grad_input, "grad_input", (0,)),
    aten.silu_backward.default: (aten.silu_backward.grad_input, "grad_input", (0,)),
    aten._softmax_backward_data.default: (aten._softmax_backward_data.out, "grad_input", (0,)),
    aten._log_softmax_backward_data.default: (aten._log_softmax_backward_data.out, "out", (0,)),
    aten.mul.Tensor: (aten.mul.out, "out", (0, 1)),
    aten.div.Tensor: (aten.div.out, "out", (0, 1)),
    aten.sub.Tensor: (aten.sub.out, "out", (0, 1)),
    aten.neg.default: (aten.neg.out, "out", (0,)),
    aten.native_dropout_backward.default: (dropout_backward_out, "out", (0,)),
}
TARGETS = (BACKWARD, *ELEMENTWISE)


def may_write(node: fx.Node) -> tuple[int, ...]:
    """The arguments `node` may write its result into: dy (0) where it is a BatchNorm backward
    on CPU, run as ATen's kernel (not cuDNN's), asked for all three gradients; those of
    ELEMENTWISE on CPU; else none (the caller checks that the argument dies there, laid out as
    the result)."""
    vals = node.meta.get("val")
    dx = vals[0] if isinstance(vals, (tuple, list)) else vals
    if not isinstance(dx, torch.Tensor) or dx.device.type != "cpu":
        return ()
    if node.target in ELEMENTWISE:
        return ELEMENTWISE[node.target][2]
    return (0,) if node.target is BACKWARD and not node.kwargs and len(node.args) == 10 and \
        list(node.args[9]) == [True, True, True] and cudnn_bn.kernel(node) is BACKWARD else ()


def backward_into(dy: torch.Tensor, *args):
    """native_batch_norm_backward(dy, *args) with dx written into dy."""
    weight = args[1]
    return _OUT(dy, *args, out0=dy, out1=torch.empty_like(weight),
                out2=torch.empty_like(weight))


@functools.cache
def into(op, k: int):
    """What runs in the place of `op` writing its result into its argument `k` (NOTEs
    [BatchNorm's gradient in place], [Elementwise backward ops in place])."""
    if op is BACKWARD:
        return backward_into
    out_form, name, _ = ELEMENTWISE[op]

    def run(*args, **kwargs) -> torch.Tensor:
        return out_form(*args, **kwargs, **{name: args[k]})
    run.__name__ = run.__qualname__ = f"{out_form.__name__.split('.')[0]}_into_{k}"
    return run
