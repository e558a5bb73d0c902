"""Numbers and flags a model's forward reads from its modules, which a traced step holds fixed.

NOTE [Attributes read as constants]
  A traced step holds every Python number its modules' forward read as it was when traced: a
  softmax temperature `self.tau` annealed between steps, a dropout's `p` changed by a schedule,
  an HF config flag. After optimize(), changing one changed nothing, silently (tau 1.0 -> 0.5
  and dropout 0.1 -> 0.5 on a small model: outputs 0.17 and 0.44 from eager's; torch.compile
  guards on such values and compiles again). So the plain values (bool, int, float, str, None,
  and tuples of them) of every module's public attributes, and of an HF `config` a module
  holds, each module's class (a Tanh replaced by a Sigmoid after optimize() ran as a Tanh:
  outputs 0.58 apart) and its train/eval flag (NOTE [Optimized in eval mode]) are part of a
  step's key, like the inputs' shapes: a change plans a step with the
  values as they are (ReplanWarning naming what changed), once per combination met. A number
  meant to change every step belongs in a buffer (`register_buffer`), changed in place or
  reassigned: buffers are inputs of the step, so no plan is made for it. A tensor held as an
  attribute (private ones too) is an input of the step as well; its shape, dtype, device,
  strides and requires_grad are watched, as is a None that may become one (NOTE [Tensors held
  as attributes] in monet_opt/forward_state.py). So is what a module's code reads from
  `self` whatever it holds (NOTE [Attributes the forward's code reads], below), and what the
  forward reads by a global name (NOTE [Globals read by the forward] in
  monet_opt/global_reads.py). Not watched: what the code reads otherwise than from `self` or a
  global name (an argument, a local alias), objects held deeper than two containers down, and
  the submodules' flags and buffers of a module kept out of the model in a list.
  A forward that changes such a value itself (a counter it increments) changes it while traced
  and never at a step: optimize() warns (SideEffectWarning), naming it.
  Where they are is noted once; reading them is 47 us a step on a 12-layer GPT-2 (435 values and
  164 classes).
"""
from __future__ import annotations

import collections.abc
import functools
import operator
import types
import weakref
from dataclasses import dataclass, field
from itertools import repeat

import torch
from torch import nn

from monet_opt.global_reads import MISSING as _MISSING
from monet_opt.global_reads import Read, global_reads
from monet_opt.global_reads import plain as _plain
from monet_opt.input_spec import LeafSpec

TRAINING = operator.attrgetter("training")


def _public(owner: object) -> dict:
    """The plain-valued public attributes of a module or config, and every tensor it holds as
    an attribute (NOTE [Tensors held as attributes] in monet_opt/attribute_tensors.py)."""
    return {name: value for name, value in vars(owner).items()
            if (name[0] != "_" and name != "training" and _plain(value))
            or isinstance(value, torch.Tensor)}


