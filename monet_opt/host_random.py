"""Random numbers a model draws in Python while it is traced.

NOTE [Random numbers drawn in Python]
  A traced step keeps whatever the model's Python computed while it was traced: a number drawn
  from Python's `random` or NumPy's generator then becomes a constant of the graph, so every
  step repeats the one draw made at optimize() where eager draws anew each step. A block skipped
  when `random.random() < p` was skipped (or run) on every step: outputs 0.7-1.5 apart from
  eager's over three steps of six such blocks, with no word. HF's SpecAugment masks
  (`_compute_mask_indices`, NumPy), BigBird's random attention blocks (NumPy) and some
  LayerDrops (`random.uniform`) draw this way. torch's own generators are part of the graph
  (dropout, `torch.rand`) and are drawn anew each step, as eager does.
  While a model is traced (`watching`), the global `random` and `numpy.random` functions note
  the line that called them, and the states of those generators, and of any `random.Random`,
  NumPy `RandomState` or `Generator` a module holds, are kept; the partition, which runs once
  the forward and backward are traced and before anything is profiled, compares them
  (`refuse_drawn`) and raises CaptureError naming the lines and what to do. So are the
  generators held as globals of the files defining the model's module classes (`RNG =
  np.random.default_rng(0)`, as NumPy advises, or a `random.Random(0)`, drawn by a layer drop:
  outputs 1.78 and 2.16 from eager's at every step, silently; multitask probe, 2026-12-07),
  their lines unseen (their methods are not patched). Not seen: a generator made inside the
  forward, or held elsewhere (another file's global, a closure).
"""
from __future__ import annotations

import contextlib
import linecache
import random
import sys
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from monet_opt.errors import CaptureError

_UNPATCHED = ("seed", "getstate", "setstate", "get_state", "set_state", "get_bit_generator",
              "set_bit_generator")
_OURS = ("/torch/", "/monet_opt/", "/numpy/", "/random.py")
_watch: dict[str, Any] = {}
_last: dict[str, list[str]] = {}  # the last watch's draws, for drawn_hint


def _numpy():
    return sys.modules.get("numpy")


def _globals() -> list[tuple[Any, Any]]:
    """(module, the generator its functions are bound to) for `random` and `numpy.random`."""
    found = [(random, random._inst)]
    np = _numpy()
    if np is not None:
        found.append((np.random, np.random.mtrand._rand))
    return found


def _state(rng: Any) -> Any:
    if isinstance(rng, random.Random):
        return rng.getstate()
    if hasattr(rng, "bit_generator"):  # numpy.random.Generator
        return repr(rng.bit_generator.state)
    return repr(rng.get_state(legacy=False))  # numpy.random.RandomState


def _held(model: torch.nn.Module, kinds: tuple[type, ...] | None = None) -> dict[str, Any]:
    """The generators of `kinds` (default: Python's and NumPy's) the model's modules hold as
    attributes, by name."""
    np = _numpy()
    if kinds is None:
        kinds = (random.Random,) if np is None else \
            (random.Random, np.random.RandomState, np.random.Generator)
    return {f"model.{name}.{attr}" if name else f"model.{attr}": value
            for name, module in model.named_modules()
            for attr, value in vars(module).items() if isinstance(value, kinds)}


def _in_globals(model: torch.nn.Module) -> dict[str, Any]:
    """The Python and NumPy generators held as globals of the files that define the model's
    module classes (`RNG = np.random.default_rng(0)` beside the model), by name; not
    torch's, NumPy's or the standard library's own."""
    np = _numpy()
    kinds = (random.Random,) if np is None else \
        (random.Random, np.random.RandomState, np.random.Generator)
    ours = {id(rng) for _, rng in _globals()}
    files = {cls.__module__ for cls in map(type, model.modules())}
    return {f"{file}.{name}": value for file in sorted(files)
            if file.partition(".")[0] not in ("torch", "numpy", "random")
            for name, value in vars(sys.modules.get(file, random)).items()
            if isinstance(value, kinds) and id(value) not in ours}


