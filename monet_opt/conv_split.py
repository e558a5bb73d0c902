"""Split each convolution's backward into its weight step and its input step.

NOTE [Conv backward split]
  `convolution_backward(grad, input, weight, ..., output_mask)` makes the input's, the weight's
  and the bias's gradients in one call, so the input it reads (the forward activation) lives
  until all three exist, beside the new input gradient of the same size. Split in two, the
  weight-and-bias step reads the input and runs first; the input step reads the input only
  for its shape. Once the `conv.shape_only` variant (monet_opt.variants) is chosen for the
  input step, the activation can be freed between the two: the backward's memory at that
  convolution drops by the activation's size, which matters wherever the activation has no
  later reader (a ReLU's output whose own backward reads a bit mask instead).

  Both steps are ATen's own op with a narrower mask, so the gradients are bitwise eager's.
  The split is made only when the solver is offered `conv.shape_only`, the one variant that
  makes it pay, and only on devices in SPLIT_DEVICES: where the combined call makes the same
  separate calls inside (cuDNN), the split costs a dispatch; on CPU, oneDNN's combined
  backward is faster than its two halves (ResNet-50 b16 128x128, profiled: 537 ms combined,
  589-598 ms split, +10 %), and bought little there: with every variant and nothing
  recomputed, the input steps' shape-only inputs lowered that model's peak by 1.4 of 559 MiB.
  What the split costs where it is made is measured: the profiler times each step. Nor does
  the shape-only input save memory on CPU: oneDNN's input step copies the one-element stand-in
  to a dense input first, scratch the allocator's events see (NOTE [Allocation events] in
  monet_opt/alloc_events.py): 32 KiB for a 4x8x16x16 input, what dropping it saved.

  Measured on an H100 (torch 2.11, docs/benchmarks/gpu/README.md): on ResNet-50 b184 224x224
  the halves took 35.4 ms where the combined calls took 31.5 ms (+12 %, cuDNN's default
  algorithms), not the dispatch assumed above. Under cudnn.benchmark the narrower call may get
  another algorithm: at b2 64x64, 16 input steps with a shape-only input did not reproduce the
  combined call's result bitwise, and the profiler withdrew those variants.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx as fx

from monet_opt.errors import internal_assert

aten = torch.ops.aten
SPLIT_WITH = "conv.shape_only"  # the variant family that makes the split pay
SPLIT_DEVICES = frozenset({"cuda"})  # where it costs about nothing (NOTE [Conv backward split])


def split_conv_backward(gm: fx.GraphModule) -> int:
    """Split, in place, every convolution_backward of `gm` that wants both the input's and the
    weight's gradient; returns how many were split."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.target is not aten.convolution_backward.default:
            continue
        mask = list(node.args[10])
        if not (mask[0] and mask[1]):
            continue
        val = node.meta.get("val")
        with gm.graph.inserting_before(node):
            weight_step = _narrowed(gm.graph, node, [False, True, mask[2]],
                                    None if val is None else (None, val[1], val[2]))
            input_step = _narrowed(gm.graph, node, [True, False, False],
                                   None if val is None else (val[0], None, None))
        for user in list(node.users):
            internal_assert(user.target is operator.getitem,
                            f"convolution_backward read by {user.format_node()}")
            user.args = (input_step if user.args[1] == 0 else weight_step, user.args[1])
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
    return count


def _narrowed(graph: fx.Graph, node: fx.Node, mask: list[bool], val) -> fx.Node:
    new = graph.call_function(node.target, (*node.args[:10], mask), dict(node.kwargs))
    new.meta.update(node.meta)
    new.meta["val"] = val
    return new


# NOTE [A weight gradient made unasked]
#   On the CPU, a convolution_backward asked for the bias's gradient and not the weight's (a
#   frozen weight with a trainable bias, as BitFit trains) makes the weight's gradient all the
#   same and returns it, where the trace's kernel returns None: the step allocated the
#   weight's bytes beyond its plan (147,456 B over the limit for a 64x64x3x3 convolution;
#   variants hunt, 2026-12-02). It goes as the call returns, so it is the op's workspace.
#   Taken from the allocation events (NOTE [Workspace] in monet_opt/memory.py), the op's
#   workspace counted it as an output and left it out: the profiler drops the outputs the
#   trace has as None inside the call it measures (`as_traced`), which then count as scratch,
#   as in the step (a frozen 16x16x3x3 weight's step measured its 9,216 B over its plan).
def unasked_weight_bytes(node: fx.Node) -> int:
    """The bytes of the weight gradient `node` makes without being asked (NOTE above)."""
    if node.target is not aten.convolution_backward.default:
        return 0
    mask, weight = node.args[-1], node.args[2].meta.get("val")
    if not isinstance(weight, torch.Tensor) or weight.device.type != "cpu" or mask[1] \
            or not mask[2]:
        return 0
    return weight.numel() * weight.element_size()


def as_traced(node: fx.Node, fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` (`node`'s op) returning None where the trace's value is None: what it makes there
    is its workspace (NOTE [A weight gradient made unasked])."""
    val = node.meta.get("val")
    if not isinstance(val, (tuple, list)) or all(v is not None for v in val):
        return fn

    def run():
        out = fn()
        if not isinstance(out, (tuple, list)) or len(out) != len(val):
            return out
        return tuple(None if v is None else o for o, v in zip(out, val))
    return run