@dataclass(frozen=True)
class Watched:
    """Where the watched values are: (position in model.modules(), whether in its config, the
    attribute names)."""

    where: tuple[tuple[int, bool, tuple[str, ...]], ...]
    # where in values() a tensor may be: the values that were None or a tensor at of()
    maybe_tensors: tuple[int, ...] = ()
    # plain values read from outside the modules: after `where`'s in values()
    global_reads: tuple[Read, ...] = field(default=(), compare=False)
    # (position, name) of the other attributes the forward's code reads from a module
    read_by_code: tuple[tuple[int, str], ...] = ()
    # (class, name) of each module class's forward and the methods its code calls on self:
    # last in values(), as one tuple (NOTE [Methods replaced on a class])
    methods: tuple[tuple[type, str], ...] = ()

    @staticmethod
    def of(model: nn.Module, skip: tuple[tuple[str, str], ...] = ()) -> Watched:
        """skip: (module name, attribute) pairs not watched: where the step itself keeps a
        tensor (NOTE [Tensors kept on a module] in monet_opt/forward_state.py)."""
        where, configs, maybe, by_code = [], set(), [], []
        reads, on_self = global_reads(model)
        for position, (path, module) in enumerate(model.named_modules()):
            public = _public(module)
            by_code += [(position, name) for name in sorted(_read_names(module, on_self))
                        if name not in public and (path, name) not in skip]
            names = tuple(n for n in public if (path, n) not in skip)
            if names:
                first = 2 + sum(len(w[2]) for w in where)
                maybe += [first + k for k, n in enumerate(names)
                          if public[n] is None or isinstance(public[n], torch.Tensor)]
                where.append((position, False, names))
            config = vars(module).get("config")
            if config is not None and not isinstance(config, nn.Module) \
                    and hasattr(config, "__dict__") and id(config) not in configs:
                configs.add(id(config))
                where.append((position, True, tuple(n for n in _public(config)
                                                    if n not in _SAVED_DESCRIPTIONS)))
        methods = [(cls, name) for cls in dict.fromkeys(map(type, model.modules()))
                   for name in ["forward"] + sorted(on_self.get(cls, set()) - {"forward"})
                   if isinstance(_class_value(cls, name), _METHODS)]
        return Watched(tuple(where), tuple(maybe), reads, tuple(by_code), tuple(methods))

    @functools.cached_property
    def _columns(self) -> tuple[tuple[int, ...], tuple[bool, ...], tuple[tuple[str, ...], ...]]:
        return tuple(zip(*self.where)) or ((), (), ())

    def values(self, modules: list[nn.Module]) -> tuple:
        """The modules' classes and the watched values now (`modules`: model.modules(), as a
        list)."""
        out: list = [tuple(map(type, modules)), tuple(map(TRAINING, modules))]
        positions, configs, names = self._columns
        if positions and positions[-1] < len(modules):  # positions ascend: every module there
            owners = map(vars, map(modules.__getitem__, positions))
        else:
            owners = (vars(modules[p]) if p < len(modules) else {} for p in positions)
        for found, in_config, own in zip(owners, configs, names):
            if in_config:
                found = getattr(found.get("config"), "__dict__", {})
            out.extend(map(found.get, own, repeat(_MISSING)))
        if not _UNHASHABLE.isdisjoint(map(type, out)):  # NOTE [Values saving sets]
            out = [_frozen(v) if type(v) in _UNHASHABLE else v for v in out]
        for k in self.maybe_tensors:  # a tensor's spec: its values are an input of the step
            if isinstance(out[k], torch.Tensor):
                out[k] = LeafSpec.of(out[k])
        out.extend(read.value() for read in self.global_reads)
        out.append(tuple(map(_OWN_FORWARD, map(vars, modules))))
        for p, name in self.read_by_code:
            value = _read_value(modules[p], name) if p < len(modules) else _MISSING
            out.append(value if type(value) in _PLAIN else _frozen(value))
        out.append(tuple(_class_value(cls, name) for cls, name in self.methods))
        return tuple(out)

    def set_once(self, before: tuple, now: tuple) -> tuple:
        """`before` with each config attribute that was None taken as it is `now`: HF's
        forward sets config.problem_type once, on its first call with labels, as eager does,
        and every sequence classifier was warned that eager would set it each step."""
        settled, k = list(before), 2
        for _, in_config, names in self.where:
            for _ in names:
                if in_config and k < len(now) and len(now) == len(before) and before[k] is None:
                    settled[k] = now[k]
                k += 1
        return tuple(settled)

    def pairs(self, before: tuple, now: tuple):
        """(module position, attribute, value before, value now) for each module attribute
        watched, plain or read by the code (not a config's), as values() lays them out."""
        k = 2
        for position, in_config, names in self.where:
            for name in names:
                if not in_config:
                    yield position, name, before[k], now[k]
                k += 1
        k = len(now) - 1 - len(self.read_by_code)  # before the methods' tuple
        for offset, (position, name) in enumerate(self.read_by_code):
            yield position, name, before[k + offset], now[k + offset]

    def changed(self, model: nn.Module, before: tuple, now: tuple) -> str:
        """'drop.p 0.1 -> 0.5, ...': the values that differ, named by module."""
        names = [name for name, _ in model.named_modules()]
        who = lambda name: f"module {name!r}" if name else "the model"  # noqa: E731
        swapped = [f"{who(name)} {old.__name__} -> {new.__name__}"
                   for name, old, new in zip(names, before[0], now[0]) if old is not new]
        mode = {True: "train", False: "eval"}
        swapped += [f"{who(name)} {mode[old]} -> {mode[new]}"
                    for name, old, new in zip(names, before[1], now[1]) if old != new]
        if len(before[0]) != len(now[0]):  # modules added or removed: the rest moved
            return f"{len(before[0])} -> {len(now[0])} modules"
        if before[0] != now[0]:  # other modules: their values are noted elsewhere
            return ", ".join(swapped[:4]) + \
                (f" and {len(swapped) - 4} more" if len(swapped) > 4 else "")
        before, now = before[2:], now[2:]
        labels = [".".join(filter(None, (names[position], "config" * in_config, name)))
                  for position, in_config, attrs in self.where if position < len(names)
                  for name in attrs]
        labels += [read.label for read in self.global_reads]
        own = len(labels)  # each module's own forward, set on it (None: its class's)
        labels.append("")
        labels += [".".join(filter(None, (names[p] if p < len(names) else "?", name)))
                   for p, name in self.read_by_code]
        diffs = swapped + [f"{label} {_shown(b)} -> {_shown(n)}"
                           for label, b, n in zip(labels, before, now) if b != n and label]
        diffs[len(swapped):len(swapped)] = [
            f"{who(name)}: forward " + ("set on it" if new is not None else "its class's again")
            for name, old, new in zip(names, before[own], now[own]) if old is not new]
        diffs += [f"{cls.__name__}.{name} replaced" for (cls, name), b, n
                  in zip(self.methods, before[-1], now[-1]) if b is not n]
        return ", ".join(diffs[:4]) + (f" and {len(diffs) - 4} more" if len(diffs) > 4 else "")


