"""Backward ops writing their result into an input that dies there: elementwise ones, and
those scattering a gradient into zeros.

NOTE [BatchNorm's gradient in place]
  native_batch_norm_backward reads dy, the gradient of its output, and makes dx, the gradient
  of its input, of the same size. Where dy died there, the executor ran the op's out= form
  with dx written into dy's storage (34e1e53), and the plan counted one activation-sized
  tensor less while it ran (GoogLeNet, b32, 128², CPU: least peak 152.6 -> 143.5 MiB). That
  out= form is ATen's generated one (`autogen` in native_functions.yaml): it makes dx anew and
  copies it into dy, below the dispatcher, so the live-bytes counter saw nothing made while
  torch.profiler's allocation events saw the whole dx (96 MiB on a 32x96x64x64 BatchNorm,
  as the functional op): the saving was the counter's, not the process's (found 2026-12-02;
  a MobileNetV2 plan at its least peak: 54,272 B over its limit by allocation events, at it
  without). So a BatchNorm's backward makes its dx anew again. ReLU's and ReLU6's backwards
  (threshold_backward, hardtanh_backward) are elementwise structured kernels whose out= form
  writes into dy itself (allocation events show no result made: tests/test_grad_in_place.py
  checks every form the executor writes into so); a ReLU whose 1-bit or bool mask is in use
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

NOTE [Scattered gradients in place]
  The backward of an index_select, a gather or an index (x[:, idx]) makes zeros of the input's
  size and adds the gradient into them: eager's autograd in place (zeros.index_add_), the
  traced step as functional ops (new_zeros, then index_add, scatter_add or index_put with
  accumulate=True), each making a second tensor of the input's size while the zeros are still
  held. So store-all peaked above eager: a residual block adding h.index_select(1, idx) to h,
  132,104 B against eager's 115,984 (vision blocks probe, 2026-12-06), and no schedule peaked
  lower. Where the zeros die there, as they do, the op runs into them as above: index_add's
  and scatter_add's out= forms are structured kernels that write there (no allocation of the
  result: tests/test_grad_in_place.py), index_put's is ATen's generated copy, so it runs as
  index_put_, the kernel the functional op runs on its copy; bitwise the functional op.
"""
from __future__ import annotations

import functools

import torch
import torch.fx as fx

aten = torch.ops.aten


def dropout_backward_out(grad: torch.Tensor, mask: torch.Tensor, scale: float, *,
                         out: torch.Tensor) -> torch.Tensor:
    """native_dropout_backward into `out` (NOTE [Dropout's gradient in place])."""
    return torch.mul(grad, mask, out=out).mul_(scale)


def index_put_out(x: torch.Tensor, indices, values: torch.Tensor, accumulate: bool = False, *,
                  out: torch.Tensor) -> torch.Tensor:
    """index_put into `out`, which is `x` (NOTE [Scattered gradients in place])."""
    return aten.index_put_.default(out, indices, values, accumulate)


# NOTEs [Elementwise backward ops in place], [Scattered gradients in place]: op -> (its out=
# form, the out argument's name, the arguments it may write into)
OUT_FORMS = {
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
    aten.index_add.default: (aten.index_add.out, "out", (0,)),
    aten.scatter_add.default: (aten.scatter_add.out, "out", (0,)),
    aten.index_put.default: (index_put_out, "out", (0,)),
}
TARGETS = tuple(OUT_FORMS)


def may_write(node: fx.Node) -> tuple[int, ...]:
    """The arguments `node` may write its result into: those of OUT_FORMS, on CPU; else none
    (the caller checks that the argument dies there, laid out as the result)."""
    vals = node.meta.get("val")
    dx = vals[0] if isinstance(vals, (tuple, list)) else vals
    if not isinstance(dx, torch.Tensor) or dx.device.type != "cpu":
        return ()
    return OUT_FORMS[node.target][2] if node.target in OUT_FORMS else ()


@functools.cache
def into(op, k: int):
    """What runs in the place of `op` writing its result into its argument `k` (NOTE
    [Elementwise backward ops in place])."""
    out_form, name, _ = OUT_FORMS[op]

    def run(*args, **kwargs) -> torch.Tensor:
        return out_form(*args, **kwargs, **{name: args[k]})
    run.__name__ = run.__qualname__ = f"{out_form.__name__.split('.')[0]}_into_{k}"
    return run
