"""NOTE [Outputs beside the loss]
  A step that returns its loss beside other outputs (HF's `opt(**batch, labels=y)` returns the
  loss and the logits, nanoGPT's `logits, loss = model(x, y)`) is trained by backpropagating
  the loss alone: autograd hands the step no gradient for the logits. The backward was traced
  for a gradient of every output, which it adds into what the loss's backward makes for that
  output, and was planned with those gradients alive from its start; handed none, it made
  zeros in their place (NOTE [Gradients of parameters updated in place]), so every plan held
  one logits-sized tensor more than eager does: a Llama of vocabulary 32,000 (b2, 64 tokens)
  reached 62.79 MiB at its least where the loss alone reached 47.16 MiB, and "60% of peak"
  was refused (LLM probe, 2026-12-06).
  So where the step returns a scalar that requires a gradient (a loss), each other output's
  gradient that the backward only adds into another (`presumed`), or casts and then adds (the
  float32 outputs accelerate's mixed precision returns, cast back to bfloat16), is planned as
  handed none: it and its casts cost nothing (`free`), a cast of None is None, and each of
  its additions (`apply`) hands on the other operand as it is where it is None, as eager's
  backward never adds it. Where such an output is handed
  a gradient after all (`(out.loss + out.logits.mean()).backward()`), the addition is made as
  traced, so gradients stay exact, and an OutputGradientWarning says that this step can peak
  over its plan by that gradient's bytes; a step whose outputs are all taken through the loss
  (no scalar among them, or the loss computed inside it: WithLoss) is planned as before.

NOTE [A sum is a tensor of its own]
  Where the addition makes a new tensor (the other operand lives on: GPT-2's residual
  stream's gradient, read by each branch), the plan holds its result as a tensor of its own,
  which a later backward op may write into in place where it dies (NOTE [Elementwise backward
  ops in place] in monet_opt/grad_in_place.py). Handing on the operand itself there let such
  a write reach the operand still read elsewhere: GPT-2 given output_hidden_states=True had 14
  of 28 gradients wrong (up to 0.097), silently (second probe of this change, 2026-12-06). So
  only an addition the plan runs in place (into the operand, which dies there) hands it on
  itself; any other hands on a copy, as the plan counted, laid out as the sum was traced
  (a transposed operand's copy was viewed as the contiguous sum by the next op: "view size
  is not compatible", third probe). Two such gradients added to each other (`return loss,
  h, h.clone()`), and a cast of one that an addition is planned to write into (`return loss,
  h.to(torch.bfloat16)` where h's gradient is a sum: the plan then held the sum in the cast's
  0 bytes, refused as an invalid problem), are planned as before.
"""
from __future__ import annotations

import dataclasses
import warnings

import torch
import torch.fx as fx

import solvers
from monet_opt.errors import internal_assert, user_stacklevel
from monet_opt.mutation_tangents import UNSEEDED, plain_add
from monet_opt.output_grad import OutputGradientWarning


_CASTS = (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)
_ADDS = (torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor)  # add_: planned in place


def presumed(joint: fx.GraphModule, inplace: tuple[tuple[str, int], ...] = ()
             ) -> frozenset[str]:
    """The tangents of `joint` planned as handed no gradient, and the casts of them: where one
    tangent is a scalar's (a loss's), every other one read only by additions of two tensors of
    its own size, or by casts read so (accelerate's float32 outputs: NOTE [Outputs accelerate
    makes float32] in monet_opt/outputs_fp32.py), but not where an addition is planned in
    place into such a cast (`inplace`: Lowered.inplace, (addition, the argument written))."""
    tangents = [n for n in joint.graph.find_nodes(op="placeholder")
                if n.name.startswith("tangents")]
    if not any(_scalar(n) for n in tangents):
        return frozenset()
    names: set[str] = set()
    written = {(name, k) for name, k in inplace}
    for tangent in tangents:
        chain = _added(tangent, written)
        if not _scalar(tangent) and chain is not None:
            names.update(n.name for n in chain)
    return frozenset(names)