# NOTE [Attributes the forward's code reads]
#   Beside the plain public values, a module's attributes that its class's code reads from
#   `self` (found with the globals: NOTE [Globals read by the forward]) are watched whatever
#   they hold: a function (`self.act_fn = F.relu`, TransformerEncoderLayer's `activation`), a
#   private number (`self._scale`), a dtype, a class
#   attribute (`SCALE` on the class, or set on the instance later), a module kept in a list
#   or dict (a teacher kept out of the parameters: the step holds it as a constant, so one
#   replaced is planned anew; updated in place it is read as it is), and each module's own
#   `forward` set on the instance. Not objects' values (`self.cfg.tau`, cfg not named
#   `config`), nor what lists and dicts hold besides modules (`self.opts["scale"]`): compared
#   whole, an argparse Namespace whose `step` the loop counts, a logger, a list the loop
#   appends to, planned a step at every call (50x slower; found the same day). Each
#   was held as traced after optimize(), silently (outputs 0.16-1.45 from eager's;
#   torch.compile guards on them). Values are compared as
#   `_frozen` makes them: modules in a list or dict by identity (with their train/eval flag and
#   their parameters' identities), functions by identity; other objects not at all.
_OPAQUE = object()
_CALLABLE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
             functools.partial, type)
_LEAVES = (torch.dtype, torch.device, torch.memory_format)


_OWN_FORWARD = operator.methodcaller("get", "forward")  # of a module's __dict__: set on it
# NOTE [A module's own registries]
#   A forward that walks its own children (`for layer in self.children()`, and
#   nn.TransformerEncoderLayer's `for m in self.modules()`) reads `self._modules`, which was
#   watched as modules kept in a dict: by their identities and their parameters'. So
#   copy.deepcopy(opt) and load_state_dict(assign=True) planned the step again (6 s where a
#   step took 3 ms, and one more plan at every such load, with a warning of raw ids), though
#   the step takes the model's parameters and buffers by name and watches each module's type,
#   train/eval flag and values wherever they sit. The registries are not watched as values.
_REGISTRIES = frozenset({"_modules", "_parameters", "_buffers"})


