"""What a user would pick instead of monet_opt, applied to the same model: torch.utils.checkpoint
(√n segments of a sequential model, or every block) and torch.compile's activation memory budget.

Every wrapper works on a deep copy (the benchmark's other methods share the original) and
reports the copy's parameters in the original's order, so gradients compare one to one.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


@dataclass(frozen=True)
class Wrapped:
    module: nn.Module
    params: tuple[torch.Tensor, ...]   # aligned with the original model's parameters()


# A checkpoint peer: a name and how to build it from the model.
@dataclass(frozen=True)
class CheckpointPeer:
    name: str
    describe: str
    build: Callable[[nn.Module], Wrapped]


def _copy(model: nn.Module) -> tuple[nn.Module, Callable[[], tuple[torch.Tensor, ...]]]:
    memo: dict[int, object] = {}
    clone = copy.deepcopy(model, memo)
    return clone, lambda: tuple(memo[id(p)] for p in model.parameters())


class _SequentialCheckpoint(nn.Module):
    def __init__(self, layers: list[nn.Module], segments: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*layers)
        self.segments = segments

    def forward(self, x):
        return checkpoint_sequential(self.layers, self.segments, x, use_reentrant=False)


def sequential(layers_of: Callable[[nn.Module], list[nn.Module]]) -> CheckpointPeer:
    """checkpoint_sequential over the model's modules in execution order, round(√n) segments.
    In-place activations (VGG's ReLUs) run out of place, as a user must make them: one at a
    segment's start overwrites the input that the segment's recomputation reads, and autograd
    stops the backward with "modified by an inplace operation"."""
    def build(model: nn.Module) -> Wrapped:
        clone, aligned = _copy(model)
        for m in clone.modules():
            if getattr(m, "inplace", False) is True:
                m.inplace = False
        layers = layers_of(clone)
        segments = max(1, round(math.sqrt(len(layers))))
        return Wrapped(_SequentialCheckpoint(layers, segments), aligned())
    return CheckpointPeer("checkpoint_sequential", "torch.utils.checkpoint.checkpoint_sequential, "
                          "round(sqrt(n)) segments over the model's n modules", build)


class _Checkpointed(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        # NOTE [Snapshot list arguments]: the recomputation in the backward calls the block with
        # these same argument objects. DenseNet passes the list of previous features and then
        # appends to it, so the recomputation would see a longer list: give it a copy.
        args = tuple(list(a) if isinstance(a, list) else a for a in args)
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def per_block(*block_types: type | str, label: str) -> CheckpointPeer:
    """torch.utils.checkpoint around every submodule of one of `block_types` (classes, or
    "package.module.Class" names imported when the peer is built)."""
    def build(model: nn.Module) -> Wrapped:
        types = tuple(_resolve(t) for t in block_types)
        clone, aligned = _copy(model)
        sites = [(parent, name) for parent in clone.modules()
                 for name, child in parent.named_children() if isinstance(child, types)]
        for parent, name in sites:
            setattr(parent, name, _Checkpointed(getattr(parent, name)))
        return Wrapped(clone, aligned())
    return CheckpointPeer("checkpoint per block", f"torch.utils.checkpoint around every {label}",
                          build)


def _resolve(t: type | str) -> type:
    if isinstance(t, type):
        return t
    module, _, name = t.rpartition(".")
    return getattr(importlib.import_module(module), name)


def hf_blocks() -> CheckpointPeer:
    """Hugging Face's own per-layer checkpointing (`gradient_checkpointing_enable()`), on the
    transformers model inside the zoo's one-output wrapper."""
    def build(model: nn.Module) -> Wrapped:
        clone, aligned = _copy(model)
        hf = clone.model
        if hasattr(hf, "activation_checkpointing_enable"):  # its name from transformers 5.x on
            hf.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            hf.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        return Wrapped(clone, aligned())
    return CheckpointPeer("checkpoint per block", "Hugging Face activation (gradient) "
                          "checkpointing on every transformer layer, non-reentrant", build)


@contextlib.contextmanager
def compile_settings(budget: float) -> Iterator[None]:
    """A fresh dynamo with torch._functorch.config.activation_memory_budget = `budget` (read when
    the graph is partitioned, at the first call). AOTAutograd's cache is off, so no partition is
    reused across budgets."""
    import torch._dynamo
    import torch._functorch.config as functorch_config
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with functorch_config.patch(activation_memory_budget=budget, enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


def compiled(model: nn.Module, backend: str) -> Wrapped:
    """torch.compile of the model itself (it shares the model's parameters)."""
    return Wrapped(torch.compile(model, backend=backend), tuple(model.parameters()))


def compile_note() -> tuple[str, bool]:
    """What dynamo did since `compile_settings` began, and whether it really compiled (a frame
    compiled, no graph break)."""
    from torch._dynamo.utils import counters
    frames = counters["frames"]
    breaks = sum(counters["graph_break"].values())
    graphs = counters["stats"].get("unique_graphs", 0)
    ok = frames.get("ok", 0) >= 1 and breaks == 0
    return f"graphs {graphs}, graph breaks {breaks}", ok
