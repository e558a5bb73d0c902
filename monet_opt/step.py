"""One planned step of an optimized module (Step), and what tells steps apart (step_key)."""
from __future__ import annotations

import dataclasses
import operator
from itertools import repeat
from typing import Callable

import torch
from torch import nn

from monet_opt.accumulate import GradientSlots
from monet_opt.input_spec import InputSpec
from monet_opt.memory import resident_bytes
from monet_opt.plan import Plan
from monet_opt.units import format_bytes


class ReplanWarning(RuntimeWarning):
    """The optimized module planned another step: for inputs of new shapes (NOTE [New input
    shapes] in monet_opt/module.py), for gradients resident at the step's start (NOTE
    [Gradients resident at the start] in monet_opt/accumulate.py), or for anything else that
    tells steps apart (step_key)."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One traced training step and its plan, for inputs of one shape and a step that begins
    with `resident_bytes` of gradients in place, those of the parameters at positions
    `resident` among them. run(*params, *buffers, *attributes, *inputs) runs it; inputs
    describes the inputs ('float32[4x3x16x16]'); slots: where its backward adds gradients in
    place (NOTE [Accumulating in place]), bound to the parameters before each run."""

    run: Callable
    spec: InputSpec
    plan: Plan
    inputs: str
    resident: tuple[int, ...] = ()
    resident_bytes: int = 0
    slots: GradientSlots | None = None
    frozen: int = 0  # parameters traced without requires_grad
    shared: tuple[tuple[int, ...], ...] = ()  # inputs sharing a storage (storage_groups)
    changed: str = ""  # module attributes changed since optimize() (Watched.changed)
    kept: tuple[tuple[str, str], ...] = ()  # (module, attribute) it keeps tensors on
    attributes: tuple[str, ...] = ()  # the tensor attributes it takes after the buffers
    outputs_held: bool = False  # planned with its outputs held to its end (held_outputs.py)
    saved_inputs: tuple[int, ...] = ()  # inputs its backward keeps (NOTE [Inference tensors kept])
    feeding: tuple[int, ...] = ()  # outputs others are computed from (output_hooks.py)
    held: tuple = ()  # containers whose tensors it holds as constants (held_in.py)

    @property
    def label(self) -> str:
        grads = [str(k) for k, leaf in enumerate(self.spec.leaves) if leaf.requires_grad]
        laid = "".join(f", input {k} {leaf.sparse[0]} with {leaf.sparse[1]} entries"
                       if leaf.sparse else f", input {k} with strides {leaf.strides}"
                       for k, leaf in enumerate(self.spec.leaves)  # NOTEs [Input layouts],
                       if leaf.sparse or not leaf.contiguous)  # [Sparse inputs]
        return self.inputs + laid + \
            (f", input {' and '.join(grads)} requiring grad" if grads else "") \
            + (f", {format_bytes(self.resident_bytes)} of gradients resident"
               if self.resident_bytes else "") + \
            (f", {self.frozen} parameters frozen" if self.frozen else "") + \
            "".join(f", inputs {' and '.join(map(str, g))} share a storage" for g in self.shared) \
            + (f", with {self.changed}" if self.changed else "") \
            + (", outputs held through the backward" if self.outputs_held else "")


def resident_gradient_bytes(model: nn.Module, inputs: list[torch.Tensor], params: bool) -> int:
    """Bytes of the gradients in place now (storages counted once): the parameters' where
    `params`, and the inputs' (NOTE [Inputs' gradients in place])."""
    grads = [p.grad for p in model.parameters() if p.grad is not None] if params else []
    grads += [x.grad for x in inputs if x.requires_grad and x.is_leaf and x.grad is not None]
    return resident_bytes(grads) if grads else 0


