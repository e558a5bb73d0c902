"""A warning where a backward runs through the model run itself in eval mode.

NOTE [Trained in eval mode, unplanned]
  In eval mode with other train/eval flags than its plan's (NOTE [Optimized in eval mode] in
  monet_opt/module.py) the optimized module runs the model itself: validation with gradients
  left on needs no plan, and tracing one there would cost a profile and a solve at the first
  validation batch. But a step trained so (fine-tuning after model.eval(), BatchNorm frozen and
  dropout off, with a plan made in train mode) ran with eager's memory, silently: a small CNN
  planned under 300,000 B measured 328,264 B (lifecycle probe, 2026-12-05). So the outputs'
  autograd nodes are watched (a hook run when a backward reaches one), and the first backward
  through them warns, once per optimized module, saying what to do.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from torch.utils import _pytree as pytree

_WARNED: weakref.WeakSet = weakref.WeakSet()  # the optimized modules that warned already


class UnplannedStepWarning(RuntimeWarning):
    """A backward ran through the model run itself, outside every plan, so the step's memory
    was eager's (NOTE [Trained in eval mode, unplanned])."""


def watched(outputs: Any, owner: torch.nn.Module) -> Any:
    """`outputs` (the model's, run itself in eval mode), their autograd nodes hooked to warn
    at the first backward through them, once for `owner`."""
    if owner in _WARNED:
        return outputs
    nodes = {t.grad_fn for t in pytree.tree_leaves(outputs)
             if isinstance(t, torch.Tensor) and t.grad_fn is not None}
    who = weakref.ref(owner)

    def warn(*_: Any) -> None:
        module = who()
        if module is None or module in _WARNED:
            return
        _WARNED.add(module)
        warnings.warn(UnplannedStepWarning(
            "monet_opt: a backward ran through the optimized module called in eval mode with "
            "other train/eval flags than its plan's, where it runs the model itself: that "
            "step's memory was eager's, not held to the limit. To train in eval mode "
            "(BatchNorm frozen, dropout off), call optimize() with the model so, in eval mode; "
            "to validate, run under torch.no_grad(). NOTE [Trained in eval mode, unplanned] in "
            "monet_opt/eval_steps.py."))

    for node in nodes:
        node.register_prehook(warn)
    return outputs