def _noting(fn: Callable, where: str) -> Callable:
    def drawn(*args, **kwargs):
        frame = sys._getframe(1)
        by = "collectives" if _DISTRIBUTED in frame.f_code.co_filename else "lines"
        while frame is not None and any(part in frame.f_code.co_filename for part in _OURS):
            frame = frame.f_back
        if frame is not None and len(_watch[by]) < 3:
            line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            _watch[by].setdefault(f"{where + ' at ' if by == 'lines' else ''}"
                                  f"{frame.f_code.co_filename}:{frame.f_lineno}: {line}", None)
        return fn(*args, **kwargs)
    return drawn


# NOTE [Collectives drawn as random]
#   Tracing a c10d collective (dist.all_reduce, torch.distributed.nn.functional's) draws a
#   work id from Python's `random` in torch's own code, and the forward was refused as drawing
#   random numbers, advised to draw with torch (sharding probe, 2026-12-07). A draw made from
#   torch.distributed's code is a collective's: refused as one, saying to use the functional
#   collectives, which a step traces (NOTE [Collectives in the forward] in collectives.py).
_DISTRIBUTED = "/torch/distributed/"


# NOTE [Random state set in the forward]
#   torch.manual_seed (or set_rng_state) in a forward restarts eager's stream at every call (a
#   dropout mask made the same each step); traced, it set the generator once, at optimize(),
#   and the steps' draws went on from wherever the stream was: outputs unlike eager's at every
#   step, silently. While traced, a call to one of these from the model's own code (not from
#   torch's, as torch.utils.checkpoint's replay) is noted, and refuse_drawn raises CaptureError
#   naming the line: seed before calling the model instead. So is torch.random.fork_rng(),
#   whose exit puts the stream back (from torch's own code, which is not noted): eager's draws
#   after the block repeated those inside it, the step's drew on (a loss 0.124 for eager's 0.098).
_RESEEDS = ((torch, ("manual_seed", "seed", "set_rng_state")),
            (torch.random, ("manual_seed", "seed", "set_rng_state", "fork_rng")),
            (torch.cuda, ("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state")))


def _reseeding(fn: Callable, where: str) -> Callable:
    def reseed(*args, **kwargs):
        frame = sys._getframe(1)
        if kwargs.get("enabled", True) is False or fn.__name__ == "fork_rng" and \
                len(args) > 1 and args[1] is False:
            return fn(*args, **kwargs)  # fork_rng(enabled=False): nothing set
        if not any(part in frame.f_code.co_filename for part in _OURS):
            line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            _watch["reseeds"].setdefault(
                f"{where} at {frame.f_code.co_filename}:{frame.f_lineno}: {line}", None)
        return fn(*args, **kwargs)
    return reseed


@contextlib.contextmanager
def watching(model: torch.nn.Module):
    """Note the Python and NumPy draws the model makes while traced, and its calls that set
    torch's random state, for `refuse_drawn`."""
    rngs = {module.__name__: rng for module, rng in _globals()} | _held(model) | \
        _in_globals(model)
    patched = []
    for module, rng in _globals():
        for name in dir(module):
            fn = getattr(module, name)
            if getattr(fn, "__self__", None) is rng and name not in _UNPATCHED:
                patched.append((module, name, fn))
                setattr(module, name, _noting(fn, f"{module.__name__}.{name}"))
    for module, names in _RESEEDS:  # NOTE [Random state set in the forward]
        for name in names:
            fn = getattr(module, name)
            patched.append((module, name, fn))
            setattr(module, name, _reseeding(fn, f"{module.__name__}.{name}"))
    outer = dict(_watch)
    _watch.update(model=type(model).__name__, rngs=rngs, lines={}, reseeds={}, collectives={},
                  states={name: _state(rng) for name, rng in rngs.items()},
                  torch_held={name: (g, g.get_state()) for name, g in _held(
                      model, (torch.Generator,)).items()})
    saved = {name: _saved(rng) for name, rng in rngs.items()}
    try:
        yield
    finally:
        for module, name, fn in patched:
            setattr(module, name, fn)
        _last["lines"] = _drawn()
        for name, rng in rngs.items():  # NOTE [Draws put back]
            if _state(rng) != _watch["states"][name]:
                _put_back(rng, saved[name])
        _watch.clear()
        _watch.update(outer)


