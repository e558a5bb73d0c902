"""Dropout's backward scaled as eager's scales it (a rewrite of the joint graph).

NOTE [Dropout's scale]
  On the CPU eager's dropout is not the fused `native_dropout` (ATen takes that only on CUDA,
  XPU and backends' own devices: `is_fused_kernel_acceptable` in Dropout.cpp) but its composite:
  noise drawn with `bernoulli_(1 - p)` in the input's dtype, divided in place by 1 - p and
  multiplied into the input; autograd's backward multiplies the gradient by that noise. The
  trace records `native_dropout` instead (PyTorch's Python decomposition of dropout). Its
  forward is eager's bitwise on the CPU (float16, bfloat16, float32, float64 at p = 0.1, 0.3,
  0.37, 0.5: checked), but its backward multiplies by 1 / (1 - p) as the double it is, where
  eager multiplies by the noise, 1 / (1 - p) rounded to the input's dtype. In float32 and
  float64 these are one number; in bfloat16 1.1111 is 1.109375, so under CPU autocast the traced
  step's gradients were not eager's (GPT-2 with dropout 0.1 after its residual projections:
  up to 4 apart). Each CPU `native_dropout_backward` is given here the scale eager's noise
  holds, computed as eager computes it, and the step's gradients are eager's bitwise
  (tests/test_autocast.py).

NOTE [Dropout backward's layout]
  The trace works out `native_dropout_backward`'s output layout from PyTorch's decomposition,
  which follows the gradient's memory format ("mimicking CUDA kernel's behavior": contiguous for
  any 3-D gradient), while the CPU kernel computes grad * mask * scale with TensorIterator's
  layout, the gradient's own strides. Where the gradient is permuted (a norm_first
  nn.TransformerEncoder followed by a batch_first nn.MultiheadAttention, which transposes its
  input: the encoder's last dropout gets a transposed gradient), the graph then reads the
  kernel's output as if contiguous: a `view` that the real strides do not allow, and
  optimize() failed (CaptureError, from the profiler). So where the CPU kernel's layout
  (TensorIterator's, worked out on the trace's fake values) is not the one the trace assumed,
  the op's value is recorded as the kernel makes it and a copy into the assumed layout follows
  it: what eager does too (its backward of the view is a reshape, which copies a permuted
  gradient), its values the same (tests/test_dropout_layout.py). Only there: where nothing
  reads it by its strides (a view, through views of it) and it is not handed back as a
  gradient, it goes on as the kernel lays it out, as under eager and aot_eager. The copy made
  everywhere changed the order of later sums: a Conformer's convolution module (1x1 Conv1d,
  dropout, transpose) had its bias gradient reduced over the copy where eager reduces over
  the transposed gradient, 9.2e-5 off eager's (audio probe, 2026-12-07).
"""
from __future__ import annotations

import contextlib
import functools
import operator

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import unset_fake_temporarily

aten = torch.ops.aten
FUSED_DEVICES = ("cuda", "xpu", "lazy", "privateuseone")  # where eager runs native_dropout


def eager_scale(p: float, dtype: torch.dtype) -> float:
    """The value of eager's kept noise: one, divided in place by 1 - p, in `dtype`."""
    with unset_fake_temporarily():  # called while AOTAutograd traces
        return torch.ones((), dtype=dtype).div_(1 - p).item()


def round_dropout_scales(gm: fx.GraphModule) -> int:
    """NOTE [Dropout's scale], in place (and NOTEs [Dropout of everything], [Noise in the
    input's memory order]); returns how many backward ops it changed."""
    _drop_everything(gm)
    _noise_in_memory_order(gm)
    changed = 0
    backward = aten.native_dropout_backward.default
    for node in gm.graph.find_nodes(op="call_function", target=backward):
        grad, mask, scale = node.args
        drop = mask.args[0] if isinstance(mask, fx.Node) and mask.target is operator.getitem \
            else None
        if drop is None or drop.target is not aten.native_dropout.default:
            continue
        val = drop.args[0].meta.get("val")  # the input: eager's noise has its dtype
        p = float(drop.args[1])
        if val is None or val.device.type in FUSED_DEVICES or not 0 < p < 1:
            continue
        rounded = eager_scale(p, val.dtype)
        if rounded != scale:
            node.args = (grad, mask, rounded)
            changed += 1
    if changed:
        gm.recompile()
    return changed


