"""NOTE [What the export route leaves out]
  torch.export traces the forward alone. A module's backward hooks and the hooks the forward
  registers on tensors run in eager's backward, not in the exported graph, so a step traced
  through torch.export (the last route, NOTE [The capture route] in monet_opt/capture.py)
  leaves them out, silently: a model whose full backward hook halves a Linear's input gradient,
  with another hook that logs `gout[0].norm().item()` (a value no trace can read, so the other
  routes fail there), trained with gradients twice eager's; a forward that registers
  `h.register_hook(...)` reading `.item()` likewise. So that route is not taken where the model
  has backward hooks or its forward registers a hook on a tensor: its line in the CaptureError
  says what it would leave out, beside the other routes' failures, which name the line to
  change (the `.item()` in the hook). And a model is sent straight to that route, on a later
  optimize(), only where that model itself went there: it was remembered by class, so after
  one nn.Sequential had gone through torch.export, every later nn.Sequential did, leaving out
  their hooks, and reading their tensor attributes as constants (NOTE [Tensors held as
  attributes] in monet_opt/attribute_tensors.py): outputs 0.36 from eager's after one was
  assigned anew.
"""
from __future__ import annotations

import traceback
import weakref

import torch
from torch import nn

from monet_opt import capture_hints, hooks

_BACKWARD = ("_backward_pre_hooks", "_backward_hooks",
             "_global_backward_pre_hooks", "_global_backward_hooks")
_EXPORTED: weakref.WeakSet = weakref.WeakSet()  # the models that went through torch.export


def known(model: nn.Module, by_class: dict[type, str]) -> str | None:
    """The route that traced `model` before: torch.export's where `model` itself went there,
    else the one its class went through (`by_class`), if any."""
    return "export" if model in _EXPORTED else by_class.get(type(model))


def remember(model: nn.Module, route: str, by_class: dict[type, str]) -> None:
    """Note that `route` traced `model`: torch.export's for the model, others for its class."""
    if route == "export":
        _EXPORTED.add(model)
    else:
        by_class[type(model)] = route


class LeftOut(Exception):
    """The export route would leave out what the step needs (NOTE [What the export route
    leaves out])."""


def refuse_backward_hooks(model: nn.Module) -> None:
    """LeftOut where `model` has backward hooks, on its modules or global."""
    found = tuple(h for h in hooks.hooks_of(list(model.modules())) if h[1] in _BACKWARD)
    if found:
        raise LeftOut(f"not taken: its step would leave out the backward hooks at "
                      f"{hooks.where(model, found)}, which torch.export does not trace")


class TensorHooksRefused:
    """Around torch.export: LeftOut after it, where the forward registered a hook on a
    tensor (named by the line that did)."""

    def __enter__(self) -> None:
        self.registered: list[str] = []
        self.register = register = torch.Tensor.register_hook

        def noting(tensor: torch.Tensor, hook):
            frames = [f for f in traceback.extract_stack()[:-1] if capture_hints.users(f)]
            self.registered.append(f"{frames[-1].filename}:{frames[-1].lineno}" if frames
                                   else "?")
            return register(tensor, hook)

        torch.Tensor.register_hook = noting

    def __exit__(self, *exc) -> None:
        torch.Tensor.register_hook = self.register
        if self.registered and exc[0] is None:
            raise LeftOut(f"not taken: its step would leave out the hook the forward registers "
                          f"on a tensor at {self.registered[0]}, which torch.export does not "
                          "trace")