# NOTE [Draws put back]
#   The draws a forward made while traced, refused (NOTE [Random numbers drawn in Python]),
#   moved NumPy's or Python's stream where torch's was put back: a user who caught the error
#   and turned HF's SpecAugment off no longer had eager's NumPy stream (audio probe,
#   2026-12-06). Each generator the trace drew from is set back as it was.
def _saved(rng: Any) -> Any:
    if isinstance(rng, random.Random):
        return rng.getstate()
    if hasattr(rng, "bit_generator"):  # numpy.random.Generator
        return rng.bit_generator.state
    return rng.get_state()


def _put_back(rng: Any, state: Any) -> None:
    if isinstance(rng, random.Random):
        rng.setstate(state)
    elif hasattr(rng, "bit_generator"):
        rng.bit_generator.state = state
    else:
        rng.set_state(state)


def _drawn() -> list[str]:
    """Where the watched model drew from a Python or NumPy generator (empty if it did not)."""
    drawn = [name for name, rng in _watch["rngs"].items()
             if _state(rng) != _watch["states"][name]]
    if not drawn:
        return []
    return list(_watch["lines"]) or [f"from {', '.join(drawn)} (the line was not seen)"]


def refuse_drawn() -> None:
    """CaptureError where the model drew from a Python or NumPy generator since `watching`
    began (NOTE [Random numbers drawn in Python]), or set torch's random state (NOTE [Random
    state set in the forward]); nothing outside `watching`."""
    calls = list(_watch.get("collectives", ()))
    if calls and not _watch["lines"]:  # NOTE [Collectives drawn as random]
        raise CaptureError(
            f"monet_opt.optimize: {_watch['model']}'s forward calls a torch.distributed "
            "collective:" + _listed(calls) + "\nc10d's collectives (dist.all_reduce, "
            "torch.distributed.nn.functional) run outside a traced step. Use the functional "
            "collectives (torch.distributed._functional_collectives: funcol.all_reduce), which "
            "a step traces and runs at every step (NOTE [Collectives in the forward] in "
            "monet_opt/collectives.py), or keep the collective out of the forward.")
    lines = _drawn() if _watch else []
    if lines:
        raise CaptureError(f"monet_opt.optimize: {_watch['model']}'s forward drew random numbers "
                           "in Python while it was traced:" + _listed(lines) + _ADVICE)
    reseeds = list(_watch.get("reseeds", ()))
    if reseeds:
        raise CaptureError(
            f"monet_opt.optimize: {_watch['model']}'s forward sets torch's random state:"
            + _listed(reseeds) + "\nEager restarts its random stream there at every call; a "
            "traced step cannot (it would set it once, at optimize(), and draw on from there: "
            "masks unlike eager's, silently). Seed before calling the model instead, keep "
            "the mask meant to repeat as a buffer, or draw what must not move the stream from "
            "a torch.Generator held on a module (torch.rand(..., generator=self.g)) (NOTE "
            "[Random state set in the forward] in monet_opt/host_random.py).")


