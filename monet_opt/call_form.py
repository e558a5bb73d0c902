"""NOTE [Arguments passed as the sample's]
  A step is keyed by the structure of its arguments, which tells a tensor passed by position
  from one passed by keyword: after optimize(m, {"x": x, "mask": mask}), opt(x, mask=mask)
  planned the step again (3-19 s on a small MLP, with a ReplanWarning saying the inputs had
  changed), though the forward gets the same arguments (outputs probe, 2026-12-06). So a call
  whose arguments bind to the forward's parameters as the sample's did, the same names, is
  passed on in the sample's form: by position where the sample passed them so, by keyword in
  the sample's order. Not where the forward takes *args (which positions bind there is the
  forward's own business), nor where an argument binds to its **kwargs (HF's forwards take
  them), nor where the model has forward hooks or pre-hooks of its own, which see the call's
  form as the caller wrote it."""
from __future__ import annotations

import inspect

import torch.utils._pytree as pytree
from torch import nn


class CallForm:
    """How the sample passed its arguments: `positional` names, then `keywords` in order."""

    def __init__(self, model: nn.Module, treedef: pytree.TreeSpec) -> None:
        args, kwargs = pytree.tree_unflatten([None] * treedef.num_leaves, treedef)
        self.signature = _signature(model)
        self.keywords = tuple(kwargs)
        params = list(self.signature.parameters.values()) if self.signature else []
        self.positional = tuple(p.name for p in params[:len(args)])
        if len(self.positional) < len(args) or any(
                p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            self.signature = None  # *args: left as the caller wrote it

    def as_sample(self, model: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """(args, kwargs) in the sample's form where they bind to the same names; else as
        they are."""
        if self.signature is None or (len(args) == len(self.positional) and
                                      tuple(kwargs) == self.keywords):
            return args, kwargs
        if model._forward_hooks or model._forward_pre_hooks or _global_hooks():
            return args, kwargs
        try:
            bound = self.signature.bind(*args, **kwargs).arguments
        except TypeError:
            return args, kwargs  # the forward raises its own error
        if set(bound) != {*self.positional, *self.keywords}:
            return args, kwargs
        return tuple(bound[n] for n in self.positional), {k: bound[k] for k in self.keywords}


def _global_hooks() -> bool:
    """Whether hooks registered for every module see calls (register_module_forward_hook)."""
    m = nn.modules.module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks)


def _signature(model: nn.Module) -> inspect.Signature | None:
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or compiled forward
        return None