def _added(node: fx.Node, written: set[tuple[str, int]]) -> list[fx.Node] | None:
    """`node` and the casts of it on its way, where every way leads to an addition that does
    not write into it; else None."""
    found = [node]
    for user in node.users:
        if plain_add(user) and sum(map(_from_tangent, user.args)) == 1 and \
                (user.name, user.args.index(node)) not in written:  # not t1 + t2
            continue
        cast = user.target in _CASTS and len(user.args) == 1 and \
            set(user.kwargs) <= {"dtype", "layout", "device", "memory_format"}
        more = _added(user, written) if cast else None
        if more is None:
            return None
        found += more
    return found if node.users else None


def free(problem: solvers.Problem, names: frozenset[str]) -> solvers.Problem:
    """`problem` with the tangents named `names` costing nothing."""
    if not names:
        return problem
    return dataclasses.replace(problem, tensors=tuple(
        dataclasses.replace(t, bytes=0) if t.name in names else t for t in problem.tensors))


def apply(bw: fx.GraphModule, names: frozenset[str]) -> None:
    """Each addition of a tangent named `names` (or of its cast) in the backward graph `bw` (in
    place or not) hands on its other operand where the tangent is None. Before the graph is
    recompiled."""
    for tangent in bw.graph.find_nodes(op="placeholder"):
        if tangent.name in names:
            _conditional(tangent)


def _conditional(node: fx.Node) -> None:
    """Make each user of `node` (a tangent, or a cast of one) pass None on, or hand on an
    addition's other operand, where `node` is None."""
    for user in list(node.users):
        if user.target in _CASTS:
            user.args, user.target = (user.target, *user.args), cast_present
            _conditional(user)
        else:
            internal_assert(user.target in _ADDS, f"{user.format_node()} reads a gradient "
                            "planned as handed none, and is not an addition")
            k, val = user.args.index(node), user.meta["val"]
            user.args = (user.target, k, tuple(val.stride()), *user.args)
            user.target = plus_present
        user.meta[UNSEEDED] = True


def _from_tangent(node) -> bool:
    """Whether `node` is a tangent, or casts of one."""
    while isinstance(node, fx.Node) and node.target in _CASTS:
        node = node.args[0]
    return isinstance(node, fx.Node) and node.op == "placeholder" and \
        node.name.startswith("tangents")


def cast_present(target, x: torch.Tensor | None, **kwargs) -> torch.Tensor | None:
    """`target(x, **kwargs)`, or None where `x` (a tangent) is None."""
    return None if x is None else target(x, **kwargs)


def plus_present(target, k: int, stride: tuple[int, ...], *args: torch.Tensor | None
                 ) -> torch.Tensor:
    """`target(*args)`, or where argument `k` (a tangent) is None, the other operand: itself
    where the addition writes into it (in place, it dies there), else a copy laid out as the
    sum was traced, `stride` (NOTE [A sum is a tensor of its own])."""
    if args[k] is None:
        other = args[1 - k]
        if target is torch.ops.aten.add_.Tensor and k == 1:
            return other
        return torch.empty_strided(other.shape, stride, dtype=other.dtype,
                                   device=other.device).copy_(other)
    warnings.warn(OutputGradientWarning(
        f"monet_opt: an output returned beside the loss was handed a {args[k].nbytes:,} B "
        "gradient; the plan had it handed none (the loss backpropagated alone), so this step "
        "can peak over its prediction by that much. Gradients are exact. To have it planned, "
        "return no loss beside the outputs taken through the backward, or compute the whole "
        "loss inside the module (monet_opt.WithLoss). NOTE [Outputs beside the loss] in "
        "monet_opt/unseeded.py."), stacklevel=user_stacklevel())
    return target(*args)


def _scalar(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 0

