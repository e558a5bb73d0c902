"""Ops whose real output layout is not the one torch's tracer says.

NOTE [Layouts the tracer misreads]
  For a few CPU kernels torch's tracer says another output layout than the kernel makes:
  GroupNorm on a channels-last input (the kernel keeps channels-last, the trace says
  contiguous), BatchNorm1d on a transposed input (ckpt probe, 2026-12-06), copysign, xlogy
  and binary_cross_entropy with a transposed first operand,
  complex angle. Where the model then flattens or reshapes that output, the trace has a view
  where eager's reshape copied, and the real tensor cannot be viewed so: optimize() failed in
  the profiler with "view size is not compatible" and "please report the model" (a conv,
  channels-last, GroupNorm, flatten, Linear). torch.compile(backend="aot_eager") fails alike;
  inductor, which writes its own kernels, does not. The profiler runs every op on real tensors
  and notes each whose output is laid out otherwise than traced while its inputs are as traced
  (`Layouts`); where an op fails on an argument laid out otherwise than the trace says, it
  raises a CaptureError naming the nearest such op above it (not a transpose or add that only
  carried the layout on) and what to do: make that op's inputs contiguous
  (a `.contiguous()` of its output is traced as nothing, the tracer taking it for contiguous
  already); tests/test_grad_layout.py.

NOTE [Writing into a tensor laid out otherwise than traced]
  An op the lowering lets write its result into an argument (NOTEs [In-place accumulation] in
  solvers/problem.py, [Elementwise backward ops in place] in monet_opt/grad_in_place.py,
  [Writing into a dying input] in solvers/simulate.py) does so only where that argument is
  laid out as the result; the lowering reads both layouts from the trace. Below a misread op
  the real ones differ: after a channels-last GroupNorm and a ReLU, the trace has ReLU's
  backward contiguous like its incoming gradient, the kernel makes it channels-last (from
  ReLU's output), and its out= form, written into the contiguous gradient, was contiguous. The
  next ops then summed in another order: a layer scale's gradient 9.3e-10 off eager's, the
  weights drifting 2e-8 in five steps. The profiler runs every op for real and notes the real
  strides of each whose output is laid out otherwise than traced (`Layouts.relaid`); an op
  then writes into an argument only where the real layouts agree too (`as_laid_out`), and
  elsewhere makes its result anew as eager's is, a variant's workspace measured so too
  (NOTE [Workspace written into] in monet_opt/variant_probe.py: priced written into, a ReLU
  mask's run measured 4 B over its prediction); tests/test_grad_layout.py. Below the GroupNorm
  both are channels-last for most ops, and those still write in place.

NOTE [Strides along a dimension of 1]
  A tensor of shape (N, C, 1, 1) is both contiguous and channels-last whatever its strides
  along the 1s, but the kernels reading it are not indifferent: a convolution's or a
  BatchNorm's backward picks its memory format from those strides, and sums in another order.
  In a channels-last ShuffleNetV2 a stage at 1x1 has a depthwise convolution's input gradient
  with strides (C, 1, C, C) where the trace says (C, 1, 1, 1); the ReLU's backward before it,
  written into that gradient, kept them where eager's makes (C, 1, 1, 1) (from ReLU's output),
  and the first convolution's weight gradient came 1.5e-9 from eager's (153 of 170 gradients
  of the whole model off, up to 1.5e-3). So a real layout is noted as the trace's only where
  every stride agrees, and an op writes into an argument only where their real strides are
  equal, along dimensions of 1 too; whether an op misread (for the error above) still looks
  at dimensions longer than 1 only.
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from monet_opt.errors import CaptureError


class Layouts:
    """The ops whose real output is laid out otherwise than traced while each of their inputs
    is laid out as traced: those that misread (NOTE [Layouts the tracer misreads])."""

    def __init__(self) -> None:
        self.misread: set[str] = set()
        # {node: its real strides}, each laid out otherwise than traced, misread or not
        self.relaid: dict[str, tuple[int, ...]] = {}

    def check(self, node: fx.Node, env) -> None:
        """Record `node` (its value just computed into env) if it is laid out otherwise than
        traced, and if it misread."""
        value, traced = env.get(node.name), node.meta.get("val")
        if not (isinstance(value, torch.Tensor) and isinstance(traced, torch.Tensor) and
                value.shape == traced.shape and value.stride() != traced.stride()):
            return
        self.relaid[node.name] = tuple(value.stride())  # NOTE [Strides along a dimension of 1]
        if _differs(value, traced) and not any(_differs(env.get(a.name), a.meta.get("val"))
                                               for a in node.all_input_nodes):
            self.misread.add(node.name)

    def refuse(self, node: fx.Node, env, exc: Exception) -> None:
        """CaptureError where `node` failed on an argument whose real layout is not the
        trace's, naming the nearest op above it that misread; nothing otherwise."""
        if not any(_differs(env.get(a.name), a.meta.get("val")) for a in node.all_input_nodes):
            return
        maker, seen, todo = None, set(), list(node.all_input_nodes)
        while todo and maker is None:  # nearest first
            above = todo.pop(0)
            if above.name in self.misread:
                maker = above
            elif above not in seen:
                seen.add(above)
                todo += above.all_input_nodes
        if maker is None:
            return
        if maker.target is operator.getitem:  # one output of several: the op's
            maker = maker.args[0]
        real = next(env[a.name] for a in node.all_input_nodes
                    if _differs(env.get(a.name), a.meta.get("val")))
        traced = maker.meta.get("val")
        made = f"{maker.target} returned a tensor laid out otherwise than torch's tracer says" + (
            f" (shape {tuple(traced.shape)}, traced strides {tuple(traced.stride())})"
            if isinstance(traced, torch.Tensor) else "")
        where = (maker.meta.get("stack_trace") or "").strip().splitlines()[-2:]
        raise CaptureError(
            f"monet_opt.optimize: {made}, so {node.target}, traced for the tracer's layout, "
            f"cannot run on a tensor made from it (strides {tuple(real.stride())}: {exc}). "
            "Where torch's tracer misreads the op (GroupNorm on channels-last, BatchNorm1d "
            "on a transposed input, copysign, xlogy, complex angle), "
            "torch.compile(backend='aot_eager') fails alike; where that runs the model, please "
            "report it. Make that op's inputs contiguous before it (`x.contiguous()` before a "
            "GroupNorm of a channels-last model, `x.transpose(1, 2).contiguous()` into a "
            "BatchNorm1d; a "
            ".contiguous() after the op is no help: the tracer takes its output for contiguous "
            "already)" + (f"; the op: {' '.join(w.strip() for w in where)}" if where else "") +
            " (NOTE [Layouts the tracer misreads] in monet_opt/misread_layouts.py).") from exc


