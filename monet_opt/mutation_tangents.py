"""NOTE [Gradients of parameters updated in place]
  A forward that updates a parameter in place under no_grad (Embedding(max_norm=...) renorms
  the rows it looks up; a weight clamped) is traced functionally: AOTAutograd returns the new
  value as an output of the step, copies it into the parameter, and gives the backward a
  gradient for that output (a tangent), which it adds into the parameter's gradient. Nothing
  can hand that output a gradient (a leaf that requires grad is written in place under no_grad
  only), so autograd made a zero tensor of the parameter's size for it at every backward, and
  the addition another: an Embedding(200, 32, max_norm=1.0) step held 25,600 B more than
  eager's at its peak, in the backward, at every limit (model probe, 2026-12-06). Now the
  addition is dropped where its tangent is a leaf's that requires grad (the gradient is the
  other operand, as eager's is: +0.0 + -0.0 was +0.0 where eager keeps -0.0), and the step's
  backward node makes no zeros for outputs handed no gradient (`no_zeros`); its backward
  makes them itself where it reads them (`materialize`: an output the loss does not read), at
  its start, as autograd did before it ran, so the plan's memory is what it was for those.
  The copy AOTAutograd makes of the parameter to update (its functional form) remains: that
  step's forward still holds two more copies of the parameter than eager's.
  Such a tangent, read by nothing once its addition is dropped, is never made (autograd hands
  None, and nothing materializes it), so the problem gives it no bytes: it was counted from
  the backward's start, and a step whose table a tied output projection also reads (its peak
  in the backward) predicted 886,156 B where it measured 834,956, one table over (recommender
  probe, 2026-12-07).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from monet_opt.placeholders import primal_placeholders

_ADD = torch.ops.aten.add.Tensor
UNSEEDED = "monet_opt.unseeded"  # an addition unseeded.apply made conditional
NEVER_HANDED = "monet_opt.never_handed"  # a tangent's meta: autograd hands it None, always


def drop(joint: fx.GraphModule, primals: Sequence[torch.Tensor]) -> int:
    """Drop the additions of a parameter's update's tangent into its gradient (NOTE
    [Gradients of parameters updated in place]); `primals` are the tensors the joint's primal
    placeholders stand for. Returns how many."""
    places = primal_placeholders(joint)
    position = {n.meta["desc"]: k for k, n in enumerate(places) if "desc" in n.meta}
    dropped = 0
    for tangent in joint.graph.find_nodes(op="placeholder"):
        mutated = getattr(getattr(tangent.meta.get("desc"), "output", None), "mutated_input", None)
        k = position.get(mutated) if mutated is not None else None
        if k is None or k >= len(primals) or not (primals[k].is_leaf and
                                                   primals[k].requires_grad):
            continue
        adds = list(tangent.users)
        if not adds or not all(map(plain_add, adds)):
            continue
        for add in adds:
            add.replace_all_uses_with(add.args[1] if add.args[0] is tangent else add.args[0])
            joint.graph.erase_node(add)
            dropped += 1
        tangent.meta[NEVER_HANDED] = True
    if dropped:
        joint.recompile()
    return dropped


def plain_add(node: fx.Node) -> bool:
    """An addition of two tensors, its result shaped and typed as each."""
    if node.target is not _ADD or node.kwargs or len(node.args) != 2:
        return False
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in (*node.args, node)]
    return all(isinstance(v, torch.Tensor) and v.shape == vals[2].shape and
               v.dtype == vals[2].dtype for v in vals)


def materialize(bw: fx.GraphModule) -> None:
    """Each tangent `bw` reads is made zeros at its start where autograd hands it None (NOTE
    [Gradients of parameters updated in place]). Before the graph is recompiled."""
    places = list(bw.graph.find_nodes(op="placeholder"))
    for tangent in [n for n in places if n.name.startswith("tangents") and any(
            UNSEEDED not in u.meta for u in n.users)]:
        val = tangent.meta["val"]
        with bw.graph.inserting_after(places[-1]):
            made = bw.graph.call_function(present, (tangent, tuple(val.shape), tuple(
                val.stride()), val.dtype, val.device))
        made.meta = dict(tangent.meta)
        tangent.replace_all_uses_with(made, delete_user_cb=lambda user: user is not made and
                                      UNSEEDED not in user.meta)


def present(tangent: torch.Tensor | None, shape: tuple[int, ...], stride: tuple[int, ...],
            dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`tangent`, or where autograd handed none, zeros laid out as traced."""
    if tangent is not None:
        return tangent
    return torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_()


def no_zeros(node) -> None:
    """The step's backward node (step_node's; None: nothing) hands None for outputs given no
    gradient, which its backward makes itself where it reads them (`materialize`)."""
    if node is not None:
        node.set_materialize_grads(False)
