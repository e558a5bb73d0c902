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
import threading

import torch
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase
from torch.utils import checkpoint
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as _mode_stack
from torch.utils.checkpoint import CheckpointPolicy

from monet_opt.errors import CaptureError


@contextlib.contextmanager
def plain_checkpoints():
    """Inside: reentrant checkpoints call their function directly (NOTE [Reentrant
    checkpoints]), and a BatchNorm in a checkpoint updates its statistics as eager's does in
    a step (NOTE [BatchNorm in a checkpoint]); as they were on exit."""
    cls = checkpoint.CheckpointFunction
    own, eager = cls.__dict__.get("apply"), cls.apply  # own None: autograd.Function's
    tracing = threading.get_ident()  # NOTE [Patches other threads see]

    def apply(function, preserve_rng_state: bool, *args):
        if threading.get_ident() != tracing:
            return eager(function, preserve_rng_state, *args)
        return _call(function, preserve_rng_state, *args)

    cls.apply = staticmethod(apply)
    norms = {norm: norm.__dict__["forward"] for norm in _norm_classes()}
    for norm, forward in norms.items():
        patched = functools.partialmethod(_twice, forward.__get__(None, norm), tracing)
        patched.unpatched = forward  # what attributes.py watches
        norm.forward = patched
    try:
        yield
    finally:
        for norm, forward in norms.items():
            norm.forward = forward
        if own is None:
            del cls.apply
        else:
            cls.apply = own


def _call(function, preserve_rng_state: bool, *args):
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                       for a in args):
        return _tracked_as_eager(function(*args))
    with torch.no_grad():
        return function(*args)


# NOTE [What a reentrant checkpoint tracks]
#   Eager's reentrant checkpoint is an autograd.Function, which tracks the tensors it returns
#   at the top level alone (the result, or a tuple's elements); a tensor inside a dict, a list
#   or a nested tuple was made under no_grad and stays so, and no gradient flows back through
#   it. The plain call gave those a gradient: a block returning {"y": y} left the block and
#   everything before it no gradient in eager and gradients in the step, and one returning
#   (y, (2 * y,)) gave them other values. Such tensors are detached here, as eager leaves them.


def _tracked_as_eager(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple):  # a namedtuple too, returned as a plain tuple, as eager's
        return tuple(o if isinstance(o, torch.Tensor) else _detached(o) for o in out)
    return _detached(out)


def _detached(tree):
    return torch.utils._pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, tree)


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
#   A selective checkpoint (NOTE [Selective checkpoints' BatchNorms]) runs again only what its
#   policy does not save.
#   Every norm with running statistics is so traced: each class under torch's _NormBase that
#   defines its own forward (InstanceNorm with track_running_stats, SyncBatchNorm, timm's
#   BatchNormAct2d, which calls F.batch_norm itself), and a forward calling its base class's
#   runs the update twice, not three times (`_doubling`). Before, only _BatchNorm.forward was:
#   timm's regnety_002 with set_grad_checkpointing() trained with 129 of 132 buffers off
#   eager's, up to 0.18, silently (timm probe, 2026-12-06).
_CHECKPOINTS = {checkpoint._checkpoint_impl.__code__, _call.__code__} \
    if hasattr(checkpoint, "_checkpoint_impl") else {_call.__code__}
_doubling: set[int] = set()  # the modules whose forward runs twice now


def _norm_classes() -> list[type]:
    """The classes under _NormBase that define their own forward."""
    found, todo = [], [_NormBase]
    while todo:
        cls = todo.pop()
        todo.extend(c for c in cls.__subclasses__() if c not in found)
        if "forward" in cls.__dict__ and cls not in found:
            found.append(cls)
    return found


# NOTE [Patches other threads see]
#   The patches above are on classes, so for the trace's while every thread sees them: another
#   thread training an eager model with a BatchNorm in a checkpoint while optimize() traced
#   had its statistics updated twice more (num_batches_tracked 4,769 where alone 3,198), and an
#   optimized module stepping in another thread saw its class's forward replaced and planned
#   a step again each time (thread probe, 2026-12-06). They act on the tracing thread alone;
#   elsewhere they call what they replace, which the watched class methods are taken to be
#   (`unpatched`, read in monet_opt/attributes.py).
def _twice(module: _NormBase, norm, tracing: int, input: torch.Tensor, *args, **kwargs):
    weight = module.weight
    if id(module) in _doubling or threading.get_ident() != tracing or not (
            module.training and module.track_running_stats and torch.is_grad_enabled() and (
                input.requires_grad or (weight is not None and weight.requires_grad)) and
            _in_checkpoint()):
        return norm(module, input, *args, **kwargs)
    _doubling.add(id(module))
    try:
        with torch.no_grad():
            if _runs_again(module, input):
                norm(module, input.detach(), *args, **kwargs)
            elif isinstance(module, _BatchNorm) and module.num_batches_tracked is not None:
                module.num_batches_tracked.add_(1)
        return norm(module, input, *args, **kwargs)
    finally:
        _doubling.discard(id(module))


# NOTE [Selective checkpoints' BatchNorms]
#   Eager's backward runs a selective checkpoint's block again op by op, and an op its policy
#   saves (MUST_SAVE, PREFER_SAVE, True) is not run but read from what the forward kept: a
#   policy that saves the BatchNorm's op updates the running statistics once a step. Its
#   `num_batches_tracked.add_(1)` runs again all the same (a policy saving add_ fails in eager:
#   "Tensor cached during selective activation checkpoint has been mutated"). So the policy is
#   asked about the batch norm of the backend torch picks for these tensors (native_batch_norm
#   on CPU, cudnn_batch_norm or miopen_batch_norm on GPUs; the trace runs another op), with no
#   op_output (the trace has not run eager's op), and the second update makes the statistics
#   and the count again, or the count alone. Before, a policy saving the BatchNorm's op trained
#   with running statistics 0.0088 from eager's in two steps (tests/test_reentrant.py).
_SAVED = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE, True)


def _runs_again(module: _NormBase, input: torch.Tensor) -> bool:
    """Whether eager's recomputation of the checkpoint runs this BatchNorm's op again."""
    policy = next((getattr(mode, "policy_fn", None) for mode in _mode_stack()
                   if type(mode).__name__ == "_CachingTorchDispatchMode"), None)
    if policy is None:  # a plain checkpoint runs the whole block again
        return True
    stats = (input, module.weight, module.bias, module.running_mean, module.running_var)
    backend = torch._C._select_batch_norm_backend(*stats, True, module.eps)
    aten = torch.ops.aten
    op = {torch._C._BatchNormBackend.Cudnn: aten.cudnn_batch_norm.default,
          torch._C._BatchNormBackend.Miopen: aten.miopen_batch_norm.default}.get(
              backend, aten.native_batch_norm.default)
    momentum = 0.0 if module.momentum is None else module.momentum
    try:
        return policy(checkpoint.SelectiveCheckpointContext(is_recompute=False), op, *stats,
                      True, momentum, module.eps) not in _SAVED
    except Exception as error:
        raise CaptureError(
            f"the selective checkpoint's policy failed when asked whether it saves the "
            f"BatchNorm's {op} (asked with no op_output, which the trace cannot give): "
            f"{type(error).__name__}: {error}. Make the policy work without ctx.op_output "
            f"for batch norms, or checkpoint the block without a context_fn.") from error


def _in_checkpoint() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code in _CHECKPOINTS:
            return True
        frame = frame.f_back
    return False
