"""Module hooks and the traced step (NOTE [Module hooks]).

NOTE [Module hooks]
  A model's module hooks (forward, forward-pre and backward hooks, registered on its modules or
  globally with torch.nn.modules.module.register_module_forward_hook and its kind) run while
  optimize() traces the step, on tracing tensors. What they compute on tensors (a hook that
  scales an output) is then part of the traced step and runs at every step, bitwise eager's
  (tests/test_hooks.py). Their Python side effects do not: a hook that prints, or keeps an
  output in a dict for a distillation loss, runs only while optimize() traces, and the dict
  then holds a tracing tensor, not the step's. So optimize() warns (HookWarning) where the model
  has any, but for PyTorch's own that compute on tensors only (quantization-aware training's
  observer hooks; spectral_norm's, weight_norm's and prune's, which set the weight). A hook
  added or removed after optimize() is not in a step traced before: the optimized module
  plans a step for the hooks as they are (ReplanWarning, and HookWarning where there are any;
  NOTE [New input shapes] in monet_opt/module.py), once per set of hooks, so
  pruning a model after optimize() (torch.nn.utils.prune's forward pre-hooks) trains bitwise
  like eager (tests/test_hooks.py). It refused such a step (PlanMismatchError) until the hooks
  were restored. A hook registered anew for every step is a new set each time, and a plan each
  time: keep it registered. In eval mode or without gradients the model itself runs, hooks and
  all.
"""
from __future__ import annotations

import operator
import warnings

from torch import nn
from torch.nn.modules import module as nn_module

from monet_opt.errors import user_stacklevel

KINDS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
GLOBAL_KINDS = tuple(f"_global{kind}" for kind in KINDS)


class HookWarning(RuntimeWarning):
    """The model has module hooks: their Python side effects happen only while optimize()
    traces (NOTE [Module hooks])."""


Hooks = tuple[tuple[int, str, tuple[int, ...]], ...]


def hooks_of(modules: list[nn.Module]) -> Hooks:
    """(position in `modules`, a model's modules() in order, kind, hook ids) of every module
    hook, then of every global one (position -1)."""
    dicts = list(map(vars, modules))
    tables = {kind: list(map(operator.itemgetter(kind), dicts)) for kind in KINDS}
    hooked = sorted({k for found in tables.values() if any(found)  # mostly none: C-level
                     for k, hooks in enumerate(found) if hooks})
    own = [(k, kind, tuple(tables[kind][k])) for k in hooked for kind in KINDS
           if tables[kind][k]]
    shared = [(-1, kind, ids) for kind in GLOBAL_KINDS if getattr(nn_module, kind) and (
        ids := tuple(k for k, hook in getattr(nn_module, kind).items()
                     if not _tracker(hook) and not _tracing(hook)))]
    return tuple(own + shared)


# NOTE [Trackers' hooks]
#   torch.utils.module_tracker.ModuleTracker (which FlopCounterMode enters) and
#   torch.distributed._tools.mod_tracker.ModTracker (which MemTracker enters) hook every module
#   globally while entered, to note which module runs: bookkeeping, nothing on the step's
#   tensors. Their hooks are new at each entry, so a training step inside `with
#   FlopCounterMode():` was planned anew at every step (a ReplanWarning, and a HookWarning
#   blaming the model's hooks), each planning call passing the limit by its profiling pass;
#   inside ModTracker or MemTracker, the new plan's trace ran their hooks and failed (modes and
#   tools probes, 2026-12-06). They are not the step's hooks.
_TRACKERS = ("torch.utils.module_tracker", "torch.distributed._tools.mod_tracker")


def _tracker(hook) -> bool:
    return type(getattr(hook, "__self__", None)).__module__ in _TRACKERS


def _tracing(hook) -> bool:
    """One of the hooks a trace sets while it runs (NOTE [Module paths of ops]): seen by a step
    in another thread, they planned it again (NOTE [Patches other threads see])."""
    return getattr(hook, "__module__", None) == "monet_opt.module_paths"


def where(model: nn.Module, hooks: Hooks) -> str:
    """'encoder.0 (forward hooks), global (forward pre hooks)': the modules and kinds, a few."""
    names = [name or "the model" for name, _ in model.named_modules()]
    kind = lambda k: k.replace("_global_", "").strip("_").replace("_", " ")  # noqa: E731
    found = [f"{'global' if at < 0 else names[at]} ({kind(k)})" for at, k, _ in hooks]
    return ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")


# PyTorch's own hooks whose effects are on tensors only, so all in the traced step: the
# observers prepare_qat() hooks onto a quantization-aware model (they update buffers), and
# the objects torch.nn.utils.spectral_norm, weight_norm and prune hook on (they set the
# module's weight from its parameters, a tensor the step keeps on the module, and update
# buffers: NOTE [Attributes set before read] in monet_opt/attribute_tensors.py); and the
# one HF's gradient_checkpointing_enable() hooks onto the input embeddings (it sets their
# output to require a gradient: gradients bitwise eager's, GPT-2, BERT and Llama).
_TENSOR_ONLY = {("torch.ao.quantization.quantize", "_observer_forward_hook"),
                ("torch.ao.quantization.quantize", "_observer_forward_pre_hook"),
                ("transformers.modeling_utils", "make_inputs_require_grads")}
_TENSOR_ONLY_OBJECTS = ("torch.nn.utils.spectral_norm", "torch.nn.utils.weight_norm",
                        "torch.nn.utils.prune")


def _tensor_only(modules: list[nn.Module], at: int, kind: str, ids: tuple[int, ...]) -> bool:
    table = getattr(nn_module, kind) if at < 0 else modules[at].__dict__[kind]
    return all((getattr(table[i], "__module__", None), getattr(table[i], "__name__", None))
               in _TENSOR_ONLY or type(table[i]).__module__ in _TENSOR_ONLY_OBJECTS
               for i in ids)


def warn_if_hooks(model: nn.Module) -> None:
    modules = list(model.modules())
    hooks = tuple(h for h in hooks_of(modules) if not _tensor_only(modules, *h))
    if hooks:
        warnings.warn(HookWarning(
            f"monet_opt: {type(model).__name__} has module hooks: {where(model, hooks)}. They "
            "run while optimize() traces the step: what they compute on tensors is in the "
            "traced step, but their Python side effects (printing, keeping outputs in a list or "
            "dict) happen only then, never at a training step (NOTE [Module hooks] in "
            "monet_opt/hooks.py). A tensor a hook keeps as a module's attribute "
            "(setattr(module, 'features', output)) is set by every step (NOTE [Tensors kept on "
            "a module])."), stacklevel=user_stacklevel())  # the line calling optimize() or opt


def changed(model: nn.Module, traced: Hooks, now: Hooks) -> str:
    """Where the hooks `now` differ from those the step was `traced` with."""
    return where(model, tuple(sorted(set(traced) ^ set(now))))
