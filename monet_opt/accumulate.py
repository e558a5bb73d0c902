"""Add a step's new gradients into the gradients already in place, as soon as each is made.

NOTE [Accumulating in place]
  A step that begins with gradients in place (accumulating over micro-batches, or
  zero_grad(set_to_none=False)) holds them through the whole step (NOTE [Gradients resident at
  the start], below). Eager's AccumulateGrad adds each new gradient into the old
  one (`grad += new`) as soon as the engine hands it over, which for a leaf is right after it
  is made, and frees it. Our backward returns all its gradients at its end, so such a step held
  two sets of gradients there. For a step planned with gradients in place, the backward now
  makes that addition itself, right after each parameter's gradient is made, with the same
  `add_` eager runs (bitwise the same sum), and hands the engine a stride-0 -0.0 instead, which
  AccumulateGrad then adds: x + (-0.0) is x for every x (-0.0 included; +0.0 would turn -0.0
  into +0.0), so the gradient is left bitwise as eager leaves it, and the engine's own
  accumulation hooks (DDP's reducer) still run, after it.
  The backward adds in place only where eager's engine would have accumulated into that very
  tensor: the parameter still has a dense gradient of the new one's dtype, shape and device,
  has no tensor hooks (they must see the new gradient first), and the engine will run its
  AccumulateGrad (not so under torch.autograd.grad). Otherwise it returns the gradient as it
  was made, and that step holds what an unplanned one would.
  The plan knows which gradients are added in place (the derived problem, `in_place_problem`):
  they are no longer outputs held to the end, and the resident gradients are fixed memory.

NOTE [Gradients the engine does not take]
  Where the backward cannot add in place what its plan adds (NOTE [Accumulating in place]),
  the step held the new gradients to its end, over its plan and its limit, silently: a small
  CNN at a tight limit, gradients in place, measured 18,596 B over its prediction under
  torch.autograd.grad and under backward(inputs=[a subset]) (gradient probe, 2026-12-06).
  - backward(inputs=...) leaving a parameter out (or one frozen since the forward): the
    engine runs no AccumulateGrad for it and drops what the step hands it, so the step hands
    it the -0.0 stand-in at once and frees the gradient, as eager never makes it.
  - torch.autograd.grad: the engine will not say which leaves it hands back (it accumulates
    into none), and a gradient handed back must be the new one, so the step holds them, as
    eager does, and says so (AccumulationWarning, once per backward): the plan cannot know
    beforehand which way the backward will be called.
  - A parameter with a tensor hook (`p.register_hook`), which must see the new gradient first:
    one hooked when the step is planned is planned as holding it (no slot); one hooked since
    warns alike.

NOTE [Gradients resident at the start]
  A step that begins with gradients already in place (accumulating over micro-batches, or
  zero_grad(set_to_none=False)) holds them from its first op to its last. Planned as a
  step without them, it measured one whole set of gradients over its prediction and its
  limit (docs/benchmarks/replan.md). So such a step is planned apart (NOTE [New input
  shapes] in monet_opt/module.py): its backward adds each new gradient into the old one
  as soon as it is made, as eager does (NOTE [Accumulating in place], above), and the
  solver sees the derived problem: the gradients in place are fixed memory, the new ones
  they take in are not held to the end. Its plan shows them so: fixed bytes, predicted,
  least and store-all peaks include them.
"""
from __future__ import annotations

import dataclasses
import warnings
import weakref

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

import solvers
from monet_opt.errors import user_stacklevel
from monet_opt.lower import Lowered, is_view_node
from monet_opt.memory import resident_bytes
from monet_opt.units import format_bytes


class AccumulationWarning(RuntimeWarning):
    """A step planned to add its new gradients into those in place as they are made held them
    to its backward's end instead (torch.autograd.grad; a tensor hook registered since), more
    than its plan (NOTE [Gradients the engine does not take])."""


