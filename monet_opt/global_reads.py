"""Plain values a model's forward reads from outside its modules (globals, and what objects
held in globals hold), which a traced step holds fixed.

NOTE [Globals read by the forward]
  A plain global that a module's forward reads by name (`x * SCALE`, `if EPOCH > 5`, a
  module-level schedule the loop reassigns), an attribute of an object held in a global
  (`cfg.tau`, `args.p`, a chain of them: `cfg.MODEL.P`, yacs' nodes, dicts read as attributes,
  included) or an item of a global dict (`CONFIG["p"]`) was held as a constant of the traced
  step, silently: reassigning it between steps changed nothing; so was a function read by a
  global name (`ACT = torch.tanh` for torch.relu), watched as well (by identity). Those whose
  values are plain when optimize() runs are watched like a module's attributes (NOTE
  [Attributes read as constants] in monet_opt/attributes.py), each named by its path and the
  file reading it, and read anew at every call through the same path (an object in the chain
  replaced is seen).
  They are found in the code, not by running it: the forward functions of the model's module
  classes, their nested functions, the functions they call by a global name (`helper(x)`,
  `utils.helper(x)`) and the methods and properties they reach through their first argument
  (`self._attn(q, k, v)`, `self.scale`), the module hooks' functions (a forward hook scaling
  an output by a global schedule held the value met at optimize(): loss 23.95 where eager's
  was 16.33), and so on from those, at most MAX_FUNCTIONS; not
  into PyTorch's, NumPy's or the standard library's functions, whose globals are their own
  settings and bookkeeping, not a training loop's.
  Objects' attributes are read from their __dict__, so no property of theirs runs. Not seen:
  what a function reads through a closure or a local alias, or is passed as an argument.
  Where they are is found once per optimize() (HF's GPT-2, Llama, BERT, T5, Whisper: 33 to 41
  functions in 24-40 ms; ResNet-50: 3 ms) and read at every call (GPT-2 reads two, math.pi
  and a flag, in 1 us; the others none).
"""
from __future__ import annotations

import dis
import inspect
import sys
import types
from dataclasses import dataclass
from typing import Iterator

from torch import nn
from torch.nn.modules import module as nn_module
from torch.nn.utils import parametrize

from monet_opt.hooks import GLOBAL_KINDS, KINDS
from monet_opt.parametrize_cache import parametrized

_PLAIN = (bool, int, float, str, type(None))
MISSING = object()
MAX_FUNCTIONS = 400  # functions scanned per model (HF's GPT-2: 41)
_NOT_FOLLOWED = ("torch", "torchvision", "torchaudio", "numpy")


def plain(value: object) -> bool:
    kind = type(value)
    return kind in _PLAIN or (kind is tuple and all(type(v) in _PLAIN for v in value))


@dataclass(frozen=True)
class Read:
    """A plain value reached from a module's globals `scope`: `name`, then each step of
    `chain` ((True, key): an item; (False, name): an attribute); `label` names it."""

    scope: dict
    name: str
    chain: tuple[tuple[bool, object], ...]
    label: str

    def __deepcopy__(self, memo: dict) -> Read:  # the namespace read is the live one
        return self

    def value(self) -> object:
        value = self.scope.get(self.name, MISSING)
        for item, key in self.chain:
            value = _step(value, item, key)
        return value


def _step(owner: object, item: bool, key: object) -> object:
    """owner[key] (item) or owner.key read without running code (its __dict__, or the item
    of a dict whose class reads attributes from its items, as yacs' CfgNode); MISSING if not
    there."""
    if owner is MISSING:
        return MISSING
    if not item:
        found = getattr(owner, "__dict__", None)
        if isinstance(found, dict) and key in found:
            return found[key]
        if not isinstance(owner, dict) or hasattr(type(owner), key):
            return MISSING
    if isinstance(owner, dict):
        try:
            return owner.get(key, MISSING)
        except TypeError:  # an unhashable key
            return MISSING
    return MISSING


def global_reads(model: nn.Module) -> tuple[tuple[Read, ...], dict[type, set[str]]]:
    """Every plain value the model's forward code reads from outside its modules (NOTE
    [Globals read by the forward]), each once; and the attributes each class's code reads
    from `self` (NOTE [Attributes the forward's code reads] in monet_opt/attributes.py)."""
    found: dict[tuple, Read] = {}
    on_self: dict[type, set[str]] = {}
    queue = [(fn, owner, False) for fn, owner in _forward_functions(model)]
    seen = {fn for fn, _, _ in queue}
    while queue and len(seen) <= MAX_FUNCTIONS:
        fn, owner, self_only = queue.pop()
        for read_or_fn in _scan(fn, owner, not self_only):
            if isinstance(read_or_fn, Read):
                key = (id(read_or_fn.scope), read_or_fn.name, read_or_fn.chain)
                found.setdefault(key, read_or_fn)
                continue
            if isinstance(read_or_fn[0], type):  # (owner, name) read from self
                on_self.setdefault(read_or_fn[0], set()).add(read_or_fn[1])
                continue
            called, called_owner = read_or_fn
            # PyTorch's own methods only for what they read from self (its activation)
            torch_own = _not_followed(called)
            if called not in seen and (not torch_own or called_owner is not None):
                seen.add(called)
                queue.append((called, called_owner, torch_own))
    if parametrized(model):  # NOTE [Parametrizations cached around a trace]
        found["cached"] = Read(vars(parametrize), "_cache_enabled", (),
                               "parametrize.cached() blocks open")
    return tuple(found.values()), on_self


