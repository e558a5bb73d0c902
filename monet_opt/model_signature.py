"""The class of the module optimize() returns, made for the model it wraps."""
from __future__ import annotations

import functools
import inspect
from typing import Any

from torch import nn

from monet_opt.module import OptimizedModule


# NOTE [The model's signature]
#   Code that calls a model often reads its forward's signature first: HF's Trainer drops every
#   batch column the signature does not name (`remove_unused_columns`, from the instance's
#   forward) and finds the label columns from the class's, so with a forward of (*args,
#   **kwargs) it dropped every column and stopped ("The batch received was empty"). So
#   optimize() returns an instance of a subclass made for the model, whose forward is
#   OptimizedModule's under the model's forward's signature, on the class as on the instance.
#   Nothing of it is per instance: a deep copy shares the class, as it would OptimizedModule.
def for_model(model: nn.Module) -> type[OptimizedModule]:
    """OptimizedModule, or a subclass whose forward has `model`'s forward's signature."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a forward Python cannot describe: the step's own
        return OptimizedModule

    @functools.wraps(OptimizedModule.forward, assigned=("__doc__",))
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return OptimizedModule.forward(self, *args, **kwargs)
    me = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)  # first, whatever follows
    forward.__signature__ = signature.replace(parameters=[me, *signature.parameters.values()])
    return type("OptimizedModule", (OptimizedModule,),
                {"forward": forward, "__module__": OptimizedModule.__module__,
                 "__qualname__": f"OptimizedModule[{type(model).__qualname__}]"})
