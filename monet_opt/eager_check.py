"""The model run eagerly on the sample, to tell a failure of tracing from one of the model
(NOTE [The eager check in grad mode])."""
from __future__ import annotations

import torch

from monet_opt.memory import cuda_devices


# NOTE [The eager check in grad mode]
#   The eager check runs the forward under no_grad, which holds no activations; a forward
#   that needs grad mode (a tensor hook registered, autograd.grad inside) fails so, and is run
#   again with it. A hook reading .item() was told "the model fails on sample_input run
#   eagerly too ... tracing is not the cause", though it trains eagerly (docs probe,
#   2026-12-06). A forward that runs under no_grad may still fail with gradients to compute
#   (flex_attention on CPU: "does not support backward on CPU"; SDPA forced to flash attention
#   with a mask that requires grad: "No available kernel"), and was told to avoid .item()
#   (inputs probe, 2026-12-07): it is run in grad mode too, with what autograd would save
#   dropped as it is saved, so it holds no more than under no_grad. A failure that comes of the
#   dropping (a backward inside the forward reads a saved tensor; torch.func refusing
#   saved-tensor hooks) is not the model's.
def eager_failure(model, args: tuple, kwargs: dict) -> Exception | None:
    """What the model raises on (args, kwargs) run eagerly: under no_grad, and where that
    fails with grad mode on too; from a forked random stream, its buffers put back."""
    if _failure(model, args, kwargs, grad=False) is None:
        with torch.autograd.graph.saved_tensors_hooks(_drop, _dropped):
            failed = _failure(model, args, kwargs, grad=True)
        return None if failed is None or _of_dropping(failed) else failed
    return _failure(model, args, kwargs, grad=True)


class _Dropped(RuntimeError):
    pass


def _drop(_: torch.Tensor) -> None:
    return None


def _dropped(_: None) -> torch.Tensor:
    raise _Dropped("a tensor the eager check dropped was read")


def _of_dropping(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, (_Dropped, torch.OutOfMemoryError)) or "saved tensor" in str(exc) \
                or "a tensor the eager check dropped" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _failure(model, args: tuple, kwargs: dict, grad: bool) -> Exception | None:
    buffers = [b.clone() for b in model.buffers()]
    try:
        with torch.set_grad_enabled(grad), \
                torch.random.fork_rng(devices=cuda_devices(model.parameters())):
            model(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - said to the user, who reads it
        return exc
    finally:
        with torch.no_grad():
            for b, saved in zip(model.buffers(), buffers):
                b.copy_(saved)
    return None
