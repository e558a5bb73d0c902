"""NOTE [Gradients made outside the step]
  Two gradients of the step's own tensors are made by autograd outside the planned backward,
  and were not counted: the step measured over its prediction and its limit, silently, though
  every gradient was eager's (eager holds them too).
  - An output that is, or views, a tensor of the step's that requires a gradient (`return y,
    self.log_var`, `return y, self.a.weight.t()`): the loss's gradient of it goes to that
    tensor's AccumulateGrad, not through the step, and becomes a dense `.grad` of the whole
    tensor (from an expanded `out.sum()` gradient too) before the step's backward runs (its
    view is made after the step's forward, so autograd runs it first). A 65,536 B weight so
    returned measured 63,488 B over the least plan's prediction.
  - One tensor passed as two of the step's tensors (a parameter given as an input too: weight
    tying done by the caller, `opt(idx, m.emb.weight)`): the backward returns a gradient for
    each, and autograd sums them into a third: 253,952 B over with a 262,144 B embedding.
  Each is counted as fixed memory, the tensor's storage once more: for the first, unless its
  gradient is in place at the start (NOTE [Gradients resident at the start]: it is added into
  the one there); for the second, once for each time the tensor is passed again. Where the
  loss never reads such an output, the plan holds that much room unused (a detached one,
  `return y, self.a.weight.detach()`, gets no gradient and is not counted: it was, 32,768 B of
  a 256 x 32 weight, until 2026-12-04).
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
import torch.fx as fx

from monet_opt.lower import is_view_node
from monet_opt.placeholders import primal_placeholders
from monet_opt.memory import allocated_bytes, dense_parts


def outside_bytes(joint: fx.GraphModule, num_fwd_outputs: int,
                  primals: Sequence[torch.Tensor], resident: Collection[int]) -> int:
    """The bytes of the gradients autograd makes outside the step (NOTE [Gradients made outside
    the step]): `primals` are the tensors the joint graph's primal placeholders stand for, in
    order; `resident` the positions among them whose gradients are in place at the start."""
    places = primal_placeholders(joint)
    position = {node: k for k, node in enumerate(places)}
    output = next(iter(joint.graph.find_nodes(op="output")))
    returned = set()
    for value in output.args[0][:num_fwd_outputs]:
        while isinstance(value, fx.Node) and is_view_node(value) and \
                value.target is not torch.ops.aten.detach.default:  # no gradient comes back
            value = value.args[0]
        k = position.get(value)
        if k is not None and k < len(primals) and primals[k].requires_grad and \
                k not in resident:
            returned.add(id(primals[k]))
    seen: set[int] = set()
    total = 0
    for t in primals:
        if t.requires_grad and (id(t) in returned or id(t) in seen):
            total += sum(allocated_bytes(p.untyped_storage().nbytes(), t.device)
                         for p in dense_parts(t))
            returned.discard(id(t))
        seen.add(id(t))
    return total