# NOTE [An optimized module's own state]
#   An optimized module inside a model given to optimize() is traced as its model (NOTE
#   [Optimized inside optimized] in monet_opt/module.py), yet its class's code reads its own
#   bookkeeping (`_watched_list`, `_steps`, ...), which its own steps set as they run. Watched,
#   calling the inner module alone between two outer steps (an auxiliary loss on a backbone)
#   planned the outer step again, with a ReplanWarning naming `e._watched_list` and advice about
#   buffers (probe 128, 2026-12-07). A class with `private_state_untraced` true declares that
#   no private attribute of it changes what its traced forward computes: those are not
#   watched; its model, a child module, is.
_PLAIN = {bool, int, float, str, type(None)}
_UNHASHABLE = {list, dict, set}


# NOTE [Values saving sets]
#   HF's save_pretrained (every Trainer checkpoint) sets config.architectures, None when
#   optimize() read it, to a list of the class's name, and config.dtype to the parameters'
#   ("float32"). The list made the next step's key unhashable: TypeError at the first step
#   after a checkpoint (accelerate probe, 2026-12-06), and the dtype planned the step again.
#   Neither is read by a forward to compute: they describe the saved model to
#   from_pretrained. They are not watched, nor `transformers_version`, which a config loaded
#   from a checkpoint carries (set as the model's config, its step was planned again); any
#   other value that becomes a list, a dict or a set is watched as `_frozen` takes it.
_SAVED_DESCRIPTIONS = {"architectures", "dtype", "transformers_version"}


def _read_names(module: nn.Module, on_self: dict[type, set[str]]) -> set[str]:
    """The attributes of `module` its class's code reads that hold a value to watch (NOTE
    [Attributes the forward's code reads])."""
    names = set()
    private_unread = getattr(type(module), "private_state_untraced", False)
    for name in on_self.get(type(module), ()):
        if private_unread and name.startswith("_"):  # NOTE [An optimized module's own state]
            continue
        if name in ("training", "config", "forward") or name in _REGISTRIES:  # watched
            # already (a config: its public values; a forward set on the instance: for every
            # module; NOTE [A module's own registries])
            continue
        value = _read_value(module, name)
        if value is _MISSING or (name not in vars(module) and isinstance(
                value, (types.FunctionType, property, staticmethod, classmethod))):
            continue  # a method: its code is read, not its identity
        if _frozen(value) is not _OPAQUE:
            names.add(name)
    return names


# NOTE [Methods replaced on a class]
#   A class's forward replaced after optimize() (`Net.forward = patched`, as a library patching
#   a class does) ran as traced, silently: outputs 1.53 from eager's, every gradient off (a
#   forward set on the instance was watched, the class's not). So each module class's forward
#   and the methods its code calls on self are watched by identity, as looked up on the class;
#   one replaced plans a step (ReplanWarning "Net.forward replaced").
_METHODS = (types.FunctionType, staticmethod, classmethod, property)


def _class_value(cls: type, name: str) -> object:
    """`name` as the class defines it (a function, not a bound method), _MISSING where none."""
    for owner in cls.__mro__:
        if name in owner.__dict__:  # NOTE [Patches other threads see] in reentrant.py
            value = owner.__dict__[name]
            while isinstance(value, functools.partialmethod) and hasattr(value, "unpatched"):
                value = value.unpatched
            return value
    return _MISSING


def _read_value(module: nn.Module, name: str) -> object:
    own = vars(module)
    if name in own:
        return own[name]
    for cls in type(module).__mro__:
        if cls is nn.Module:
            break
        if name in cls.__dict__:
            return cls.__dict__[name]
    return _MISSING