def match_kernel_layouts(gm: fx.GraphModule) -> int:
    """NOTE [Dropout backward's layout], in place; returns how many copies it added."""
    added = 0
    backward = aten.native_dropout_backward.default
    for node in gm.graph.find_nodes(op="call_function", target=backward):
        grad, mask, scale = node.args
        val = node.meta.get("val")
        if not all(isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)
                   for a in (grad, mask)) or val is None or val.device.type in FUSED_DEVICES:
            continue
        g, m = grad.meta["val"], mask.meta["val"]
        with detect_fake_mode((g, m)):
            kernel = aten.mul.Tensor(aten.mul.Tensor(g, m), scale)  # as the CPU kernel does
        if kernel.stride() == val.stride() or kernel.shape != val.shape:
            continue
        if not _read_as_laid_out(node):  # NOTE [Dropout backward's layout]: as aot_eager runs
            node.meta["val"] = kernel
            continue
        formats = (torch.contiguous_format, torch.channels_last, torch.channels_last_3d)
        fmt = next((f for f in formats if val.is_contiguous(memory_format=f)), None)
        if fmt is None:
            continue
        with gm.graph.inserting_after(node):
            copy = gm.graph.call_function(aten.clone.default, (node,), {"memory_format": fmt})
        node.replace_all_uses_with(copy, delete_user_cb=lambda user: user is not copy)
        copy.meta = dict(node.meta)
        node.meta["val"] = kernel
        added += 1
    if added:
        gm.recompile()
    return added


_BY_STRIDES = (aten.view.default, aten._unsafe_view.default, aten.as_strided.default)


def _read_as_laid_out(node: fx.Node) -> bool:
    """Whether what reads `node` needs the layout the trace assumed: a view by strides reached
    through views of it, or the graph's output (a gradient handed back as laid out)."""
    todo, seen = list(node.users), set()
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op != "call_function" or user.target in _BY_STRIDES:
            return True
        schema = getattr(user.target, "_schema", None)
        if schema is not None and any(r.alias_info is not None for r in schema.returns):
            todo += user.users  # a view of it (a transpose): what reads that reads it
    return False


# NOTE [Dropout of everything]
#   Eager's dropout at p = 1 draws nothing: it multiplies its input by a zero (ATen's
#   `_dropout`, on every device: the fused kernel takes 0 < p < 1 only). The trace records
#   `native_dropout(x, 1.0, True)`, whose kernel draws a mask all the same, so every random op
#   after it drew other numbers than eager's (a Dropout(0.5) after a Dropout(1.0): gradients
#   0.12 apart; torch.compile's aot_eager the same; layer zoo, 2026-12-02). Its output is
#   made here as eager makes it, and its mask as the all-False one it is, without a draw.
def _drop_everything(gm: fx.GraphModule) -> None:
    graph, changed = gm.graph, False
    for drop in list(graph.find_nodes(op="call_function", target=aten.native_dropout.default)):
        x, p, train = (*drop.args, *drop.kwargs.values())[:3]
        if float(p) != 1.0 or not train:
            continue
        with graph.inserting_after(drop):
            mask = graph.call_function(aten.zeros_like.default, (x,), {"dtype": torch.bool})
            out = graph.call_function(aten.mul.Tensor, (x, 0.0))
        for use in list(drop.users):
            if use.target is operator.getitem:
                use.replace_all_uses_with(out if use.args[1] == 0 else mask)
                graph.erase_node(use)
        for node, val in ((mask, drop.meta.get("val", (None, None))[1]),
                          (out, drop.meta.get("val", (None, None))[0])):
            node.meta.update({k: v for k, v in drop.meta.items() if k != "val"}, val=val)
        if not drop.users:
            graph.erase_node(drop)
        changed = True
    if changed:
        gm.recompile()


