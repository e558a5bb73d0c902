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
  Two threads stepping one module at once: a step counts from its forward's start, not from
  when its node is watched, so forwards that overlap warn too (they did only where one had
  finished its forward before the other began: 10 of 20 overlapping pairs warned; settings
  probe, 2026-12-06). Threads that both meet a step to plan (gradients newly in place in
  both) plan one after the other: tracing uses the process's state, and two traces at once
  failed (a CaptureError from FunctionalTensor).

NOTE [Inference tensors kept]
  A batch made under torch.inference_mode() cannot be saved for a backward. Eager's step may
  save none of it where a plan saves it to recompute from: a transformer block's tight plan
  failed with autograd's "Inference tensors cannot be saved for backward" where eager and the
  store-all plan trained. The error now says so, and what to do. Autograd raised it as the
  compiled forward returned, after the forward had run: BatchNorm's statistics updated and
  dropout's masks drawn, where eager fails at the first layer that saves the batch, before
  they are (an RL loop's rollout buffer; the retry with a clone then trained off eager's,
  silently: RL probe, 2026-12-07). A step whose backward keeps an input (`saved_inputs`, read
  off the forward graph's saved values) refuses an inference tensor there before it runs.
"""
from __future__ import annotations

import threading
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
        self._running = 0  # forwards begun and not yet watched (other threads')
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> InFlight:
        return InFlight()  # a copy's steps are its own (and a lock is not copied)

    def starting(self) -> None:
        """Called as a step begins: warns where earlier steps are still in flight."""
        with self._lock:
            self._waiting = [(node, ran) for node, ran in self._waiting
                             if not ran[0] and node() is not None]
            earlier = len(self._waiting) + self._running
            self._running += 1
        if earlier:
            warnings.warn(StepsInFlightWarning(
                f"monet_opt: a step began while {earlier} earlier step(s) of this "
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
        ran = [False]
        if node is not None:
            node.register_prehook(lambda grad_outputs: ran.__setitem__(0, True))
        with self._lock:
            self._running -= 1
            if node is not None:
                self._waiting.append((weakref.ref(node), ran))
        return node

    def failed(self, err: BaseException) -> None:
        """Called where a step's forward raised `err`: it is in flight no more (NOTE
        [Inference tensors kept] adds to what autograd says)."""
        with self._lock:
            self._running -= 1
        if isinstance(err, RuntimeError) and "Inference tensors cannot be saved" in str(err):
            err.add_note("monet_opt: this step's plan keeps an input made under "
                         "torch.inference_mode() for its backward (to recompute from), where "
                         "eager's step may keep none: make the batch under torch.no_grad() "
                         "instead, or pass a clone of it (x.clone()). NOTE [Inference tensors "
                         "kept] in monet_opt/in_flight.py.")


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


def saved_inputs(forward, num_inputs: int, num_outputs: int) -> tuple[int, ...]:
    """The positions among the step's `num_inputs` inputs (its forward graph's last
    placeholders) of those the forward saves for the backward (NOTE [Inference tensors
    kept])."""
    placeholders = list(forward.graph.find_nodes(op="placeholder"))
    saved = set(forward.graph.output_node().args[0][num_outputs:])
    return tuple(k for k, node in enumerate(placeholders[len(placeholders) - num_inputs:])
                 if node in saved)


def refuse_inference(inputs: list[torch.Tensor], saved: tuple[int, ...]) -> None:
    """Autograd's error, before the step runs, where an input its backward keeps is an
    inference tensor (NOTE [Inference tensors kept])."""
    if torch.is_grad_enabled() and any(inputs[k].is_inference() for k in saved):
        raise RuntimeError(
            "Inference tensors cannot be saved for backward: an input of this step was made "
            "under torch.inference_mode() and its plan keeps it for the backward (eager's "
            "step fails the same way where it keeps it too). Make the batch under "
            "torch.no_grad() instead, or pass a clone of it (x.clone()). Nothing was run: "
            "BatchNorm's statistics and the random stream are as they were. NOTE [Inference "
            "tensors kept] in monet_opt/in_flight.py.")
