"""What optimize() refuses before it traces: what is not a model, a model wrapped for data
parallelism or sharded, and modules a traced step cannot hold, each named with what to do."""
from __future__ import annotations

import torch
from torch.nn.modules.lazy import LazyModuleMixin

from monet_opt.errors import CaptureError


# NOTE [Sharded models]
#   FSDP (FullyShardedDataParallel, or fully_shard's FSDPModule classes) keeps each rank's shard
#   of the parameters and gradients and gathers whole ones around every forward and backward.
#   The plan counts whole parameters once, so fully_shard around an optimized module trained
#   bitwise but passed the limit by its rank's shard (782 B over a 63,214 B limit on two gloo
#   ranks; more with gradients kept), silently, and a model class merely named "FSDP..." was
#   refused as sharded (the check was by name; distributed probe, 2026-12-06). Sharded modules
#   are found by class, and refused before the trace and at each call of the optimized module
#   (fully_shard after optimize() changes the classes in place).
def check_module(model: object) -> None:
    """TypeError for what optimize() cannot take as a model."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"monet_opt.optimize: model must be a torch.nn.Module, got "
                        f"{type(model).__name__}; wrap a function in a Module whose forward "
                        "calls it.")
    refuse_sharded(model, "monet_opt.optimize")
    wrapper = next((m for m in model.modules() if isinstance(m, _PARALLEL)), None)
    if wrapper is not None:
        # the wrapper's Python around the forward is not in a traced step (inside the model,
        # DDP's buffer broadcast was blamed as "drew random numbers in Python")
        where = "" if wrapper is model else " (a module inside it)"
        raise TypeError(
            f"monet_opt.optimize: the model is wrapped in {type(wrapper).__name__}{where}, whose "
            "gradient synchronization (or scattering) runs in Python around each forward, "
            "which a traced step does not run: under DDP on two processes each rank's "
            "gradients stayed its own, silently. Optimize the module inside, then wrap what "
            "optimize() returns: DistributedDataParallel(monet_opt.optimize(model, x, limit), "
            "gradient_as_bucket_view=True).")


_PARALLEL = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
try:  # a torch built without distributed has neither
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.distributed.fsdp._flat_param import FlatParameter
    SHARDED: tuple[type, ...] = (FSDPModule, FullyShardedDataParallel)
    _FLAT: tuple[type, ...] = (FlatParameter,)
except ImportError:
    SHARDED = _FLAT = ()


def refuse_flattened(params: list, planned: tuple) -> None:
    """NOTE [Sharded models]: TypeError where the model's parameters (`params`, in the step's
    order) are none though the plan had some (`planned`: their names), or views of a flat one:
    FullyShardedDataParallel wrapped around the optimized module, which is not among its
    modules, swaps them for views of its flat parameter around each forward: none registered
    (the step then ran the model itself, no plan: 92 % over the limit, silently) or plain
    tensors (use_orig_params=True: the plan ran, its shards uncounted; sharding probe,
    2026-12-07)."""
    if (params or not planned) and not (params and isinstance(params[0]._base, _FLAT)):
        return  # functional_call's tensors are not Parameters, nor views of a flat one
    raise TypeError(
        "monet_opt: the model's parameters are " + ("gone" if not params else "views of a "
                                                    "flat parameter")
        + " at this call, as under FullyShardedDataParallel wrapped around the optimized "
        "module, which swaps them for views of its flat shard around each forward: memory the "
        "plan does not count, and a step it cannot run. Sharded training is not supported; "
        "for data parallelism wrap the optimized module in DistributedDataParallel(opt, "
        "gradient_as_bucket_view=True).")


def refuse_sharded(model: torch.nn.Module, who: str) -> None:
    """NOTE [Sharded models]: TypeError where `model` or a module in it is sharded by FSDP."""
    sharded = next((m for m in model.modules() if isinstance(m, SHARDED)), None)
    if sharded is not None:
        where = "" if sharded is model else f" (a module inside it, {type(sharded).__name__})"
        raise TypeError(
            f"{who}: the model is sharded by FSDP{where}: FSDP keeps each rank's shard of the "
            "parameters and gradients and gathers them around every forward and backward, "
            "memory the plan does not count, so the step passes its limit (fully_shard around "
            "an optimized module: by its rank's shard, silently). Sharded training is not "
            "supported; for data parallelism wrap the optimized module in "
            "DistributedDataParallel(opt, gradient_as_bucket_view=True).")


DENSE = (" (a dense gradient, which torch.optim's Adam, Adagrad and SGD take; SparseAdam "
         "takes only sparse ones: use Adam), or freeze its weight.")


def refuse_untraceable(model: torch.nn.Module) -> None:
    """CaptureError, before tracing, for modules a traced step cannot hold, naming the module
    and what to do (traced, each failed deep inside AOTAutograd without naming a line):
    an Embedding or EmbeddingBag with sparse=True that trains (a sparse gradient; "memory format
    option is only supported by strided tensors"), a BatchNorm in training with
    momentum=None (its cumulative average's factor, 1 / num_batches_tracked, is read as a
    Python number every step; "DataDependentOutputException"), a lazy module not yet
    initialized (LazyLinear, LazyConv2d: its shapes are set by its first call, which a trace
    cannot make; "Attempted to use an uninitialized parameter", behind a HookWarning about
    the hook that would initialize it), and a quantization observer whose per-channel
    statistics are not yet sized (quantization-aware training before its first call: NOTE
    [Buffers assigned in forward] in monet_opt/forward_state.py)."""
    for name, module in model.named_modules():
        what = f"{type(module).__name__} {name or '(the model)'!r}"
        if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
            raise CaptureError(
                f"monet_opt.optimize: {what} is a lazy module whose parameters are not yet "
                "initialized (their shapes come from its first call). Call the model once on "
                "a batch first (model(sample_input) under torch.no_grad()), then create the "
                "optimizer and optimize() it, as PyTorch says to for lazy modules.")
        if _is_observer(module) and any(b.numel() == 0 for b in module.buffers(recurse=False)):
            raise CaptureError(
                f"monet_opt.optimize: {what} is a quantization observer whose statistics are "
                "not yet sized (its first call sizes them per channel, which the traced step, "
                "made with the empty ones, cannot follow). Call the model once on a batch "
                "first (model(sample_input)), as the first step of quantization-aware training "
                "would, then optimize() it.")
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse \
                and module.weight.requires_grad:
            raise CaptureError(
                f"monet_opt.optimize: {what} has sparse=True, so its weight's gradient is a "
                "sparse tensor, which a traced backward cannot make. Build it with sparse=False"
                + DENSE)
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.training \
                and module.momentum is None and module.track_running_stats:
            raise CaptureError(
                f"monet_opt.optimize: {what} has momentum=None (a cumulative average of the "
                "batch statistics, weighted by 1 / num_batches_tracked, a number its forward "
                "reads from a buffer every step), which a traced step cannot read. Give it a "
                "momentum (0.1 is PyTorch's default), or train it in eval mode and optimize() so.")


def _is_observer(module: torch.nn.Module) -> bool:
    """A torch.ao.quantization observer or fake-quantize module (by class name: importing
    the package to test would warn of its deprecation)."""
    return any(c.__name__ in ("ObserverBase", "FakeQuantizeBase") for c in type(module).__mro__)
