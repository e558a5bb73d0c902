"""How an optimized module is copied, pickled and saved: its model's state, its compiled
steps shared (NOTE [Compiled around])."""
from __future__ import annotations

import copy
from typing import Any

from monet_opt.forwarded import ToModel


# NOTE [Compiled around]
#   The step is already compiled (AOTAutograd's graphs, running eager's kernels under the plan),
#   so torch.compile around the optimized module has nothing to add, and what it did was harmful:
#   Dynamo traced our Python, and a step planned under it (a new batch shape, gradients in
#   place) was traced inside Dynamo's trace and failed (CaptureError on tests/models.py's small
#   CNN at a batch of 3 after 4). So forward is torch.compiler.disable'd: torch.compile(opt)
#   runs opt as it is, the code around it compiled (tests/test_wrapping.py). The steps are
#   compiled in this process and cannot be pickled: torch.save(opt) raises a TypeError saying
#   what to save instead; a copy, shallow or deep, shares them, as any copy shares functions
#   (both are written out, since pickling's __reduce_ex__ is what copy would call).


class ModelState(ToModel):
    """state_dict() and load_state_dict() of the model's own keys, copies that share the
    compiled steps, and no pickling. `_fresh()` is the module's: a copy's own records."""

    def __reduce_ex__(self, protocol):  # NOTE [Compiled around]
        from monet_opt.output_grad import WithLoss
        # a WithLoss's keys are its network's under "model.": they load into no plain network
        weights = "torch.save(opt.model.model.state_dict(), path) (the network's own keys; " \
            "opt.state_dict() has the WithLoss's, prefixed \"model.\")" \
            if isinstance(self.model, WithLoss) else \
            "torch.save(opt.state_dict(), path) (the model's own keys)"
        raise TypeError(
            "monet_opt: an optimized module cannot be pickled (torch.save(opt), pickle): its "
            f"steps are graphs compiled in this process. Save the model's weights, {weights}, "
            "or the model, opt.model; after loading, call monet_opt.optimize() again: with its "
            "profile directory (the default) it neither profiles nor solves again.")

    def __copy__(self) -> ModelState:
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin._fresh()

    def __deepcopy__(self, memo: dict) -> ModelState:
        """A copy of the module and its model, sharing compiled steps as it would functions."""
        twin = memo[id(self)] = type(self).__new__(type(self))
        twin.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return twin._fresh()

    # NOTE [The model's own keys]
    #   state_dict() has the model's own keys, not prefixed with "model.", so a checkpoint of
    #   the optimized module loads into the plain model and back. Inside a larger model (a
    #   backbone optimized on its own), the parent's state_dict() asks this module for its keys
    #   under its prefix ("backbone.0.weight"), and its load_state_dict() loads each module's
    #   own from those keys, so this module maps them back under "model." before its model
    #   loads them: the parent's round trip failed ("Missing key(s) backbone.model.0.weight"),
    #   and with strict=False loaded nothing into the backbone, silently
    #   (tests/test_wrapping.py).
    def state_dict(self, *args: Any, **kwargs: Any):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    def _load_from_state_dict(self, state_dict, prefix: str, *args: Any) -> None:
        own = {prefix + key for key in self.model.state_dict(keep_vars=True)}
        for key in [key for key in state_dict if key in own]:  # the parent's own copy
            state_dict[f"{prefix}model.{key[len(prefix):]}"] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args)