class GradientSlots:
    """The parameters whose gradients one planned step's backward adds in place, by their
    position among the parameters (`indices`); `params` is set to the step's parameters before
    each run. `zeros`: the -0.0 scalars it hands the engine instead, one per dtype and device,
    made here and held as long as the step (`zero_bytes` of them, which its plan counts)."""

    def __init__(self, indices: tuple[int, ...], params: list[torch.Tensor]) -> None:
        # a hooked parameter's hook must see the new gradient: NOTE [Gradients the engine ...]
        self.indices = tuple(k for k in indices if not params[k]._backward_hooks)
        self.said = -1  # the graph task last warned about
        self.params: tuple[torch.Tensor, ...] = ()
        with unset_fake_temporarily():  # planning runs inside the trace, on fake tensors
            self.zeros = {(p.dtype, p.device): torch.full((), -0.0, dtype=p.dtype,
                                                          device=p.device)
                          for p in (params[k] for k in self.indices)}
        self.zero_bytes = resident_bytes(self.zeros.values())
        self.id = id(self)
        _SLOTS[self.id] = self

    def bind(self, params: list[torch.Tensor]) -> None:
        self.params = tuple(params)


_SLOTS: weakref.WeakValueDictionary[int, GradientSlots] = weakref.WeakValueDictionary()


def accumulate_into(slots_id: int, k: int, grad: torch.Tensor) -> torch.Tensor:
    """NOTE [Accumulating in place]: grad added into parameter k's gradient, and -0.0 in its
    shape returned; or grad itself where eager would not accumulate into that tensor."""
    slots = _SLOTS.get(slots_id)
    param = _param(k, slots)
    if param is None or slots is None:
        return grad
    old = param.grad
    zero = slots.zeros.get((grad.dtype, grad.device))
    if zero is None or old is None or old.shape != grad.shape or old.dtype != grad.dtype or \
            old.device != grad.device or old.layout != torch.strided or \
            grad.layout != torch.strided:
        return grad
    runs = _engine_runs(param)
    if runs is False:  # nothing takes it: NOTE [Gradients the engine does not take]
        return zero.expand(grad.shape)
    if runs is None or param._backward_hooks:
        _say_held(slots, "torch.autograd.grad ran through it, which hands the new gradients "
                  "back" if runs is None else "a tensor hook was registered on a parameter "
                  "since, which must see its new gradient")
        return grad
    old.add_(grad)
    return zero.expand(grad.shape)


def _say_held(slots: GradientSlots, why: str) -> None:
    """AccumulationWarning, once per backward (NOTE [Gradients the engine does not take])."""
    task = torch._C._current_graph_task_id()
    if task == slots.said:
        return
    slots.said = task
    new = resident_bytes(p for p in map(lambda k: _param(k, slots), slots.indices)
                         if p is not None)
    warnings.warn(
        f"monet_opt: a step planned with gradients in place adds each new gradient into the "
        f"one in place as it is made, and could not here: {why}, so this backward holds them "
        f"to its end, up to {format_bytes(new)} more than its plan, and can pass its memory "
        "limit. Set the gradients to None before such a step (optimizer.zero_grad()) and it "
        "is planned holding them. NOTE [Gradients the engine does not take] in "
        "monet_opt/accumulate.py.", AccumulationWarning, stacklevel=user_stacklevel())


# NOTE [The parameter a backward adds into]
#   The backward adds parameter k's gradient into the parameter that call's forward was handed.
#   The node the engine runs (the step's CompiledFunctionBackward) has it: its k-th next edge is
#   that parameter's AccumulateGrad (parameters are the step's first inputs). The slots bound
#   at each forward are only a fallback where no node runs: bound per step, not per call, two
#   calls of one module in one backward (functional_call with other weights, then the module)
#   added each call's gradients into the other's, and a deep copy, whose compiled backward names
#   the original's slots, added its gradients into the original's (or, alone, into nothing,
#   one set of gradients over its plan).
def _param(k: int, slots: GradientSlots | None) -> torch.Tensor | None:
    """The leaf parameter k's gradient goes to in the running backward, or None."""
    node = torch._C._current_autograd_node()
    if node is None:
        return slots.params[k] if slots is not None and k < len(slots.params) else None
    edges = node.next_functions
    accumulate = edges[k][0] if k < len(edges) else None
    return getattr(accumulate, "variable", None)


