"""Warnings where the optimized module runs the model itself: a backward through it in eval
mode, and a call with cumulative BatchNorm averages.

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
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils import _pytree as pytree

from monet_opt.errors import user_stacklevel

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


# NOTE [Cumulative averages, unplanned]
#   A BatchNorm with momentum=None keeps a cumulative average, whose factor 1 / num_batches_tracked
#   its forward reads as a Python number: a traced step cannot hold it, and optimize() refuses
#   it, saying to give it a momentum. But PyTorch Lightning's StochasticWeightAveraging sets it
#   itself after training, for an epoch of forwards in train mode with gradients on and no
#   backward that recomputes the statistics of the averaged weights: every such model then
#   failed at that epoch (CaptureError, "Give it a momentum"), where eager ran (Lightning
#   probe, 2026-12-07). A call after optimize() that finds one, set so since, runs the model
#   itself, as in eval mode, with an UnplannedStepWarning, once per optimized module (one so at
#   optimize(), planned in eval mode, is still refused in training): nothing is kept for a
#   backward that does not come, and one that does runs with eager's memory. When the
#   momentum is back, the plan runs again. (torch.optim.swa_utils.update_bn runs under
#   no_grad, which needs no plan.)
class RunItself(Exception):
    """Raised where a call cannot be planned and runs the model itself."""


def cumulative_norms(model: torch.nn.Module, training_only: bool = True) -> list[str]:
    """The BatchNorm layers (in training, unless `training_only` is false) that keep a
    cumulative average (momentum None)."""
    return [name or "(the model)" for name, m in model.named_modules()
            if isinstance(m, _BatchNorm) and (m.training or not training_only)
            and m.momentum is None and m.track_running_stats]


def cumulative(outputs: Any, owner: torch.nn.Module) -> Any:
    """`outputs` (the model's, run itself), warning once for `owner`."""
    if owner not in _CUMULATIVE:
        _CUMULATIVE.add(owner)
        names = cumulative_norms(owner.model)
        warnings.warn(UnplannedStepWarning(
            f"monet_opt: BatchNorm {', '.join(map(repr, names[:3]))}"
            f"{f' and {len(names) - 3} more' if len(names) > 3 else ''} keep a cumulative "
            "average (momentum=None, as Lightning's StochasticWeightAveraging sets to update "
            "them), which a traced step cannot hold, so the optimized module runs the model "
            "itself while they do: a backward through such a call has eager's memory, not "
            "the limit's. The plan runs again once they have a momentum. NOTE [Cumulative "
            "averages, unplanned] in monet_opt/eval_steps.py."), stacklevel=user_stacklevel())
    return outputs


_CUMULATIVE: weakref.WeakSet = weakref.WeakSet()
