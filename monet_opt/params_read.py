"""Parameters the forward reads other than from the modules that hold them (NOTE [Parameters read
through objects])."""
from __future__ import annotations

from operator import attrgetter
from typing import Sequence

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree

from monet_opt.errors import CaptureError

# NOTE [Parameters read through objects]
#   The step takes parameters from the modules that register them (functional_call swaps
#   each for the trace's own tensor). A forward that reads one through something else (a
#   helper object holding the embedding's weight for a tied head, `self.head =
#   TiedHead(self.embed.weight)`; a learned prior `torch.distributions.Normal(self.mu, 1.0)`
#   built in __init__) read the real parameter, which the trace held as a constant of the
#   step: no gradient reached it, silently (the embedding's gradient 4.8e-2 off eager's, a
#   prior's mean never trained; replans probe, 2026-12-07), and so did parameters outside the
#   model read through a module kept in a list or a plain processor object holding LoRA layers
#   (0 of 16 LoRA gradients; falsepos probe). The joint graph's constants are checked: one
#   that requires grad, or shares a storage with a tensor the step trains, is refused.
#   One that is a parameter of the model's own modules was read where the trace's swap did not
#   reach: a custom autograd.Function whose backward calls a submodule it was handed (a
#   reversible network, a recomputation written by hand) reads it while the backward is
#   traced. The advice to register its holder misled there (exotic ops probe, 2026-12-07):
#   a constant the forward's outputs are not computed from is said to be read by the
#   backward only, and that optimize() recomputes by itself.
_OWN = (
    "monet_opt.optimize: a parameter ({}) is read only by the backward, outside the forward "
    "as traced, as a custom autograd.Function does that calls a submodule in its "
    "backward (a reversible network, a recomputation written by hand): the trace holds it "
    "there as a constant, with no gradient. optimize() chooses what to recompute by itself: "
    "write the block's forward plainly (or with torch.utils.checkpoint, which it traces), "
    "without the custom Function (NOTE [Parameters read through objects] in "
    "monet_opt/params_read.py).")


def refuse_trained_constants(joint: fx.GraphModule, primals: Sequence[torch.Tensor],
                             num_fwd_outputs: int) -> None:
    """CaptureError where `joint` holds as a constant a tensor that requires grad (a parameter
    outside the model), or one that shares a storage with one of `primals` that does."""
    trained = {p.untyped_storage().data_ptr() for p in primals
               if p.requires_grad and p.layout == torch.strided and not isinstance(p, FakeTensor)}
    trained.discard(0)
    for node in joint.graph.find_nodes(op="get_attr"):
        value = attrgetter(node.target)(joint)
        if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor) or not (
                value.requires_grad or value.layout == torch.strided
                and value.untyped_storage().data_ptr() in trained):
            continue
        if value.requires_grad and node not in _forward(joint, num_fwd_outputs):
            raise CaptureError(_OWN.format(f"{value.dtype} {list(value.shape)}"))
        what = "a tensor that trains" if value.requires_grad else \
            "a tensor that shares a parameter's storage without its gradient (.detach(), .data)"
        raise CaptureError(
            f"monet_opt.optimize: the forward reads {what} ({value.dtype} "
            f"{list(value.shape)}) through an object that is not the model's module (a helper "
            "holding a tied weight, a torch.distributions object made in __init__ on a "
            "parameter, a module kept in a list or a plain processor object). The step takes "
            "parameters from the model's modules, so it would hold this one as a constant: "
            "no gradient for it, and a value the optimizer's writes may not reach. Read it "
            "from its module in the forward (self.embed.weight), register its holder as a "
            "submodule, or build the object in the forward (NOTE [Parameters read through "
            "objects] in monet_opt/params_read.py).")


def _forward(joint: fx.GraphModule, num_fwd_outputs: int) -> set[fx.Node]:
    """The joint graph's nodes the forward's outputs are computed from."""
    outputs = pytree.arg_tree_leaves(*joint.graph.output_node().args)[:num_fwd_outputs]
    found, todo = set(), [n for n in outputs if isinstance(n, fx.Node)]
    while todo:
        node = todo.pop()
        if node not in found:
            found.add(node)
            todo += node.all_input_nodes
    return found