# NOTE [Generators set in the forward]
#   A forward that seeds a torch.Generator it holds (self.g.manual_seed(1): the same noise at
#   every call), or makes and seeds one (torch.Generator().manual_seed(1) given to randint),
#   draws the same numbers at every eager call; traced, the seeding ran once, at optimize(),
#   and the steps drew on from that generator: targets and losses unlike eager's from the
#   second step, silently. A trace does not draw from a held generator (fake tensors), so a
#   held generator's state that changed while the model was traced was set by its forward;
#   a generator the graph's ops are given that no module holds (nor the device's default)
#   was made by it (or is held where monet_opt cannot see it). Both are refused, saying to
#   draw outside the model and pass the draw in, or to hold the generator on a module and
#   seed it before calling the model.
def refuse_generators(gm: torch.fx.GraphModule) -> None:
    """CaptureError for the generators `gm`'s ops are given that its forward set or made
    (NOTE [Generators set in the forward]); nothing outside `watching`."""
    if not _watch:
        return
    from monet_opt.recompute import held_generators
    held = _watch["torch_held"]
    known = [g for g, _ in held.values()] + [torch.default_generator] + (  # not starting CUDA
        list(torch.cuda.default_generators) if torch.cuda.is_initialized() else [])
    with unset_fake_temporarily():  # the partition runs inside the trace
        set_ = [name for name, (g, state) in held.items()
                if not torch.equal(g.get_state(), state)]
        made = _unknown(held_generators(gm), known)
    if set_ or made:
        for g, state in held.values():  # as they were before optimize()
            g.set_state(state)
        what = f"sets the state of {', '.join(set_)}" if set_ else \
            "draws from a torch.Generator no module holds (one it makes?)"
        raise CaptureError(
            f"monet_opt.optimize: {_watch['model']}'s forward {what}. Eager seeds it at every "
            "call; a traced step would seed it once, at optimize(), and draw on from there "
            "(draws unlike eager's from the second step, silently). Draw outside the model and "
            "pass the tensor in, or hold the generator on a module (self.g = "
            "torch.Generator()) and seed it before calling the model (NOTE [Generators set in "
            "the forward] in monet_opt/host_random.py).")


def _unknown(found: list[torch.Generator], known: list[torch.Generator]
             ) -> list[torch.Generator]:
    """The generators of `found` that are none of `known`. A graph holds its own Python object
    for a generator, so each known one is seeded apart for a moment, and its state put back
    as it was (its initial seed with it)."""
    if not found:
        return []
    saved = [(g, g.get_state()) for g in known]
    try:
        for n, g in enumerate(known):
            g.manual_seed(_MARK + n)
        return [g for g in found if not 0 <= g.initial_seed() - _MARK < len(known)]
    finally:
        for g, state in saved:
            g.set_state(state)


_MARK = 0x6D6F6E6574 << 16  # seeds that mark the known generators, one each


def drawn_hint() -> str:
    """For a trace that failed: where the last watched trace drew in Python, if it did."""
    lines = _last.get("lines")
    return f"\nIt also drew random numbers in Python:{_listed(lines)}{_ADVICE}" if lines else ""


def _listed(lines: list[str]) -> str:
    return "\n  " + "\n  ".join(lines)


_ADVICE = (
    "\nA traced step keeps what was drawn then as constants, so every step would repeat that one "
    "draw where eager draws anew (a layer skipped at random, a random mask). Draw with torch "
    "instead, as a tensor the step uses (torch.rand(...) < p as a mask, "
    "torchvision.ops.stochastic_depth), or draw outside the model and pass the result as an "
    "input; for HF models, turn the option off in the config (SpecAugment: mask_time_prob=0.0, "
    "mask_feature_prob=0.0; LayerDrop: layerdrop, encoder_layerdrop, decoder_layerdrop=0.0; "
    "BigBird's random blocks: attention_type='original_full').")


def layerdrop_hint(model: torch.nn.Module) -> str:
    """What to set where the model is an HF one with LayerDrop on in training (each step draws
    which layers run, with torch.rand(()) read as a number, so no one graph is its step)."""
    on = sorted({f"{attr}={value}" for module in model.modules() if module.training
                 for attr, value in getattr(getattr(module, "config", None), "__dict__", {}).items()
                 if attr.endswith("layerdrop") and isinstance(value, (int, float)) and value > 0})
    if not on:
        return ""
    return (f"\nIts config has LayerDrop on ({', '.join(on)}): each training step draws which "
            "layers run, so no one graph is its step; set it to 0.0 to optimize it.")
