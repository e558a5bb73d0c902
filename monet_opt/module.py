"""The module optimize() returns."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from monet_opt.capture import InputSpec, autocast_state
from monet_opt.errors import PlanMismatchError
from monet_opt.plan import Plan


class OptimizedModule(nn.Module):
    """Runs `model`'s training step under a memory plan.

    It holds `model` as its only child, so it shares every parameter and buffer: optimizers,
    `.train()`/`.eval()` and `.to()` act on the model itself, and `state_dict()` has the model's
    own keys. With gradients disabled or in eval mode it simply calls the model (nothing is kept
    for a backward, so there is nothing to plan).
    """

    def __init__(self, model: nn.Module, step: Callable, spec: InputSpec, plan: Plan,
                 param_names: list[str], buffer_names: list[str],
                 training_flags: tuple[bool, ...], autocast: tuple = ()) -> None:
        super().__init__()
        self.model = model
        self.plan = plan
        self._step = step
        self._spec = spec
        self._param_names = param_names
        self._buffer_names = buffer_names
        self._training_flags = training_flags
        self._autocast = autocast

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled() or not self.training:
            return self.model(*args, **kwargs)
        inputs = self._spec.flatten(args, kwargs)
        if autocast_state() != self._autocast:
            raise PlanMismatchError(
                f"monet_opt: this step runs with autocast {_describe(autocast_state())}, but the "
                f"model was optimized with autocast {_describe(self._autocast)}: the plan's graph "
                "holds the casts it was traced with. Call optimize() inside the same "
                "torch.autocast context you train in (or outside autocast for both).")
        flags = tuple(m.training for m in self.model.modules())
        if flags != self._training_flags:
            raise PlanMismatchError(
                "monet_opt: the model's train/eval flags differ from when it was optimized "
                "(some submodules were switched). Restore them, or optimize() again in this mode.")
        params = dict(self.model.named_parameters())
        buffers = dict(self.model.named_buffers())
        state = [params[n] for n in self._param_names] + [buffers[n] for n in self._buffer_names]
        return self._step(*state, *inputs)

    # state_dict keys are the model's own, not prefixed with "model."
    def state_dict(self, *args: Any, **kwargs: Any):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    def extra_repr(self) -> str:
        return (f"memory_limit={self.plan.memory_limit_bytes}, solver={self.plan.solver!r}, "
                f"predicted_peak={self.plan.predicted_peak_bytes}")


def _describe(state: tuple) -> str:
    return ", ".join(f"on for {device} ({dtype})" for device, dtype in state) or "off"