def _engine_runs(param: torch.Tensor) -> bool | None:
    """Whether this backward runs the parameter's AccumulateGrad; None under
    torch.autograd.grad, where the engine refuses to say for a leaf (it accumulates into none,
    and may hand the gradient back). A parameter frozen after the forward
    (requires_grad_(False) before the backward) gets no gradient in eager (its AccumulateGrad
    returns at once), and has no gradient edge to ask about."""
    if not param.requires_grad:
        return False
    node = torch.autograd.graph.get_gradient_edge(param).node
    try:
        return bool(torch._C._will_engine_execute_node(node))
    except RuntimeError:  # "... we are currently running autograd.grad()"
        return None


def add_accumulation(bw: fx.GraphModule, slots: GradientSlots) -> None:
    """The backward graph `bw` (outputs: one gradient per primal, parameters first) adds each
    slot's gradient in place right after it is made (NOTE [Accumulating in place]). A gradient
    returned as a view (a linear weight's `t`) is viewed right after its storage is made: the
    executor re-creates views where they are read, here at the end. The views left there are
    dead; the caller (rewrite.partition) drops dead code and recompiles."""
    output = bw.graph.output_node()
    outs = list(output.args[0])
    for k in slots.indices:
        if not isinstance(outs[k], fx.Node):
            continue
        grad = _viewed_early(bw.graph, outs[k])
        with bw.graph.inserting_after(grad):
            outs[k] = bw.graph.call_function(accumulate_into, (slots.id, k, grad))
        # its value only: the rewrite's tag on the op (the argument it writes into) is the
        # op's; copied here, this call was rewritten as the op (an internal error)
        if "val" in grad.meta:
            outs[k].meta["val"] = grad.meta["val"]
    output.args = (tuple(outs), *output.args[1:])


def _viewed_early(graph: fx.Graph, grad: fx.Node) -> fx.Node:
    """`grad`, or where it is a chain of views of a storage made earlier, a copy of that chain
    right after the storage's producer."""
    chain = []
    node = grad
    while is_view_node(node) and isinstance(node.args[0], fx.Node) and \
            not any(isinstance(a, fx.Node) for a in (*node.args[1:], *node.kwargs.values())):
        chain.append(node)
        node = node.args[0]
    copies: dict[fx.Node, fx.Node] = {}
    last = node
    for view in reversed(chain):
        with graph.inserting_after(last):
            last = graph.node_copy(view, lambda n: copies.get(n, n))
        copies[view] = last
    return last


def in_place_problem(problem: solvers.Problem, lowered: Lowered, num_fwd_outputs: int,
                     slots: GradientSlots | None, resident_bytes: int) -> solvers.Problem:
    """`problem` as a step that begins with `resident_bytes` of gradients in place sees it,
    when the backward adds the gradients of `slots` in place: those, and the slots' -0.0
    scalars, are fixed memory, and the new gradients they take in are not held to the end
    (unless another output shares their storage)."""
    indices = slots.indices if slots is not None else ()
    outputs = lowered.output_tensors[num_fwd_outputs:]
    added = {t for k in indices if k < len(outputs) for t in outputs[k]}
    kept = {t for k, ts in enumerate(outputs) if k not in indices for t in ts}
    extra = resident_bytes + (slots.zero_bytes if slots is not None else 0)
    return dataclasses.replace(
        problem, fixed_bytes=problem.fixed_bytes + extra,
        backward_outputs=tuple(t for t in problem.backward_outputs
                               if t not in added or t in kept))
