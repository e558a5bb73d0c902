"""What a forward leaves besides its outputs: buffers assigned anew and tensors kept on modules,
made part of the traced step (monet_opt/capture.py's compile_step), and the outputs' own
structure.

NOTE [The outputs' structure]
  aot_function hands back a list where the function returned a tuple at the top (nested
  containers keep their types), so a model returning (logits, aux) returned [logits, aux] from
  its step: unpacking worked, `isinstance(out, tuple)` and `out + (z,)` did not. The traced
  function returns (outputs, kept tensors), which becomes that list, and the step takes the
  outputs from it: the model's own structure, whatever it is.

NOTE [Buffers assigned in forward]
  A forward that assigns a new tensor to a buffer (self.ema = 0.9 * self.ema + 0.1 * m, where
  an in-place update would write self.ema.mul_(0.9).add_(...)) changed only the module
  torch.func.functional_call swapped in while tracing: the traced step computed the new value
  and dropped it, so the buffer never moved from its value at optimize(), silently (an EMA
  0.04 from eager's after one step). functional_call hands back what the module holds under
  each name when it returns, so a buffer holding another tensor there is copied into the
  buffer the step was given, an in-place update AOTAutograd applies after every step as it
  applies BatchNorm's: the model's buffer then holds eager's values (the same tensor object,
  updated, where eager binds a new one). A new value of another shape or dtype, or a
  parameter assigned, cannot be written so: CaptureError. Nor can a buffer resized in place
  (statistics sized on a first call); CaptureError, saying to call the model once first.
  Quantization-aware training's fused observers resize theirs inside one ATen op, whose fake
  kernel keeps the old shapes: the step was traced with the per-channel scales at [1] and
  failed at its first run, after its forward, with some buffers updated ("output with shape
  [1] doesn't match the broadcast shape [8]"); such observers are refused before tracing
  (refuse_untraceable in monet_opt/refusals.py). Called once first, QAT trains bitwise like
  eager, observers on and off (tests/test_forward_state.py).

NOTE [Tensors kept on a module]
  A forward may keep a tensor on a module for the training loop to read after the call: an
  auxiliary loss (a mixture of experts' load-balancing loss, a VQ-VAE's commitment loss, added to
  the loss before backward), routing weights or attention maps kept for logging. Traced, the
  module kept the trace's own tensor (a FunctionalTensor of fakes, without values) for good: the
  loop read that same tensor after every step (adding it to a loss failed; only SideEffectWarning
  hinted at it). A tensor the forward assigns to a plain attribute of a module is now an output of
  the step too, put back on its module after each step, so the loop reads that step's tensor and a
  backward through it reaches the parameters as in eager; while the step is only traced the module
  keeps what it held before. The module holds it past the step, so the plan holds its storage for
  the whole step (fixed memory, nothing when made: it over-counts only before it is made;
  held_problem in monet_opt/held_outputs.py), and the last step's tensor is let go as a step
  starts, not when it ends. Planned as a forward output, alive to the forward's end only, the
  least plan of two routing layers measured 1,028 B over its prediction and its limit (their
  routing weights and losses); now at most 8 B under (tests/test_forward_state.py). Its attribute
  is not watched as a constant (NOTE [Attributes read as constants]) unless the forward reads it
  before it sets it (state carried from one call to the next; a second trace notes such reads,
  each attribute taken out of its module's __dict__ for the while): then the None it held when
  traced is watched, and a tensor there plans a step that reads it (NOTE [Tensors held as
  attributes]).

NOTE [Containers filled]
  A forward that appends to a list a module holds, or sets a key of its dict (features kept
  for a distillation loss, a log of shapes), does so while traced and never at a step, and what
  the trace put there are its value-less tensors: reading them later failed far from the cause.
  The public lists and dicts of every module are put back as they were after each trace, and
  optimize() warns (SideEffectWarning) naming them.

NOTE [Traced tensors left]
  What the traced backward runs of the model's Python (a tensor hook registered in the
  forward that keeps a gradient on a module, for Grad-CAM) runs only while traced, outside
  the forward's call, and left the trace's value-less tensor on the module for good. Any
  module attribute holding a traced tensor after tracing is set back to what it held, with a
  SideEffectWarning naming it; a hook that changes the gradient (g * 2) is in the step's
  backward, as eager runs it. retain_grad() on a tensor kept on a module (NOTE [Tensors kept
  on a module]) does not give it a .grad at a step either (the gradient flows inside the
  compiled backward): warned the same way.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from monet_opt.aot_call import FlatCall
from monet_opt.attribute_tensors import tensor_attributes
from monet_opt.attributes import SideEffectWarning
from monet_opt.errors import CaptureError, user_stacklevel
from monet_opt.set_back import equal_values, holds_traced, set_back


def write_back(model: torch.nn.Module, names: list[str], n_params: int, given: tuple,
               shapes: list[torch.Size], state: dict, n_registered: int) -> None:
    """Copy into each buffer the tensor the forward assigned to it (`state`: what
    functional_call handed back, by name; `given`: the tensors it was given, parameters first,
    then buffers, `n_registered` of both, `shapes` theirs when given; NOTE [Buffers assigned in
    forward]); CaptureError for what cannot be."""
    for k, name in enumerate(names[:n_registered]):
        if given[k].shape != shapes[k]:
            raise CaptureError(
                f"monet_opt.optimize: {type(model).__name__}'s forward resizes its "
                f"{'parameter' if k < n_params else 'buffer'} '{name}' in place, from "
                f"{list(shapes[k])} to {list(given[k].shape)} (as statistics sized on a first "
                "call are), which a traced step cannot do. Call the model once on a batch "
                "first (model(sample_input)), so that its state has the shapes it keeps, then "
                "optimize() it.")
        if name not in state:
            continue
        new, old = state[name], given[k]
        if new is old:
            continue
        if k < n_params or not isinstance(new, torch.Tensor) or new.shape != old.shape or \
                new.dtype != old.dtype:
            what = (f"a {new.dtype} {list(new.shape)} tensor" if isinstance(new, torch.Tensor)
                    else type(new).__name__)
            raise CaptureError(
                f"monet_opt.optimize: {type(model).__name__}'s forward assigns {what} to its "
                f"{'parameter' if k < n_params else 'buffer'} '{name}' "
                f"({old.dtype} {list(old.shape)}), which a traced step cannot do. Update it in "
                f"place instead (self.{name.rsplit('.', 1)[-1]}.copy_(...), or under "
                "torch.no_grad() for a parameter), keeping its shape and dtype.")
        old.copy_(new)


class Kept:
    """The tensors a traced forward keeps on modules (NOTE [Tensors kept on a module]): where
    (`where`: (module name, attribute) pairs), and how many leaves the traced function returns,
    so that the partition can tell which of the graph's outputs they are."""

    def __init__(self, attribute_inputs: range = range(0)) -> None:
        """attribute_inputs: where among the traced function's inputs the tensors held as
        attributes are (NOTE [Attributes set before read] in
        monet_opt/attribute_tensors.py)."""
        self.where: list[tuple[str, str]] = []
        self._attribute_inputs = attribute_inputs
        self.dead_inputs: tuple[int, ...] = ()  # of those, the ones the step never reads
        self._found: dict[tuple[str, str], torch.Tensor] = {}
        self._leaves = 0
        self._warned: set[str] = set()
        self._retained: list[tuple[str, str]] = []
        self.read: set[tuple[str, str]] = set()  # kept attributes the forward reads first

    @property
    def unread(self) -> tuple[tuple[str, str], ...]:
        """The kept tensors the forward does not read before it sets them (an auxiliary loss,
        logging), unlike state carried from step to step (NOTE [Tensors kept on a module])."""
        return tuple(key for key in self.where if key not in self.read)

    def call(self, module: torch.nn.Module, call: Callable[[], Any]) -> Any:
        """call() (one traced call of `module`), noting the tensors it assigns to modules'
        attributes, then setting each attribute back to what it held."""
        before = attributes(module)
        held = {key: type(v)(v) for key, v in before.items()  # NOTE [Containers filled]
                if type(v) in (list, dict) and key[1][0] != "_"}
        # a second trace learns which of the first's kept tensors, not tensors before, it reads
        watch = [key for key in self.where if not isinstance(before.get(key), torch.Tensor)]
        try:
            with _reads(module, watch, before, self.read):
                return call()
        finally:
            self._found = {key: v for key, v in tensor_attributes(module).items()
                           if before.get(key) is not v}
            self.where = list(self._found)
            self._retained = [key for key, v in self._found.items() if v.retains_grad]
            set_back(module, self._found, before)
            self._refill(module, held)
            boxed = [key for key, v in attributes(module).items()  # NOTE [Tensors kept boxed]
                     if before.get(key) is not v and holds_traced(v)]
            set_back(module, boxed, before)
            boxed = [key for key in boxed  # torch's RNNs make their _flat_weights anew
                     if not type(module.get_submodule(key[0])).__module__.startswith("torch.")]
            if boxed:
                self._warn(
                    f"monet_opt: {type(module).__name__}'s forward assigned tuples, lists or "
                    "dicts holding tensors to "
                    f"{', '.join('.'.join(filter(None, k)) for k in boxed[:4])}. A step runs "
                    "the traced graph, not the forward's Python, so they are not set at a step "
                    "as in eager, and what the trace put there had no values, so they keep "
                    "what they held (a cache filled on the first call, as PyG's cached=True "
                    "layers fill theirs, is computed at every step instead). Keep a tensor "
                    "meant for the loop as an attribute of its own (self.w = t: each step sets "
                    "it; NOTE [Tensors kept on a module]), or return it.")
            if self._retained:
                self._warn(
                    f"monet_opt: {type(module).__name__}'s forward calls retain_grad() on "
                    f"{', '.join('.'.join(filter(None, k)) for k in self._retained[:4])}, kept "
                    "on its module: a step's backward runs as one compiled graph, so its .grad "
                    "stays None (NOTE [Traced tensors left]). Run the model itself (opt.model) "
                    "for steps that read it.")

    def _refill(self, module: torch.nn.Module, held: dict) -> None:
        """Put back what the traced call added to (or took from) a module's lists and dicts,
        and warn, once, naming them (NOTE [Containers filled])."""
        changed = []
        for (name, attribute), saved in held.items():
            now = getattr(module.get_submodule(name), attribute)
            pairs = list(zip(now, saved)) if isinstance(now, list) else \
                [(v, saved.get(k, _MISSING)) for k, v in now.items()]
            if len(now) != len(saved) or not all(a is b for a, b in pairs):
                if len(now) != len(saved) or not all(equal_values(a, b) for a, b in pairs):
                    changed.append(f"{'.'.join(filter(None, (name, attribute)))} "
                                   f"({len(saved)} -> {len(now)} items)")
                if isinstance(now, list):
                    now[:] = saved
                else:
                    now.clear()
                    now.update(saved)
        if changed:
            self._warn(
                f"monet_opt: {type(module).__name__}'s forward changed lists or dicts its "
                f"modules hold while optimize() traced it: {', '.join(changed[:4])}. A step "
                "runs the traced graph, not the forward's Python, so they do not change at "
                "each step as in eager, and what the trace put there had no values, so it was "
                "taken out again. Keep a tensor meant for the loop as a module attribute "
                "(self.features = t: each step sets it; NOTE [Tensors kept on a module]), or "
                "return it.")

    def _warn(self, message: str) -> None:
        """SideEffectWarning, each message once (the forward is traced more than once)."""
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(SideEffectWarning(message), stacklevel=user_stacklevel())

    def outputs(self, outputs: Any) -> tuple:
        """What the traced function returns: the outputs and the kept tensors (let go of here:
        the trace's tensors held on made copy.deepcopy(opt) fail, 'Only Tensors created
        explicitly by the user ... support the deepcopy protocol')."""
        found, self._found = self._found, {}
        result = (outputs, tuple(found.values()))
        self._leaves = len(pytree.tree_leaves(result))
        return result

    def partitioning(self, partition_fn: Callable) -> Callable:
        """`partition_fn`, told the positions among the joint graph's outputs of the kept
        tensors (`held=`) and of the forward's own outputs (`returned=`; NOTE [Outputs held
        through the backward] in monet_opt/held_outputs.py)."""
        def partition(joint, joint_inputs, **kwargs):
            self.dead_inputs = tuple(  # NOTE [Attributes set before read]
                n.meta["desc"].idx for n in joint.graph.find_nodes(op="placeholder")
                if not n.users and type(n.meta.get("desc")).__name__ == "PlainAOTInput"
                and n.meta["desc"].idx in self._attribute_inputs)
            kept, returned = self._positions(joint)
            return partition_fn(joint, joint_inputs, held=kept, returned=returned, **kwargs)
        return partition

    def _positions(self, joint: torch.fx.GraphModule) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The kept tensors are the last leaves returned, after the forward's outputs;
        AOTAutograd's output descriptors name each graph output's leaf (PlainAOTOutput.idx)."""
        output = next(n for n in reversed(joint.graph.nodes) if n.op == "output")
        first = self._leaves - len(self.where)
        leaves = [(k, desc.idx) for k, desc in enumerate(output.meta.get("desc") or ())
                  if type(desc).__name__ == "PlainAOTOutput"]
        return (tuple(k for k, idx in leaves if idx >= first),
                tuple(k for k, idx in leaves if idx < first))


@contextlib.contextmanager
def _reads(module: torch.nn.Module, keys: list[tuple[str, str]], before: dict, read: set):
    """While traced: a read of an attribute of `keys` before the forward sets it is added to
    `read`. Each is taken out of its module's __dict__, so that a read reaches __getattr__ (of a
    subclass made for the while), which notes it and answers what it held."""
    owners: dict[int, tuple[torch.nn.Module, type, str, dict]] = {}
    for path, name in keys:
        owner = module.get_submodule(path)
        owners.setdefault(id(owner), (owner, type(owner), path, {}))[3][name] = \
            before.get((path, name), _MISSING)
        vars(owner).pop(name, None)
    for owner, cls, path, stash in owners.values():
        owner.__class__ = _noting(cls, stash, read, path)
    try:
        yield
    finally:
        for owner, cls, _, stash in owners.values():
            owner.__class__ = cls
            for name, value in stash.items():  # what the forward did not set goes back
                if name not in vars(owner) and value is not _MISSING:
                    vars(owner)[name] = value  # NOTE [A parameter held as a plain attribute]


_MISSING = object()


def _noting(cls: type, stash: dict, read: set, path: str) -> type:
    """A subclass of `cls` whose __getattr__ notes reads of the names in `stash`."""
    def __getattr__(self, name):
        if name in stash:
            read.add((path, name))
            if stash[name] is not _MISSING:  # read while absent: AttributeError, as it was
                return stash[name]
        return cls.__getattr__(self, name)
    return type(cls.__name__, (cls,), {"__getattr__": __getattr__,
                                       "__qualname__": cls.__qualname__,
                                       "__module__": cls.__module__})


def exported(model: torch.nn.Module, export: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """export() (torch.export of `model`), leaving `model`'s attributes as they were; the
    exported module sets none, so tensors the forward keeps on modules are not kept by a step
    traced from it: SideEffectWarning (NOTE [Tensors kept on a module])."""
    kept = Kept()
    target = kept.call(model, export)
    if kept.where:
        warnings.warn(SideEffectWarning(
            f"monet_opt: {type(model).__name__} was traced through torch.export (NOTE [The "
            "capture route] in monet_opt/capture.py), whose module does not keep the tensors "
            "the forward keeps on modules: "
            f"{', '.join('.'.join(filter(None, key)) for key in kept.where[:4])} keep what they "
            "held before each step. Return them from the forward instead."),
            stacklevel=user_stacklevel())
    return target


def attributes(model: torch.nn.Module) -> dict[tuple[str, str], Any]:
    """Every attribute of every submodule, by (module name, attribute)."""
    return {(name, k): v for name, m in model.named_modules() for k, v in vars(m).items()}


def put_back_traced(model: torch.nn.Module, before: dict[tuple[str, str], Any]) -> None:
    """Set back every attribute that holds a traced tensor after tracing, or a tuple, list or
    dict holding one (`before`: what `attributes` gave before it), warning where one did (NOTE
    [Traced tensors left])."""
    left = [key for key, v in attributes(model).items() if holds_traced(v)]
    set_back(model, left, before)
    if left:
        warnings.warn(SideEffectWarning(
            f"monet_opt: tracing {type(model).__name__}'s step left tensors on its modules "
            f"outside its forward: {', '.join('.'.join(filter(None, k)) for k in left[:4])} "
            "(a tensor hook that keeps a gradient, set while the backward is traced). A step's "
            "backward runs as one compiled graph, so they are not set at a step: they keep "
            "what they held before. Run the model itself (opt.model) for steps that read "
            "them."), stacklevel=user_stacklevel())


class CompiledStep:
    """The compiled step: call it with (*params, *buffers, *inputs) for the model's outputs;
    it puts the tensors the forward keeps on modules back on them (NOTE [Tensors kept on a
    module]). `kept`: where, known once it is traced."""

    def __init__(self, compiled: Callable, target: torch.nn.Module, kept: Kept,
                 attributes: tuple[str, ...] = ()) -> None:
        # NOTE [Arguments flattened once] in monet_opt/aot_call.py
        self._compiled, self._target, self._kept = FlatCall(compiled), target, kept
        self.attributes = attributes  # the tensor attributes it reads, after the buffers

    @property
    def kept(self) -> tuple[tuple[str, str], ...]:
        """The tensors it keeps on modules that the forward does not read first."""
        return self._kept.unread

    def __call__(self, *flat: torch.Tensor) -> Any:
        for name, attribute in self._kept.where:  # the last step's go now, not after this one's
            setattr(self._target.get_submodule(name), attribute, None)
        if self._kept.dead_inputs:  # NOTE [Attributes set before read]
            flat = tuple(t.detach() if k in self._kept.dead_inputs else t
                         for k, t in enumerate(flat))
        outputs, kept = self._compiled(*flat)
        for (name, attribute), value in zip(self._kept.where, kept):
            setattr(self._target.get_submodule(name), attribute, value)
        return outputs
