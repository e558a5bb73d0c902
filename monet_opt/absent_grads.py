"""NOTE [Outputs the loss does not read]
  Where the loss reads only some of the step's outputs (a two-headed model trained on one head,
  an auxiliary head left out), eager's backward never reaches what only the others depend on:
  those parameters' gradients stay None, and AdamW skips them (no weight decay, no moments).
  The step's backward is one autograd node, which autograd hands zeros for the outputs the loss
  did not read, and which returned a gradient for every parameter: the unread head's came back
  as zeros, so AdamW decayed it (1.25e-4 after one step) and kept state for it where eager
  keeps none. torch.compile does the same.
  So each forward hooks its backward node, to note which outputs it is handed no gradient for
  (`prehook`: a node's pre-hook sees None there, before autograd makes the zeros), and the
  backward graph returns None for each gradient that depends only on those outputs'
  gradients (`gate`: which outputs a tangent stands for, AOTAutograd's descriptors say; which
  tangents a gradient depends on, the graph; one that depends on every output's is left as it
  is: its node runs only where some output is handed a gradient). What is computed is
  unchanged: the plan's memory and time are as before.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

_KEY = "monet_opt.absent"  # in the backward node's metadata: the outputs handed no gradient
_NODE = "CompiledFunctionBackward"


def prehook(node) -> None:
    """Hook the step's backward node (step_node's; None: nothing) to note the outputs it is
    handed no gradient for."""
    if node is not None:
        node.register_prehook(_noting(node.metadata))


def step_node(returned: Sequence[torch.Tensor]):
    """The step's backward node, found from its `returned` tensors (or views of them); None
    where no returned tensor has one."""
    for t in returned:
        fn = t.grad_fn
        if fn is None:
            continue
        for node in (fn, *(f for f, _ in fn.next_functions if f is not None)):
            if node.name() == _NODE:
                return node
    return None


def _noting(metadata: dict):
    def note(grad_outputs):
        metadata[_KEY] = frozenset(k for k, g in enumerate(grad_outputs) if g is None)
    return note


def gate(bw: fx.GraphModule, joint: fx.GraphModule, num_fwd_outputs: int) -> None:
    """Make each gradient `bw` returns None where every tangent it depends on stands for an
    output its node was handed no gradient for. Without AOTAutograd's descriptors, nothing."""
    position = tangent_positions(bw, joint, num_fwd_outputs)
    if not position:
        return
    depends: dict[fx.Node, frozenset[int]] = {}
    for node in bw.graph.nodes:
        if node.op == "placeholder":
            depends[node] = frozenset([position[node]]) if node in position else frozenset()
        elif node.op != "output":
            depends[node] = frozenset().union(*(depends[n] for n in node.all_input_nodes))
    output = bw.graph.output_node()
    grads, every = list(output.args[0]), frozenset(position.values())
    for k, grad in enumerate(grads):  # one on every output's: reached, some is handed one
        if isinstance(grad, fx.Node) and depends.get(grad) and depends[grad] != every:
            with bw.graph.inserting_before(output):
                grads[k] = bw.graph.call_function(unless_absent, (grad, tuple(sorted(
                    depends[grad])), k))
                grads[k].meta = dict(grad.meta)
    output.args = (tuple(grads),)


def tangent_positions(bw: fx.GraphModule, joint: fx.GraphModule,
                      num_fwd_outputs: int) -> dict[fx.Node, int]:
    """Each tangent placeholder of `bw` -> the position among the step's forward outputs of
    the output it is the gradient of, as AOTAutograd's descriptors say (none without them)."""
    descs = joint.graph.output_node().meta.get("desc")
    if not descs:
        return {}
    outputs = list(descs[:num_fwd_outputs])
    position: dict[fx.Node, int] = {}
    for node in bw.graph.find_nodes(op="placeholder"):
        desc = getattr(node.meta.get("desc"), "output", None)
        if node.name.startswith("tangents") and desc in outputs:
            position[node] = outputs.index(desc)
    return position


def unless_absent(grad: torch.Tensor, outputs: tuple[int, ...],
                  k: int) -> torch.Tensor | None:
    """`grad` (the k-th the backward returns), or None where the running backward node was
    handed no gradient for any of `outputs` (positions among the step's forward outputs); the
    post-accumulate-grad hooks of the parameter it goes to are held back for this backward
    (NOTE [Hooks of a parameter handed nothing])."""
    node = torch._C._current_autograd_node()
    absent = None if node is None else node.metadata.get(_KEY)
    if absent and all(j in absent for j in outputs):
        edges = node.next_functions
        leaf = getattr(edges[k][0], "variable", None) if k < len(edges) else None
        hooks = getattr(leaf, "_post_accumulate_grad_hooks", None)
        if hooks:
            _HELD.append((hooks, list(hooks.items())))
            hooks.clear()
            torch.autograd.Variable._execution_engine.queue_callback(put_back_hooks)
        return None
    return grad


_HELD: list[tuple[dict, list]] = []  # NOTE [Hooks of a parameter handed nothing]


def put_back_hooks() -> None:
    """The post-accumulate-grad hooks held back, put back: as the backward ends, and as the
    next step is made (a backward that raised ran no final callback)."""
    while _HELD:
        hooks, held = _HELD.pop()
        hooks.update(held)


# NOTE [Hooks of a parameter handed nothing]
#   The engine runs a parameter's AccumulateGrad even where the step hands it no gradient, and
#   so its post-accumulate-grad hooks, which eager never runs for a parameter the loss does not
#   reach. Such a parameter was handed zeros, so that a hook reading p.grad met a tensor: an
#   optimizer stepped in the backward (PyTorch's "optimizer in backward" recipe) then stepped
#   an unread head on zeros, its momentum moving it (0.9 off eager's after three steps; Adam's
#   step counts apart; optimizer probe, 2026-12-07). Now it is handed None as any other, and
#   its hooks are taken off for the backward that hands it nothing (put back as the backward
#   ends, by the engine's final callback, or where that backward raised, as the next step is
#   made), so they run where eager's run, and only there. Not
#   seen: the same parameter reached in that backward by another path outside the step (a
#   weight tied to one outside it), whose hooks then do not run this once.