def _differs(real, traced) -> bool:
    """Both tensors of one shape, laid out otherwise along some dimension longer than 1."""
    return isinstance(real, torch.Tensor) and isinstance(traced, torch.Tensor) and \
        real.shape == traced.shape and not alike(real.shape, real.stride(), traced.stride())


def alike(shape, strides, others) -> bool:
    """Two tensors of `shape` laid out alike: the same stride along each dimension longer
    than 1."""
    return all(n <= 1 or a == b for n, a, b in zip(shape, strides, others))


def as_laid_out(lowered, joint: fx.GraphModule, relaid: dict[str, tuple[int, ...]]):
    """`lowered` (a Lowered) whose ops write into no argument laid out otherwise than their
    result, as the profiler found the layouts (`relaid`: {node: its real strides} where those
    are not the trace's; NOTE [Writing into a tensor laid out otherwise than traced]); the
    executor's in-place pairs follow the problem (`lower_variants.matching`)."""
    if not relaid:
        return lowered
    nodes = {n.name: n for n in joint.graph.nodes}

    def really_alike(a: str | None, b: str | None) -> bool:
        if a not in nodes or b not in nodes:
            return True  # not a tensor of the graph's: nothing the lowering compared
        real = [relaid.get(n) or tuple(nodes[n].meta["val"].stride()) for n in (a, b)]
        return real[0] == real[1]  # NOTE [Strides along a dimension of 1]
    into, tensor = dict(lowered.inplace), lowered.tensor_nodes
    ops = []
    for name, op in zip(lowered.op_nodes, lowered.problem.ops):
        if name in into and not really_alike(nodes[name].args[into[name]].name, name):
            op = dataclasses.replace(op, inplace_bytes=0)
        if op.overwrites and op.outputs:
            op = dataclasses.replace(op, overwrites=tuple(
                t for t in op.overwrites if really_alike(tensor[t], tensor[op.outputs[0]])))
        ops.append(op)
    return dataclasses.replace(lowered, problem=dataclasses.replace(lowered.problem,
                                                                    ops=tuple(ops)))
