"""Module attributes a trace left behind, set back as they were (NOTE [Tensors kept boxed];
NOTE [Containers filled] and NOTE [Traced tensors left] in monet_opt/forward_state.py)."""
from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils import _pytree as pytree


# NOTE [Tensors kept boxed]
#   A forward that keeps a tuple of tensors on a module (PyG's GCNConv(cached=True):
#   `if self._cached is None: self._cached = (edge_index, weight)`) kept the trace's value-less
#   tensors there: the next trace read them ("Unexpected fake buffer"), optimize() failed
#   saying the model fails eagerly too, and it did then, the user's model broken until the
#   attribute was reset by hand (GNN probe, 2026-12-07). Only a tensor assigned as it is was
#   set back. A tuple, list or dict (nested) holding a traced tensor, newly assigned, is set
#   back after each traced call too, with a SideEffectWarning; the step computes what the
#   forward computed while tracing, the branch that fills the cache, so it trains like eager
#   (tests/test_set_back.py).
TRACED = (FakeTensor, FunctionalTensor)


def holds_traced(value: Any) -> bool:
    """A tensor of the trace, or a tuple, list or dict (nested) holding one."""
    return isinstance(value, TRACED) or isinstance(value, (tuple, list, dict)) and any(
        isinstance(leaf, TRACED) for leaf in pytree.tree_leaves(value))


def equal_values(a: Any, b: Any) -> bool:
    """Plain values (no tensors) equal, as a failed trace may leave an equal copy of a list a
    module holds (torchvision's DefaultBoxGenerator's aspect_ratios: a SideEffectWarning said
    the forward changed it, detection probe, 2026-12-07); it is put back, unsaid."""
    if type(a) is not type(b) or any(isinstance(leaf, torch.Tensor)
                                     for leaf in pytree.tree_leaves((a, b))):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value that cannot say
        return False


def set_back(model: torch.nn.Module, keys, before: dict[tuple[str, str], Any]) -> None:
    """Each (module name, attribute) of `keys`, a plain attribute (in the module's __dict__),
    set back to what `before` says it held, or deleted where it held nothing. In the __dict__
    itself: setattr registered a Parameter held as a plain attribute (object.__setattr__) as
    a parameter of the module, and the step then took its parameters in another order
    (falsepos probe, 2026-12-07)."""
    for key in keys:
        held = vars(model.get_submodule(key[0]))
        if key in before:
            held[key[1]] = before[key]
        else:
            held.pop(key[1], None)


# NOTE [Gradients a trace left]
#   A custom autograd.Function whose backward runs `torch.autograd.backward` into a submodule's
#   parameters (a reversible network) set their `.grad` to the trace's tensors while
#   optimize() traced the backward; optimize() failed, and the model's next eager backward
#   raised "Attempting to use FunctionalTensor on its own" (exotic ops probe, 2026-12-07).
#   Each parameter's gradient is put back after every trace, traced or not.
def grads_of(model: torch.nn.Module) -> list[tuple[torch.Tensor, Any]]:
    """(parameter, its .grad) for each of the model's parameters."""
    return [(p, p.grad) for p in model.parameters()]


def put_back_grads(held: list[tuple[torch.Tensor, Any]]) -> None:
    """NOTE [Gradients a trace left]: each gradient that holds a traced tensor now, as it was."""
    for p, grad in held:
        if p.grad is not grad and isinstance(p.grad, TRACED):
            p.grad = grad
