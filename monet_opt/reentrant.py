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

import torch
from torch.utils import checkpoint


@contextlib.contextmanager
def plain_checkpoints():
    """Inside: reentrant checkpoints call their function directly (NOTE [Reentrant
    checkpoints]); as they were on exit."""
    cls = checkpoint.CheckpointFunction
    own = cls.__dict__.get("apply")  # None: it inherits autograd.Function's
    cls.apply = staticmethod(_call)
    try:
        yield
    finally:
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
