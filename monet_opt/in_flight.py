"""A warning where a step begins while an earlier one still waits for its backward.

NOTE [Steps in flight]
  A plan covers one step: a forward, then its backward. Code that runs two forwards before one
  backward (a contrastive or siamese loss over two batches, a preference loss over a chosen and
  a rejected answer) holds the first step's kept activations through the whole second step, on
  top of its plan: tests/models.py's GPT-2 at half its activations (limit 1,506,184 B) measured
  1,497,352 B for one step and 2,142,728 B for two forwards and one backward, with no word. So
  each step's autograd node is watched (a weak reference, gone when its graph is freed, and a
  hook, run when its backward runs), and a step that begins while an earlier one's node is alive
  and not yet run warns (StepsInFlightWarning), saying what to do: run each backward before the
  next forward, or optimize one module that makes both forwards and the loss, so one plan
  covers them. The gradients of two steps in flight are eager's, but for a parameter used twice
  in a step (GPT-2's tied embeddings), which differs from eager's in the last bits: eager's
  autograd adds each use's gradient in turn across both graphs, where each of our steps hands
  over its own sum.
"""
from __future__ import annotations

import warnings
import weakref

import torch

from monet_opt.errors import user_stacklevel


class StepsInFlightWarning(RuntimeWarning):
    """A step began while earlier steps of the same module still wait for their backward, so
    their kept activations sit on top of this step's plan (NOTE [Steps in flight])."""


class InFlight:
    """The steps of one optimized module whose forward ran and whose backward has not (and whose
    graph is alive)."""

    def __init__(self) -> None:
        self._waiting: list[tuple[weakref.ref, list[bool]]] = []

    def starting(self) -> None:
        """Called as a step begins: warns where earlier steps are still in flight."""
        self._waiting = [(node, ran) for node, ran in self._waiting
                         if not ran[0] and node() is not None]
        if self._waiting:
            warnings.warn(StepsInFlightWarning(
                f"monet_opt: a step began while {len(self._waiting)} earlier step(s) of this "
                "module still wait for their backward (forward run, graph alive): the plan "
                "covers one step, so what they keep for their backward adds to this step's "
                "peak, which can pass the memory limit. Run each backward before the next "
                "forward, or optimize one module whose forward makes both forwards and the loss "
                "(monet_opt.WithLoss for one model and its loss), so one plan covers them. "
                "NOTE [Steps in flight] in monet_opt/in_flight.py."),
                stacklevel=user_stacklevel())

    def started(self, outputs: list[torch.Tensor]):
        """Watch the autograd node of the step that made `outputs` (its output tensors); that
        node (None where no output requires a gradient)."""
        node = _step_node(outputs)
        if node is None:
            return None
        ran = [False]
        node.register_prehook(lambda grad_outputs: ran.__setitem__(0, True))
        self._waiting.append((weakref.ref(node), ran))
        return node


def _step_node(outputs: list[torch.Tensor]):
    """The autograd node of the compiled step behind `outputs` (through views of its outputs);
    None if no output requires a gradient."""
    for out in outputs:
        if out.grad_fn is None:
            continue
        frontier = [out.grad_fn]
        for _ in range(4):
            for node in frontier:
                if isinstance(node, torch.autograd.function.BackwardCFunction):
                    return node
            frontier = [n for node in frontier for n, _ in node.next_functions
                        if n is not None]
    return None
