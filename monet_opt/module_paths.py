"""NOTE [Module paths of ops]
  Plan.explain()'s source column named each op by its ATen overload alone ("convolution.default"
  for every convolution): lower._label adds the module the op ran in from the node's module
  stack, which AOTAutograd's joint graph carried only where torch.export or Dynamo had set it
  (none of ResNet-18's 213 labels had one; UX probe, 2026-12-06). While a step is traced, the
  model's modules now note where the forward is (a global forward pre-hook and an always-called
  forward hook, removed after the trace) in the meta fx copies into each node it makes, and
  AOTAutograd copies a forward node's onto the backward nodes of the same autograd node:
  "convolution_backward.default in layer1.0.conv1". The hooks run Python only (no tensor op),
  so the traced graph is the same; modules outside the model are not noted.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.fx.traceback as fx_traceback
from torch import nn
from torch.nn.modules.module import (register_module_forward_hook,
                                     register_module_forward_pre_hook)

META = "nn_module_stack"  # the key fx copies from current_meta (lower._label reads it)


@contextlib.contextmanager
def noted(model: nn.Module) -> Iterator[None]:
    """While open, nodes traced inside `model`'s modules carry their module paths."""
    names = {id(m): name for name, m in model.named_modules()}
    stack: list[tuple[int, str, type]] = []

    def note() -> None:
        if fx_traceback.has_preserved_node_meta():
            fx_traceback.current_meta[META] = {f"L{k}": (path, kind)
                                               for k, (_, path, kind) in enumerate(stack)}

    def enter(module, args) -> None:
        if id(module) in names:
            stack.append((id(module), names[id(module)], type(module)))
            note()

    def leave(module, args, output) -> None:
        if stack and stack[-1][0] == id(module):
            stack.pop()
            note()

    before = fx_traceback.current_meta.get(META)
    handles = (register_module_forward_pre_hook(enter),
               register_module_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        if before is None:
            fx_traceback.current_meta.pop(META, None)
        else:
            fx_traceback.current_meta[META] = before
