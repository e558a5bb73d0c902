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
            return getattr(model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        model = self._model()
        if self._own(name, model):
            super().__setattr__(name, value)
        else:
            setattr(model, name, value)

    def __delattr__(self, name: str) -> None:
        model = self._model()
        if self._own(name, model) or name in self._parameters or name in self._buffers:
            super().__delattr__(name)
        else:
            delattr(model, name)
