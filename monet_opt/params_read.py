"""Parameters the forward reads other than from the modules that hold them (NOTE [Parameters read
through objects])."""
from __future__ import annotations

from operator import attrgetter
from typing import Sequence

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

from monet_opt.errors import CaptureError

# NOTE [Parameters read through objects]
#   The step takes parameters from the modules that register them (functional_call swaps
#   each for the trace's own tensor). A forward that reads one through something else (a
#   helper object holding the embedding's weight for a tied head, `self.head =
#   TiedHead(self.embed.weight)`; a learned prior `torch.distributions.Normal(self.mu, 1.0)`
#   built in __init__) read the real parameter, which the trace held as a constant of the
#   step: no gradient reached it, silently (the embedding's gradient 4.8e-2 off eager's, a
#   prior's mean never trained; replans probe, 2026-12-07). The joint graph's constants are
#   checked against the tensors that train, and one found is refused, naming the line.


def refuse_trained_constants(joint: fx.GraphModule, primals: Sequence[torch.Tensor]) -> None:
    """CaptureError where `joint` holds as a constant a tensor that shares a storage with one
    of `primals` that requires grad."""
    trained = {p.untyped_storage().data_ptr() for p in primals
               if p.requires_grad and p.layout == torch.strided and not isinstance(p, FakeTensor)}
    trained.discard(0)
    for node in joint.graph.find_nodes(op="get_attr"):
        value = attrgetter(node.target)(joint)
        if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor) or \
                value.layout != torch.strided or \
                value.untyped_storage().data_ptr() not in trained:
            continue
        raise CaptureError(
            f"monet_opt.optimize: the forward reads a tensor that trains ({value.dtype} "
            f"{list(value.shape)}: a parameter, or a view of one) through an object that is "
            "not a module (a helper holding a tied weight, a torch.distributions object made "
            "in __init__ on a parameter). The step takes parameters from the modules that "
            "register them, so it would hold this one as a constant and give it no gradient. "
            "Read it from its module in the forward (self.embed.weight), make its holder an "
            "nn.Module, or build the object in the forward (NOTE [Parameters read through "
            "objects] in monet_opt/params_read.py).")
