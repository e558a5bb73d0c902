"""Tensors a module holds in a list, tuple or dict, which the step reads as constants.

NOTE [Tensors held in containers]
  A tensor held as a plain attribute is an input of the step (NOTE [Tensors held as
  attributes] in monet_opt/attribute_tensors.py); one held in a list, tuple or dict on a
  module (a recurrent memory's `self.mems = (k, v)`, as Transformer-XL carries it) was read by
  the trace as a constant: the tensor itself, so an update in place showed, but a tuple
  assigned anew, an element replaced or one appended after optimize() did not: outputs 3.6,
  7.2 and 10.8 from eager's over three steps, and 5.5 to 71 for a list, silently (adaptive
  probe, 2026-12-07). The step now notes each container whose tensors it holds as constants
  (those whose storages the joint graph's constants are), with its length or keys and those
  tensors; a call that finds the container otherwise raises PlanMismatchError, saying to keep
  each tensor as an attribute of its own (an input of the step, read at every call) or a
  buffer, or to pass it to the call. A container the forward does not read is not noted
  (features a hook gathers: NOTE [Containers filled] in monet_opt/forward_state.py), and one
  holding what it held when the step was traced (torchvision's anchor generator's cell
  anchors) runs as before. Lists and tuples one level inside are looked into (`self.mems =
  [(k, v)]`: a pair replaced went unseen), and a dict's keys the step does not read may come
  and go (a rotary cache filled by length, to which a validation pass added one, was refused).
  Not caught: a deep copy of the optimized module shares its compiled steps, constants
  included, so its model's copies of such tensors are not what its step reads (an update in
  place to one side only is not seen by the other).
"""
from __future__ import annotations

import dataclasses
from operator import attrgetter

import torch
import torch.fx as fx
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from monet_opt.errors import PlanMismatchError

_CONTAINERS = (list, tuple, dict)


@dataclasses.dataclass(frozen=True)
class Held:
    """A container on module `path` under `name`, and the tensors of it the step holds as
    constants: (where, tensor) pairs, `where` the keys down to it (one level of containers in
    it too: `self.mems = [(k, v)]`), and the lengths of the lists and tuples on the way (a
    dict's other keys are free: a cache filled by length, read by key)."""

    path: str
    name: str
    tensors: tuple[tuple[tuple, torch.Tensor], ...]
    lengths: tuple[tuple[tuple, int], ...]

    def label(self) -> str:
        return ".".join(filter(None, (self.path, self.name)))


def constant_storages(joint: fx.GraphModule) -> frozenset[int]:
    """The storages of the real tensors `joint` holds as constants."""
    found = set()
    for node in joint.graph.find_nodes(op="get_attr"):
        value = attrgetter(node.target)(joint)
        if _real(value):
            found.add(value.untyped_storage().data_ptr())
    found.discard(0)
    return frozenset(found)


def held_in(model: nn.Module, storages: frozenset[int]) -> tuple[Held, ...]:
    """The containers on `model`'s modules holding tensors of `storages` (constant_storages)."""
    if not storages:
        return ()
    found = []
    for path, module in model.named_modules():
        for name, value in vars(module).items():
            if not isinstance(value, _CONTAINERS) or name in ("_parameters", "_buffers"):
                continue
            tensors = tuple((where, t) for where, t in _leaves(value) if _real(t)
                            and t.untyped_storage().data_ptr() in storages)
            if tensors:
                lengths = {where[:k]: len(_at(value, where[:k])) for where, _ in tensors
                           for k in range(len(where)) if isinstance(_at(value, where[:k]),
                                                                    (list, tuple))}
                found.append(Held(path, name, tensors, tuple(lengths.items())))
    return tuple(found)


def check(model: nn.Module, held: tuple[Held, ...]) -> None:
    """PlanMismatchError where a container of `held` holds other tensors than the step's."""
    for h in held:
        value = getattr(model.get_submodule(h.path), h.name, None)
        try:
            if all(len(_at(value, where)) == n for where, n in h.lengths) and \
                    all(_at(value, where) is t for where, t in h.tensors):
                continue
        except (KeyError, IndexError, TypeError):
            pass
        kind = type(value).__name__ if isinstance(value, _CONTAINERS) else "attribute"
        raise PlanMismatchError(
            f"monet_opt: the step reads the tensors in the {kind} {h.label()!r} as constants, "
            "those it held when the step was traced, and it holds others now (assigned anew, "
            "replaced or added), which the step would not read. Keep each such tensor as an "
            "attribute of its own (self.mem_k = k: an input of the step, read at every call) "
            "or a buffer, or pass it to the call, or update the tensors in place (NOTE "
            "[Tensors held in containers] in monet_opt/held_in.py).")


def _leaves(value, depth: int = 0) -> list[tuple[tuple, object]]:
    """(keys down to it, element) for `value`'s elements, and one level of containers down."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    return [((k, *where), x) for k, v in items
            for where, x in (_leaves(v, 1) if depth == 0 and isinstance(v, _CONTAINERS)
                             else [((), v)])]


def _at(value, where: tuple):
    for k in where:
        value = value[k]
    return value


def _real(value: object) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor) and \
        value.layout == torch.strided
