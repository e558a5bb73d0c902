"""Outputs that accelerate's mixed precision turns to float32 after the step, made in it."""
from __future__ import annotations

import contextlib
import contextvars
import sys
import warnings
from typing import Any

import torch
from torch import nn

from monet_opt.errors import user_stacklevel
from monet_opt.held_outputs import OutputsHeldWarning

# NOTE [Outputs accelerate makes float32]
#   accelerate's Accelerator(mixed_precision="bf16") prepares a module by wrapping its forward
#   in autocast and then in ConvertOutputsToFp32, which copies each half-precision output to
#   float32 after the forward returns. Prepared after optimize() (the order DDP needs), the
#   copies were made outside the plan, and the caller held them (GPT-2's logits) through the
#   backward while the half-precision outputs died: 90,932 B over a 1,900,000 B limit,
#   128,008 B over the prediction, and no OutputsHeldWarning, since the outputs watched were
#   not the ones held (accelerate probe, 2026-12-06). Where the optimized module's own forward
#   is so wrapped, its step is traced with accelerate's conversion at its end: the float32
#   outputs are the step's, planned, and held through the backward where the caller holds
#   them; accelerate's conversion then has nothing left to convert. It is part of the step's
#   key, beside the autocast state (`state`).
_CONVERTING: contextvars.ContextVar[bool] = contextvars.ContextVar("monet_opt_fp32_outputs",
                                                                   default=False)
MARK = ("outputs", "float32")


def wrapped(module: nn.Module) -> bool:
    """Whether accelerate's ConvertOutputsToFp32 wraps `module`'s own forward."""
    forward = vars(module).get("forward")
    forward = getattr(forward, "__func__", forward)
    convert = getattr(forward, "__wrapped__", forward)  # convert_outputs_to_fp32's function
    return type(convert).__name__ == "ConvertOutputsToFp32" and \
        type(convert).__module__.startswith("accelerate.")


def warn_if_around() -> None:
    """OutputsHeldWarning where accelerate's conversion runs around this call, not as the
    optimized module's own forward: a module around it, or torch.compile(opt), was prepared,
    and the float32 copies were made after the step, 90,924 B over a limit, unwarned (helper
    107, 2026-12-06); the step cannot tell whether its outputs are what is converted."""
    operations = sys.modules.get("accelerate.utils.operations")  # transformers imports it
    if operations is None or not any(map(torch.is_autocast_enabled, ("cpu", "cuda"))):
        return  # its conversion wraps an autocast one: no frames walked at a plain step
    code, frame = operations.ConvertOutputsToFp32.__call__.__code__, sys._getframe(1)
    for _ in range(64):
        if frame is None:
            return
        if frame.f_code is code:
            warnings.warn(OutputsHeldWarning(
                "monet_opt: accelerate's mixed precision converts to float32 the outputs of a "
                "module around the optimized module (one prepared around it, or "
                "torch.compile(opt) prepared), after the step: copies the plan does not count, "
                "held through the backward where the outputs are. Prepare the optimized module "
                "itself (accelerator.prepare(opt), then torch.compile if you compile): its "
                "step then makes them (NOTE [Outputs accelerate makes float32] in "
                "monet_opt/outputs_fp32.py)."), stacklevel=user_stacklevel())
            return
        frame = frame.f_back


@contextlib.contextmanager
def converting(on: bool):
    """While open, steps are traced (and keyed) with their outputs made float32."""
    token = _CONVERTING.set(on)
    try:
        yield
    finally:
        _CONVERTING.reset(token)


def state() -> tuple[tuple[str, str], ...]:
    """The mark in a step's autocast state, where its outputs are made float32."""
    return (MARK,) if _CONVERTING.get() else ()


def convert(outputs: Any) -> Any:
    """`outputs` as accelerate's conversion leaves them, where steps are traced so."""
    if not _CONVERTING.get():
        return outputs
    from accelerate.utils.operations import convert_to_fp32  # set only where it wraps
    return convert_to_fp32(outputs)