# NOTE [Noise in the input's memory order]
#   An in-place dropout (nn.Dropout(inplace=True), F.dropout(x, inplace=True)) is ATen's
#   composite on every device: noise = empty_like(x).bernoulli_(1 - p), which keeps x's strides
#   and draws in its memory order. The trace records it as bernoulli.p(empty_like(x), 1 - p),
#   whose kernel makes its result contiguous and draws in that order: where x is permuted (a
#   channels-last activation, a transposed one) the step's mask put the same draws on other
#   elements (a channels-last CNN's loss 0.58 for eager's 0.49, silently; torch.compile's
#   aot_eager alike). So such a draw is made into a flat tensor, laid over x's empty_like as
#   x really lies in memory at the step (`eager_noise`) and copied contiguous, as the graph
#   holds it: the same draws on the same elements as eager's. An `empty_like(x).bernoulli_(p)`
#   of the model's own is traced alike and drawn so too (eager draws it in x's memory order).
#   Only where the device's kernel draws so: on Intel CPUs ATen's bernoulli_ takes MKL's
#   generator, drawing into a contiguous buffer copied into x (x's logical order, the trace's
#   own), so the kernel is asked once per device, on tensors of its own, with a generator of
#   its own. Not told apart: the functional `empty_like(x).bernoulli(p)`, traced as the in-place
#   one, is drawn in x's memory order too where eager draws it in its logical order (rare:
#   found 2026-12-02 by review).
def _noise_in_memory_order(gm: fx.GraphModule) -> None:
    graph, changed = gm.graph, False
    for node in list(graph.find_nodes(op="call_function", target=aten.bernoulli.p)):
        like = node.args[0]
        val = like.meta.get("val") if isinstance(like, fx.Node) else None
        if like.target is not aten.empty_like.default or not isinstance(val, torch.Tensor) or \
                val.is_contiguous() or not _dense(val) or not _draws_in_memory_order(
                    str(val.device)):
            continue
        with graph.inserting_before(node):
            flat = graph.call_function(aten.empty.memory_format, ([val.numel()],),
                                       {"dtype": val.dtype, "device": val.device})
        with graph.inserting_after(node):
            made = graph.call_function(eager_noise, (node, like))
        node.replace_all_uses_with(made, delete_user_cb=lambda user: user is not made)
        node.args = (flat, *node.args[1:])
        with detect_fake_mode((val,)) or contextlib.nullcontext():
            drawn = aten.empty.memory_format([val.numel()], dtype=val.dtype, device=val.device)
            flat.meta["val"], made.meta = drawn, dict(node.meta)
            node.meta = {**node.meta, "val": aten.bernoulli.p(drawn, *node.args[1:])}
        changed = True
    if changed:
        gm.recompile()


def eager_noise(drawn: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The draws `drawn` (1-D, in the order drawn) where bernoulli_ puts them into `like` (an
    empty_like of the dropout's input, laid out as the input really is, which the tracer may
    misread: a BatchNorm of a transposed input is contiguous on CPU where the trace says
    transposed, and drawing by the trace's layout put eager's draws elsewhere, found by a
    fuzz), made contiguous as the graph holds the noise."""
    return drawn.as_strided(like.shape, like.stride()).contiguous()


@functools.cache
def _draws_in_memory_order(device: str) -> bool:
    """Whether bernoulli_ on a transposed tensor of `device` draws in its memory order (and
    not in its logical order, as a contiguous one)."""
    with unset_fake_temporarily():
        gen = torch.Generator(device=device)
        x = torch.empty(33, 64, device=device).t()
        gen.manual_seed(0)
        drawn = torch.empty_like(x).bernoulli_(0.5, generator=gen)
        gen.manual_seed(0)
        in_memory = torch.empty(33, 64, device=device).bernoulli_(0.5, generator=gen).t()
        return torch.equal(drawn, in_memory)


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill its storage span without gaps or overlaps."""
    sizes = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1)
    expected = 1
    for st, n in sizes:
        if st != expected:
            return False
        expected *= n
    return True
