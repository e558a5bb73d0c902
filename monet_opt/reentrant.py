"""Reentrant activation checkpoints are traced as the plain calls they stand for.

NOTE [Reentrant checkpoints]
  `torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=True)` (torch's default when
  use_reentrant is not given, with a warning; HF's gradient_checkpointing_enable({"use_reentrant":
  True}), as LoRA recipes written for older transformers pass it) is an autograd.Function: its
  forward runs `fn` under no_grad and its backward runs `fn` again and backpropagates through
  it. Traced, only the forward is seen, and it makes nothing that needs a gradient: GPT-2 with
  LoRA adapters and reentrant checkpointing was optimized into a step that gave its adapters no
  gradient at all, where eager gave all 24 theirs, and nothing said so. The plan recomputes what
  it chooses by itself, so the checkpoint has nothing to add to the traced step: while a step is
  traced, the checkpoint calls `fn(*args)`, as eager's forward and backward together compute
  it. Where no tensor argument requires a gradient eager's backward never runs (what `fn` reads
  gets no gradient), and the call is made under no_grad, as eager's forward is. Its random draws
  are the forward's (eager's recomputation replays them from the saved generator state and
  leaves the stream as it found it). Non-reentrant checkpoints trace as plain calls already.
  GPT-2 with reentrant checkpointing and dropout: every gradient bitwise eager's, at the
  store-all plan and at a third of its activations (tests/test_reentrant.py); with LoRA adapters
  too (docs/benchmarks/coverage.md).
"""
from __future__ import annotations

import contextlib
import functools
import sys

import torch
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils import checkpoint


@contextlib.contextmanager
def plain_checkpoints():
    """Inside: reentrant checkpoints call their function directly (NOTE [Reentrant
    checkpoints]), and a BatchNorm in a checkpoint updates its statistics as eager's does in
    a step (NOTE [BatchNorm in a checkpoint]); as they were on exit."""
    cls, norm = checkpoint.CheckpointFunction, _BatchNorm.forward
    own = cls.__dict__.get("apply")  # None: it inherits autograd.Function's
    cls.apply = staticmethod(_call)
    _BatchNorm.forward = functools.partialmethod(_twice, norm)
    try:
        yield
    finally:
        _BatchNorm.forward = norm
        if own is None:
            del cls.apply
        else:
            cls.apply = own


def _call(function, preserve_rng_state: bool, *args):
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                       for a in args):
        return function(*args)
    with torch.no_grad():
        return function(*args)


# NOTE [BatchNorm in a checkpoint]
#   Eager's backward runs a checkpointed block again, in training mode, and a BatchNorm in it
#   updates its running statistics a second time, from the same batch (num_batches_tracked
#   grows by two a step), where the traced step, a plain call (NOTE [Reentrant checkpoints]),
#   updated them once: a conv and BatchNorm under torch.utils.checkpoint, reentrant or not,
#   trained with gradients bitwise eager's and running statistics that were not. So a training
#   BatchNorm called inside a checkpoint, where its backward runs (grad mode on and its input or
#   weight requires a gradient), is traced twice: first on its input detached, under no_grad,
#   for the update alone (what it returns is dropped), then as it is. The second update reads
#   the first's result with the same batch statistics, as eager's recomputation does, so the
#   buffers are eager's bitwise (tests/test_reentrant.py). Those statistics are then updated
#   functionally (they are read twice: NOTE [Statistics updated in place] does not apply).
#   A selective checkpoint whose policy saves the BatchNorm's outputs does not run it again in
#   eager; its statistics here still are updated twice (not handled).
_CHECKPOINTS = {checkpoint._checkpoint_impl.__code__, _call.__code__} \
    if hasattr(checkpoint, "_checkpoint_impl") else {_call.__code__}


def _twice(module: _BatchNorm, norm, input: torch.Tensor, *args, **kwargs):
    weight = module.weight
    if module.training and module.track_running_stats and torch.is_grad_enabled() and (
            input.requires_grad or (weight is not None and weight.requires_grad)) and \
            _in_checkpoint():
        with torch.no_grad():
            norm(module, input.detach(), *args, **kwargs)
    return norm(module, input, *args, **kwargs)


def _in_checkpoint() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code in _CHECKPOINTS:
            return True
        frame = frame.f_back
    return False
