"""NOTE [Backward under autocast]
  Eager PyTorch runs a backward called inside a `torch.autocast` block under that autocast:
  the backward's matrix products are cast again, a dropout's gradient through attention is
  rounded otherwise (a 2-layer BERT under CPU bfloat16 with attention dropout: 25 of its
  gradients 1e-6 to 5e-6 from those of the same step with backward called outside; without
  attention dropout, bitwise). PyTorch advises against it ("Backward passes under autocast are
  not recommended"; its AMP recipe calls backward outside). The step's backward is traced with
  autocast off (NOTE [Autocast is traced] in monet_opt/capture.py) and AOTAutograd runs it
  with autocast off, as torch.compile does: it trains bitwise like eager's backward called
  outside the block, wherever it is called. So where the caller's backward runs under
  autocast, it says so (AutocastBackwardWarning), once per call site as warnings go: the
  gradients may differ from eager's called there by rounding.
"""
from __future__ import annotations

import warnings

import torch

from monet_opt.errors import user_stacklevel


class AutocastBackwardWarning(RuntimeWarning):
    """The optimized module's backward ran inside torch.autocast, where eager's would have
    cast its ops again (NOTE [Backward under autocast])."""


def prehook(node) -> None:
    """Hook the step's backward node (None: nothing) to warn where it runs under autocast."""
    if node is not None:
        node.register_prehook(_check)


def _check(grad_outputs) -> None:
    if torch._C._is_any_autocast_enabled():
        warnings.warn(
            "monet_opt: backward ran inside a torch.autocast block. Eager PyTorch would run "
            "its backward's ops under that autocast too (PyTorch advises against it); the "
            "optimized module's backward runs as eager's does when called outside the block, "
            "so its gradients may differ from eager's called here by rounding. Call "
            "loss.backward() after the autocast block, as PyTorch's AMP recipe does "
            "(docs/training.md, \"Mixed precision\").", AutocastBackwardWarning,
            stacklevel=user_stacklevel())