def _frozen(value: object, depth: int = 0) -> object:
    if value is _MISSING or _plain(value) or isinstance(value, _CALLABLE + _LEAVES):
        return value
    if isinstance(value, nn.Module):  # its weights are constants of the step: each one's id
        return ("module", id(value), value.training, tuple(map(id, value.parameters())))
    items = list(value.values()) if isinstance(value, dict) else value
    if depth < 1 and isinstance(items, (list, tuple)) and len(items) <= 64 and any(
            isinstance(v, nn.Module) for v in items):  # modules kept in a list or dict
        return (type(value), tuple(_frozen(v, depth + 1) if isinstance(v, nn.Module)
                                   else _OPAQUE for v in items))
    if isinstance(value, _CONTAINERS) or type(value).__module__ == "builtins":
        return _OPAQUE  # other lists and dicts (a history the loop appends to, features a
        # hook gathers): compared whole they planned a step at every call
    return _Held(value)


_CONTAINERS = (collections.abc.Collection, collections.abc.Mapping)


class _Held:
    """NOTE [Objects the forward's code reads]: an object compared by identity and by the
    identities of the tensors it holds as attributes (but those that train), each held weakly
    where it can be, so that neither outlives its use nor is one made later at its address
    taken for it."""

    __slots__ = ("held", "tensors")

    def __init__(self, held: object) -> None:
        self.held = _weakly(held)
        self.tensors = tuple(weakref.ref(v) for v in getattr(held, "__dict__", {}).values()
                             if isinstance(v, torch.Tensor) and not v.requires_grad)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Held) and _alive(self.held) is not None and \
            _alive(self.held) is _alive(other.held) and len(self.tensors) == len(other.tensors) \
            and all(a() is not None and a() is b() for a, b in zip(self.tensors, other.tensors))

    def __hash__(self) -> int:
        return id(_alive(self.held))

    def __repr__(self) -> str:
        held = _alive(self.held)
        return f"the {type(held).__name__} at {id(held):#x}" + (
            f" holding tensors at {', '.join(hex(id(t())) for t in self.tensors)}"
            if self.tensors else "")


def _weakly(held: object) -> object:
    try:
        return weakref.ref(held)
    except TypeError:  # no weak references to it (__slots__ without __weakref__): held
        return held


def _alive(held: object) -> object:
    return held() if isinstance(held, weakref.ref) else held


# NOTE [Objects the forward's code reads]
#   An object a module's code reads from `self` (diffusers' attention processor, called as
#   `self.processor(self, x)`; a noise scheduler whose `add_noise` a training wrapper calls)
#   was not watched: one swapped after optimize() (set_attn_processor, another scheduler) ran
#   as the one traced, silently (UNet2DConditionModel: 208 gradients off eager's; diffusion
#   probe, 2026-12-07). Compared by value (an argparse Namespace the loop counts in) such
#   objects planned a step at every call; compared by identity they do not, and one replaced
#   plans a step. The tensors it holds (the scheduler's alphas_cumprod) are constants of the
#   step, read by reference: one written in place is read as it is (a first version of this
#   watched their versions, and a helper whose tensor the loop fills each step planned every
#   step anew), one replaced plans a step (its identity). A tensor that trains is not watched
#   (the optimizer writes it each step); where the step reads one, the trace refuses it (NOTE
#   [Parameters read through objects] in monet_opt/params_read.py). Objects and tensors are
#   held weakly: a plan's key held each object replaced since, 16 MiB tables piling up. What
#   is read deeper (`self.cfg.tau`) is not watched, as before; nor are lists, dicts and sets,
#   nor instances of builtin types.


def _shown(value: object) -> str:
    return "(removed)" if value is _MISSING else \
        f"a tensor ({value})" if isinstance(value, LeafSpec) else repr(value)


class SideEffectWarning(UserWarning):
    """The model's forward changed a module attribute while optimize() traced it, which a
    training step, running no Python, will not do again (NOTE [Attributes read as constants])."""
