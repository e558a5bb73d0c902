"""NOTE [One tensor passed twice, differentiated]
  The step takes each tensor argument as an input of its own, so one tensor passed twice is two
  inputs to the trace: trained through both, its gradient is eager's (bitwise), but a
  derivative the forward takes with respect to one of them does not see what was computed from
  the other. A physics-informed loss wrapped as `WithLoss(net, loss)(x, x)`, taking
  `torch.autograd.grad(u, x)` of the target, got zeros there (with allow_unused and
  materialize_grads: loss 1.00206 for eager's 0.99487, gradients up to 1.03 off, silently),
  or failed to trace with advice about data-dependent Python (sci-ML probe, 2026-12-07). So
  where a tensor that requires a gradient is passed twice and the forward takes a derivative
  (torch.autograd.grad, watched while the step is traced) with respect to more than the
  model's parameters (a MAML-style inner step takes those alone, and was refused), optimize()
  refuses, saying to take the derivative inside the model's forward, from the tensor it
  computed with, or to pass the tensor once.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence

import torch

from monet_opt.errors import CaptureError

_OURS = ("torch.", "monet_opt.")  # callers not the model's, but for
_USERS = ("torch.autograd.functional",)  # a jacobian or hessian the forward takes


def twice(inputs: Sequence[torch.Tensor]) -> list[tuple[int, int]]:
    """(first, again) positions among the step's `inputs` of one tensor that requires a
    gradient passed again."""
    first: dict[int, int] = {}
    found = []
    for k, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            if id(t) in first:
                found.append((first[id(t)], k))
            first.setdefault(id(t), k)
    return found


@contextlib.contextmanager
def refused_if_differentiated(model: torch.nn.Module,
                              inputs: Sequence[torch.Tensor]) -> Iterator[None]:
    """Around the trace: CaptureError where `inputs` hold one tensor that requires a gradient
    twice and the forward called torch.autograd.grad (traced or not) with respect to more than
    `model`'s parameters (a MAML-style inner step's derivative is not the inputs')."""
    pairs = twice(inputs)
    if not pairs:
        yield
        return
    taken = []
    grad = torch.autograd.grad

    def watched(outputs, inputs=(), *args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        wrt = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        own = {id(p) for p in model.parameters()}  # the trace's, swapped in
        if (not caller.startswith(_OURS) or caller.startswith(_USERS)) and not all(
                id(t) in own for t in wrt):  # not AOTAutograd's own, tracing the backward
            taken.append(caller)
        return grad(outputs, inputs, *args, **kwargs)

    torch.autograd.grad = watched
    try:
        yield
    except Exception as exc:
        if taken:
            raise _refusal(pairs) from exc
        raise
    finally:
        torch.autograd.grad = grad
    if taken:
        raise _refusal(pairs)


def _refusal(pairs: list[tuple[int, int]]) -> CaptureError:
    named = "; ".join(f"#{a} and #{b}" for a, b in pairs)
    return CaptureError(
        f"monet_opt.optimize: one tensor that requires a gradient is passed as the step's "
        f"input tensors {named} (counted among its tensor arguments), and the forward takes a "
        "derivative (torch.autograd.grad): the step takes each argument as an input of its "
        "own, so a derivative with respect to one would not see what was computed from the "
        "other (zeros, or a tensor 'not used in the graph', where eager's are one tensor). "
        "Take the derivative inside the model's forward, from the tensor it computed with "
        "(return the residual), or pass the tensor once (NOTE [One tensor passed twice, "
        "differentiated] in monet_opt/twice_passed.py).")
