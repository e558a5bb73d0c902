"""The model's modules, parameters and buffers as a step's call finds them.

NOTE [Names kept between walks]
  Every call of the optimized module walks the model for what its step takes (the parameters
  and buffers, in order) and for what picks the step (NOTE [Parameters changed] in
  monet_opt/module.py keys steps by each tensor's name). Walking the tree with torch's
  named_modules() and naming each tensor as torch does
  ('features.denseblock1.denselayer1.norm1.weight', built from every prefix on the way down)
  took 0.7 ms a call on DenseNet-121's 433 modules and 727 tensors: on a GPU, time the device
  waits through. What the walk finds follows from the modules it visited, in order, and each
  one's children, parameters and buffers: their keys and which objects they are. So a walk
  keeps the modules it found and their names, and the next one first reads those modules'
  children, parameters and buffers (a few passes of C-level map() over the modules, no tree
  walk, no names); where all are as before, so is the walk, and only a change (a module added,
  replaced, removed or renamed, weights tied, a parameter assigned anew) walks and names
  again. The result is torch's modules(), named_parameters() and named_buffers(), the same in
  the same order (tests/test_walk.py).
"""
from __future__ import annotations

import operator
from itertools import chain

import torch
from torch import nn

Found = tuple[list[nn.Module], dict[str, torch.Tensor], dict[str, torch.Tensor]]


class Walk:
    """walk(model), kept from the last call where the modules it found are as they were, and
    `layout`, theirs (NOTE [A slot pointed at another module])."""

    def __init__(self) -> None:
        self._record: tuple | None = None
        self._modules: list[nn.Module] = []
        self.layout: tuple = ()
        # per kind: the names, and where in _read's list (Nones and ties in it) each tensor is
        self._names: list[tuple[tuple[str, ...], tuple[int, ...]]] = []

    def __call__(self, model: nn.Module) -> Found:
        modules = self._modules
        if modules and modules[0] is model:
            record, *own = _read(modules)
            if record == self._record:
                return (modules, *(dict(zip(names, map(tensors.__getitem__, at)))
                                   for (names, at), tensors in zip(self._names, own)))
        found = walk(model)
        self._record, *own = _read(found[0])
        self._modules = found[0]
        self.layout = layout(found[0])
        self._names = [(tuple(named), _places(named.values(), tensors))
                       for named, tensors in zip(found[1:], own)]
        return found


# NOTE [A slot pointed at another module]
#   modules() names each module once, under its first name, so two models whose slots hold the
#   same modules otherwise (a multi-task loop's `model.head = model.heads[task]`; a depth
#   schedule's `self.active = nn.ModuleList(self.layers[i] for i in subset)`) walk alike: the
#   same modules, parameters and buffers, in the same order. A step traced with `head` as
#   `heads[0]` ran on as it after `head` was pointed at `heads[1]`, training the first head
#   where eager trains the second (outputs 0.51 off; schedules probe, 2026-12-07). So which
#   module each slot holds (its place in modules()) is part of a step's key (NOTE [Parameters
#   changed] in monet_opt/module.py): another layout is planned anew, as a module replaced is.
def layout(modules: list[nn.Module]) -> tuple:
    """Where in `modules` (model.modules()) each one's children are (None: a slot holding
    None)."""
    at = {id(m): k for k, m in enumerate(modules)}
    return tuple(tuple(None if c is None else at.get(id(c)) for c in _VALUES(_CHILDREN(m)))
                 for m in modules)


def moved(model: nn.Module, before: tuple, now: tuple) -> str:
    """"module 'head' heads.0 -> heads.1, ...": the slots holding other modules than in
    layout `before` (both of `model`'s modules as they are now; none where modules were
    added or removed: the values watched say so)."""
    if len(before) != len(now):
        return ""
    names = [name or "the model" for name, _ in model.named_modules()]
    shown = lambda at: "None" if at is None else names[at]  # noqa: E731
    found = []
    for k, (module, old, kids) in enumerate(zip(model.modules(), before, now)):
        if len(old) != len(kids):
            found.append(f"module {names[k]!r} holds {len(kids)} modules, not {len(old)}")
            continue
        found += [f"module {(f'{names[k]}.{key}' if k else key)!r} {shown(was)} -> {shown(new)}"
                  for key, was, new in zip(_KEYS(_CHILDREN(module)), old, kids) if was != new]
    return ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")


def _places(named, tensors: list) -> tuple[int, ...]:
    """Where in `tensors` each of `named`, in order, is first."""
    first: dict[int, int] = {}
    for k, t in enumerate(tensors):
        first.setdefault(id(t), k)
    return tuple(first[id(t)] for t in named)


_CHILDREN, _PARAMS, _BUFFERS = map(operator.attrgetter, ("_modules", "_parameters", "_buffers"))
_KEYS, _VALUES = operator.methodcaller("keys"), operator.methodcaller("values")


def _read(modules: list[nn.Module]) -> tuple[tuple, list, list]:
    """What the walk's result follows from (every module's children, parameters and buffers:
    keys and objects), and the parameters and buffers in order, Nones included."""
    maps = [list(map(get, modules)) for get in (_CHILDREN, _PARAMS, _BUFFERS)]
    try:  # dict's own methods: DenseNet-121's read 0.35 ms, 0.63 through methodcaller
        own = [list(chain.from_iterable(map(dict.values, d))) for d in maps]
        keys = [list(map(tuple, d)) for d in maps]
    except TypeError:  # a torch.jit.script'ed module keeps them in mappings that are not dicts
        own = [list(chain.from_iterable(map(_VALUES, d))) for d in maps]
        keys = [list(map(tuple, map(_KEYS, d))) for d in maps]
    record = (*keys, *(tuple(map(id, values)) for values in own))
    return record, own[1], own[2]


def walk(model: nn.Module) -> Found:
    """list(model.modules()), dict(model.named_parameters()) and dict(model.named_buffers()),
    the same in the same order, from one walk over the modules where those are three (0.3 of
    the 0.57 ms a step spent outside the step itself, on a 12-layer GPT-2). A tensor tied under
    several names keeps its first; they are looked for once, after the walk (DenseNet-121's
    433 modules, least of 30 rounds: 0.76 ms a call, 0.91 checking each tensor as found)."""
    modules: list[nn.Module] = []
    params: dict[str, torch.Tensor] = {}
    buffers: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        modules.append(module)
        own_params, own_buffers = module._parameters, module._buffers
        if own_params or own_buffers:
            dot = prefix + "." if prefix else ""
            for found, members in ((params, own_params), (buffers, own_buffers)):
                for name, t in members.items():
                    if t is not None:
                        found[dot + name] = t
    return modules, _first_names(params), _first_names(buffers)


def _first_names(found: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`found` with each tensor under its first name only."""
    if len(set(map(id, found.values()))) == len(found):
        return found
    seen: set[int] = set()
    return {name: t for name, t in found.items() if id(t) not in seen and not seen.add(id(t))}
