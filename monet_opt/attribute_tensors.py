"""Tensors a model's modules hold as plain attributes: inputs of the traced step.

NOTE [Tensors held as attributes]
  A tensor a module holds as a plain attribute (not a parameter or buffer: a mask or a scale
  set with self.scale = t, a state carried from one step to the next) was read by the traced
  step as a constant: the tensor object itself, so an update in place showed, but one assigned
  anew after optimize() did not (outputs 0.88, 2.65, 6.19 from eager's over three steps of
  doubling it, silently). Such tensors, found when the step is traced, are inputs of the step
  now, after the buffers, read from the modules at every call; one the forward assigns anew is
  kept as the forward left it (NOTE [Tensors kept on a module]), never written into the old
  tensor. Their shapes, dtypes and devices are in the step's key (NOTE [Attributes read as
  constants]): another plans a step. A tensor attribute added after optimize() is not read.

NOTE [Attributes set before read]
  A tensor attribute the forward sets before it reads it is an input of the step that the
  step never reads: torch.nn.utils.spectral_norm's forward pre-hook sets `module.weight`
  from `weight_orig` at every call (weight_norm and prune's hooks alike). At the next step
  that input is the tensor the last step kept there, made by the last step's graph; where the
  trace had seen it without a gradient (spectral_norm leaves `weight.data` there), the step
  handed autograd an edge into the last step's freed graph, and the second step raised
  "Trying to backward through the graph a second time" (a conv net, SGD, zero_grad between
  steps). The joint graph tells which such inputs nothing reads; the step is handed them
  detached. tests/models.py's SmallCNN with every convolution and its linear layer so wrapped
  now trains bitwise like eager at its least plan, the power iterations' buffers too
  (tests/test_weight_hooks.py). Such an input is still counted as fixed memory, though the
  step frees it once the forward is done: on that CNN (b4, 16²) the store-all plan predicted
  11,188 B over its measured peak (with the last step's weights held by the caller), where
  parametrizations.spectral_norm, which keeps no weight on the module, is 208 B over.
"""
from __future__ import annotations

from typing import Any

import torch

from monet_opt.errors import PlanMismatchError


def attribute_names(model: torch.nn.Module) -> list[str]:
    """The dotted names of the tensors the model's modules hold as plain attributes, each
    tensor once and none that is a parameter or buffer (NOTE [Tensors held as attributes])."""
    seen = {id(t) for t in (*model.parameters(), *model.buffers())}
    names = []
    for (name, attribute), t in tensor_attributes(model).items():
        if id(t) not in seen:
            seen.add(id(t))
            names.append(".".join(filter(None, (name, attribute))))
    return names


def aliases(model: torch.nn.Module) -> dict[str, str]:
    """NOTE [Attributes that are parameters or buffers]
      A plain attribute holding a parameter or buffer itself (`self.alias = self.child.buf`)
      is no input of its own, and the trace, which swaps the parameters and buffers for its
      own tensors, read it as the real tensor, a constant: where the forward updated that
      buffer in place (an EMA under no_grad) and then read the attribute, the first backward
      failed autograd's version check, or, read otherwise, the step was silently off eager's
      (loss 1.3e-3 off: buffers fuzz, 2026-12-06). The trace now swaps such an attribute with
      what it holds. {attribute's dotted name: the parameter's or buffer's}; the tensor the
      attribute held when the step was traced is the one the step reads."""
    named: dict[int, str] = {}
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        named.setdefault(id(t), name)
    return {".".join(filter(None, (name, attribute))): named[id(t)]
            for (name, attribute), t in tensor_attributes(model).items() if id(t) in named}


def attribute_values(model: torch.nn.Module, names: tuple[str, ...]) -> list[torch.Tensor]:
    """The tensors under `names` (attribute_names) now; PlanMismatchError for one that is no
    longer a tensor (an attribute added after optimize(), which the key does not watch)."""
    values = []
    for name in names:
        owner, _, attribute = name.rpartition(".")
        value = getattr(model.get_submodule(owner), attribute, None)
        if not isinstance(value, torch.Tensor):
            raise PlanMismatchError(
                f"monet_opt: the step was traced with a tensor in the attribute {name!r}, which "
                f"now holds {type(value).__name__}: a value the step reads as an input. Keep a "
                "tensor there, or optimize() again.")
        values.append(value)
    return values


# NOTE [A module under two names]
#   A module registered twice (`self.seq = nn.Sequential(self.lin, ...)` beside `self.lin`) is
#   reached under two names, and torch.func.functional_call, putting the model's tensors back
#   name by name, put back under the second what it had swapped in under the first: after
#   optimize() the model held the trace's FunctionalTensors as its parameters and every step
#   raised "Attempting to use FunctionalTensor on its own" (torch 2.14). Each module's
#   parameters and buffers are put back as they were before the call.
# NOTE [A parameter held as a plain attribute]
#   A Parameter kept on a module outside its registry (object.__setattr__, so that it is not
#   trained or saved twice) is a tensor held as an attribute, an input of the step; functional
#   call swapped it in and out with setattr, which registered it as a parameter of the module:
#   after optimize() the model had a parameter more, the step took its parameters in another
#   order and failed, or, where the shapes agreed, ran on the wrong tensors (an output of shape
#   16x16 where eager's is 4x16; falsepos probe, 2026-12-07). It is put back where it was.
def call_with(module: torch.nn.Module, state: dict, args: tuple, kwargs: dict,
              attributes: list[str]) -> Any:
    """functional_call of `module` with `state`; an attribute of `attributes` the forward
    assigns anew is left on its module (functional_call would put the old one back), for Kept
    to take as a kept tensor (NOTE [Tensors held as attributes])."""
    given = {name: state[name] for name in attributes if name in state}
    held = {id(m): (m, dict(m._parameters), dict(m._buffers),
                    {k: v for k, v in vars(m).items() if isinstance(v, torch.Tensor)})
            for m in module.modules()
            if not isinstance(m, torch.jit.ScriptModule)}  # its tables are torch's C++ ones
    try:
        outputs = torch.func.functional_call(module, state, args, kwargs)
    finally:  # NOTEs [A module under two names], [A parameter held as a plain attribute]
        for owner, parameters, buffers, plain in held.values():
            for table, was in ((owner._parameters, parameters), (owner._buffers, buffers)):
                table.update((k, v) for k, v in was.items() if table.get(k) is not v)
                for k in [k for k in table if k not in was and k in plain]:
                    del table[k]
            vars(owner).update((k, v) for k, v in plain.items() if k not in vars(owner))
    for name, old in given.items():
        if state[name] is not old:
            owner, _, attribute = name.rpartition(".")
            setattr(module.get_submodule(owner), attribute, state[name])
    return outputs


def tensor_attributes(module: torch.nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    """Every tensor held as a plain attribute (not a parameter or buffer) of a submodule."""
    return {(name, k): v for name, m in module.named_modules() for k, v in vars(m).items()
            if isinstance(v, torch.Tensor)}