def _not_followed(fn: types.FunctionType) -> bool:
    """PyTorch's, NumPy's and the standard library's functions: their globals are their own
    settings and bookkeeping (warnings' filter version), not a training loop's."""
    module = (getattr(fn, "__module__", None) or "").split(".")[0]
    return module in _NOT_FOLLOWED or module in sys.stdlib_module_names


def _forward_functions(model: nn.Module) -> set[tuple[types.FunctionType, type | None]]:
    """(function, the class `self` is) for the forward of each class in the model's module
    classes' MROs (nn.Module's own aside), and the functions decorated ones wrap (HF's
    can_return_tuple); and (function, None) for each module hook, the model's and the global
    ones (a hook scaling an output by a global schedule held it fixed: NOTE [Module hooks])."""
    out = set()
    for kind in {type(module) for module in model.modules()}:
        for cls in kind.__mro__:
            fn = cls.__dict__.get("forward") if cls is not nn.Module else None
            while isinstance(fn, types.FunctionType):
                out.add((fn, kind))
                fn = getattr(fn, "__wrapped__", None)
    tables = [vars(module).get(kind) or {} for module in model.modules() for kind in KINDS]
    tables += [getattr(nn_module, kind) for kind in GLOBAL_KINDS]
    for hook in (hook for table in tables for hook in table.values()):
        hook = getattr(hook, "func", hook)  # functools.partial
        hook = getattr(hook, "__func__", hook)  # a bound method
        if isinstance(hook, types.FunctionType) and not _not_followed(hook):
            out.add((hook, None))
    return out


# `self` as a local, and as a cell: a comprehension or lambda in the forward that reads it
# makes it one, in the forward and in the nested code alike, and every `self.X` of the forward
# went unseen: a temperature, a class attribute and an activation changed after optimize()
# kept their traced values, silently (vision blocks probe, 2026-12-06)
_LOADS = ("LOAD_FAST", "LOAD_DEREF", "LOAD_FAST_CHECK")


def _scan(fn: types.FunctionType, owner: type | None, globals_too: bool = True) -> Iterator:
    """The Reads in `fn`'s code (nested functions too), and (function, owner) for each
    function it reaches: called by a global name, or through `self` (its first argument); and
    (owner, name) for each attribute it reads from `self`. Not `globals_too`: only the last
    two through `self`."""
    scope = fn.__globals__
    where = scope.get("__file__") or scope.get("__name__")
    self_name = fn.__code__.co_varnames[0] if fn.__code__.co_argcount else None
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        held = None  # (name, chain, value): what the instructions so far loaded from globals
        on_self = False  # the last instruction loaded the first argument
        key = MISSING  # a constant just loaded after `held`: an item's key, if subscripted
        for ins in dis.get_instructions(code):
            op, arg = ins.opname, ins.argval
            if op == "LOAD_GLOBAL" and globals_too:
                held = (arg, (), scope.get(arg, MISSING))
            elif op in ("LOAD_ATTR", "LOAD_METHOD") and on_self and owner is not None:
                yield owner, arg
                yield from _methods(owner, arg)
                held = None
            elif op in ("LOAD_ATTR", "LOAD_METHOD") and held is not None:
                held = (held[0], held[1] + ((False, arg),), _step(held[2], False, arg))
            elif op == "LOAD_CONST" and held is not None and isinstance(held[2], dict):
                key = arg
                on_self = False
                continue
            elif op == "BINARY_SUBSCR" and held is not None and key is not MISSING:
                held = (held[0], held[1] + ((True, key),), _step(held[2], True, key))
            else:
                held = None
            on_self, key = op in _LOADS and arg == self_name, MISSING
            if held is None:
                continue
            name, chain, value = held
            if plain(value):
                yield Read(scope, name, chain, f"global {_path(name, chain)} ({where})")
                held = None
            elif isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
                # watched (reassigned: ACT = torch.tanh), and a Python one followed
                yield Read(scope, name, chain, f"global {_path(name, chain)} ({where})")
                if isinstance(value, types.FunctionType):
                    yield value, None
                held = None
            elif value is MISSING or isinstance(value, type) or not (
                    hasattr(value, "__dict__") or isinstance(value, dict)):
                held = None


def _methods(owner: type, name: str) -> Iterator[tuple[types.FunctionType, type | None]]:
    """The functions `self.name` runs where it is a method, static or class method, or
    property of `owner` (a submodule or a value held by the module: nothing)."""
    try:
        found = inspect.getattr_static(owner, name)
    except AttributeError:
        return
    if isinstance(found, staticmethod):  # no `self` to follow
        owner, found = None, found.__func__
    if isinstance(found, classmethod):
        found = found.__func__
    if isinstance(found, property):
        found = found.fget
    if isinstance(found, types.FunctionType):
        yield found, owner


def _path(name: str, chain: tuple[tuple[bool, object], ...]) -> str:
    return name + "".join(f"[{key!r}]" if item else f".{key}" for item, key in chain)
