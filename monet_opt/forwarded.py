"""NOTE [The model's attributes through the optimized module]
  An optimized module stands for its model as torch.compile's does: past its own attributes
  (`model`, `plan`, `plans`, its private state), an attribute read, set or deleted on it is the
  model's. Reads went through before (opt.fc; functional_call(opt, opt.state_dict(), x), whose
  "0.weight" raised a bare AttributeError: NOTE [The model's own keys] in module.py); writes
  stayed on the wrapper: `opt.scale = 2.0; opt.act = nn.Tanh()` read back 2.0 while the step
  ran the model's 1.0 and ReLU (outputs 1.17 from eager's), and the Tanh became a second child,
  its parameters among opt.parameters(). Now they set the model's, which the step watches (NOTE
  [Attributes read as constants]: a new value or module is planned for, with a ReplanWarning).
  The wrapper's own state is what it set before `ready()` (its __init__'s end), and a private
  name the model lacks.

NOTE [Registered through it]
  `opt.register_parameter("logit_scale", p)` (or register_buffer, add_module) kept it on the
  wrapper: among opt.parameters(), so the optimizer trained it, but not in opt.state_dict(),
  which is the model's, and a strict load into a fresh one matched "all keys" and left it as
  built: a trained value lost from every checkpoint, silently (persist probe, 2026-12-07).
  They register on the model, as setting the attribute does.

NOTE [Named as the model]
  HF's Trainer with label_smoothing_factor shifts the labels (each token predicts the next)
  only where `unwrap_model(model)._get_name()` names a causal-LM class, and accelerate's
  unwrap_model does not look inside an optimized module: "OptimizedModule" trained GPT-2 to
  predict each token itself, silently (loss 4.2322 against eager's 4.5845; accelerate probe,
  2026-12-06). `_get_name()`, which nn.Module keeps for its repr, names the model's class;
  the repr still reads "OptimizedModule(...)".

NOTE [DDP's names to ignore]
  DistributedDataParallel leaves out of its all-reduce the parameters and buffers named in
  its module's `_ddp_params_and_buffers_to_ignore` (set by
  DDP._set_params_and_buffers_to_ignore_for_model), matched against the module's own names:
  the optimized module's carry "model.". Set on the model before optimize() (read through the
  wrapper) or on the optimized module with the model's names, nothing matched and each rank's
  "private" parameters were averaged across ranks, silently (0.994 apart in eager, 0 here).
  The list is kept on the model in its names, and read through the wrapper in the wrapper's.
"""
from __future__ import annotations

from typing import Any

from torch import nn


class ToModel(nn.Module):
    """An nn.Module holding `model`, whose other attributes are the model's."""

    def _model(self) -> nn.Module | None:
        return self.__dict__.get("_modules", {}).get("model")

    def _own(self, name: str, model: nn.Module | None) -> bool:
        """Whether `name` is the wrapper's: any set before `ready()` or now in its __dict__,
        the class's, or private and not the model's."""
        return model is None or not self.__dict__.get("_ready") or name == "model" or \
            name in self.__dict__ or hasattr(type(self), name) or \
            (name[:1] == "_" and not hasattr(model, name))

    def ready(self) -> None:
        """From now on, attributes the wrapper lacks are set on the model."""
        self.__dict__["_ready"] = True

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            model = self._model()
            if model is None:
                raise
            value = getattr(model, name)
            if name == DDP_IGNORE and self.__dict__.get("_ready"):  # NOTE [DDP's names to ignore]
                own = _names(model)
                value = [f"model.{n}" if n in own else n for n in value]
            return value

    def __setattr__(self, name: str, value: Any) -> None:
        model = self._model()
        if name == DDP_IGNORE and model is not None and self.__dict__.get("_ready"):
            own = _names(model)
            value = [n[6:] if n not in own and n.startswith("model.") and n[6:] in own else n
                     for n in value]
            setattr(model, name, value)  # NOTE [DDP's names to ignore]
        elif self._own(name, model):
            super().__setattr__(name, value)
        else:
            setattr(model, name, value)

    def register_parameter(self, name: str, param) -> None:  # NOTE [Registered through it]
        model = self._model()
        (super() if self._own(name, model) else model).register_parameter(name, param)

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        model = self._model()
        (super() if self._own(name, model) else model).register_buffer(name, tensor, persistent)

    def add_module(self, name: str, module) -> None:  # register_module too
        model = self._model()
        (super() if self._own(name, model) else model).add_module(name, module)

    def __delattr__(self, name: str) -> None:
        model = self._model()
        if self._own(name, model) or name in self._parameters or name in self._buffers:
            super().__delattr__(name)
        else:
            delattr(model, name)


DDP_IGNORE = "_ddp_params_and_buffers_to_ignore"


def _names(model: nn.Module) -> set[str]:
    return {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