# NOTE [Inputs' gradients in place]
#   A leaf input that requires a gradient and already has one (adversarial training zeroing
#   x.grad in place between steps, or input gradients accumulated over backwards) holds it
#   through the step, as a parameter's gradient in place is held (NOTE [Gradients resident at
#   the start] in monet_opt/accumulate.py), and autograd adds the new one into it after the
#   step's backward. It was not counted: a PGD loop measured 12,288 B (its x.grad) over its
#   plan at store-all and at the least peak, silently (gradient probe, 2026-12-06). Its bytes
#   are now among the gradients resident, so such a step is planned apart with them as fixed
#   memory; its new gradient, held to the backward's end, was counted already.


_GRAD, _IS_LEAF = operator.attrgetter("grad"), operator.attrgetter("is_leaf")


def resident_positions(params: list[torch.Tensor]) -> tuple[int, ...]:
    """Where among `params` a gradient is in place. functional_call(opt, fast_weights) gives
    non-leaf parameters, which hold none (and warn when asked)."""
    grads = list(map(_GRAD, params)) if all(map(_IS_LEAF, params)) else \
        [p.grad if p.is_leaf else None for p in params]
    if all(map(operator.is_, grads, repeat(None))):
        return ()
    return tuple(k for k, grad in enumerate(grads) if grad is not None)


def step_key(structure: tuple, leaves: tuple, params: tuple, resident: tuple[int, ...],
             resident_bytes: int, shared: tuple, traced: tuple, values: tuple) -> tuple:
    """What tells steps apart: the inputs' structure (treedef and constants) and specs, the
    parameters' key, the gradients in place, the inputs that share a storage, what the step is
    `traced` with (autocast state, module hooks, outputs held by the caller), the modules'
    watched values, last (NOTE [New input shapes] and NOTE [Parameters changed] in
    monet_opt/module.py, NOTE [Inputs that share a storage] in monet_opt/memory.py, NOTE
    [Autocast is traced] in monet_opt/capture.py, NOTE [Module hooks] in monet_opt/hooks.py,
    NOTE [Outputs held through the backward] in monet_opt/held_outputs.py, NOTE [Attributes
    read as constants] in monet_opt/attributes.py)."""
    return structure, leaves, params, resident, resident_bytes, shared, traced, values


def _PARAM(t: torch.Tensor) -> tuple:
    return t.shape, t.dtype, t.device, t.requires_grad, t.stride()


def _BUFFER(t: torch.Tensor) -> tuple:
    return t.shape, t.dtype, t.device, t.stride()


def param_key(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> tuple:
    """What a traced step fixes of the parameters and buffers: their names, and each one's
    shape, dtype, device, strides (a model made channels-last after optimize() ran the step
    traced for its contiguous weights: gradients 7e-6 from eager's, or a view the new
    layout does not allow) and, a parameter's, requires_grad (NOTE [Parameters changed] in
    monet_opt/module.py)."""
    return (tuple(params), tuple(map(_PARAM, params.values())),
            tuple(buffers), tuple(map(_BUFFER, buffers.values())))


def describe_autocast(state: tuple) -> str:
    kernels = ("flash", "memory-efficient", "math", "cuDNN")
    switches = {"cudnn": "cuDNN", "mkldnn": "oneDNN", "deterministic": "deterministic algorithms"}
    return ", ".join(f"{switches[device]} {'on' if dtype else 'off'}" if device in switches else
                     f"default dtype {dtype}" if device == "dtype" else
                     f"{dtype} threads" if device == "threads" else
                     f"float32 matmul precision {dtype}" if device == "matmul" and
                     isinstance(dtype, str) else "float32 precision " + ", ".join(
                         f"{path or 'all'} {value}" for path, value in dtype)
                     if device == "matmul" else
                     "kernels' scratch unmeasured (inside torch.profiler)" if device == "scratch"
                     else "outputs made float32 (accelerate's mixed precision)"
                     if device == "outputs"
                     else
                     f"autocast on for {device} ({dtype})" if device != "sdpa" else
                     "attention kernels " + "/".join(k for k, on in zip(kernels, dtype) if on)
                     for device, dtype in state) or "autocast off, kernels as at import"
