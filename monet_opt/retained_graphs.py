"""NOTE [Retained graphs, said]
  With `backward(retain_graph=True)` autograd keeps the step's saved tensors in the graph's
  context through the backward and after it, past where the plan frees them (NOTE [Retained
  graphs] in monet_opt/capture.py), so the step can pass its limit: a small CNN planned under
  300,000 B measured 405,288 B with one such backward, silently (lifecycle probe, 2026-12-05;
  GAN code often writes it). So the step's backward node checks, as it runs, whether its graph
  is kept, and says so (RetainedGraphWarning), once per call site as warnings go.
"""
from __future__ import annotations

import warnings

import torch

from monet_opt.errors import user_stacklevel


class RetainedGraphWarning(RuntimeWarning):
    """A backward kept the step's graph (retain_graph=True), holding what the plan frees (NOTE
    [Retained graphs, said])."""


def prehook(node) -> None:
    """Hook the step's backward node (None: nothing) to warn where its graph is kept."""
    if node is not None:
        node.register_prehook(_check)


# private in torch 2.14 (autograd's own graph task); a torch without it says nothing
kept = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: False)


def _check(grad_outputs) -> None:
    if kept():
        warnings.warn(
            "monet_opt: backward(retain_graph=True) ran through the optimized module: autograd "
            "keeps the step's saved tensors until the graph is freed, past where its plan frees "
            "them, so this step can pass its memory limit. Retain the graph only where a second "
            "backward through it is needed; two losses on one forward can be summed and "
            "backpropagated once. NOTE [Retained graphs, said] in monet_opt/retained_graphs.py.",
            RetainedGraphWarning, stacklevel=user_stacklevel())
