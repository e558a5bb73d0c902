"""What the forward's own Python changed on its modules while optimize() traced it.

NOTE [A flag the forward sets once]
  A training step runs the traced graph, not the forward's Python, so a module attribute the
  forward changes is changed while traced and never at a step: a counter is warned about
  (SideEffectWarning). A bool it flips is worse. LSQ's quantizers initialize their scale from
  the first batch (`if not self.initialized: self.s.data.copy_(...); self.initialized =
  True`): AOTAutograd runs the forward twice (it collects the outputs' metadata first), so
  the first run flipped the flag on the trace's stand-in tensors, the graph was traced from
  the second, past the branch, and the scale was never set. The optimized model trained from
  the scale it was built with (loss 2.3454 where eager's was 2.3431), and the model was left
  flagged as initialized, so even an eager call skipped it (quantization probe, 2026-12-07).
  A bool the forward flips is refused, put back as it was, with what to do: run the model
  once before optimize(), so that what it guards is done and the flag stays.
"""
from __future__ import annotations

import warnings

from torch import nn

from monet_opt.attributes import SideEffectWarning, Watched
from monet_opt.errors import CaptureError, user_stacklevel


def warn_if_forward_changed(model: nn.Module, watched: Watched, before: tuple) -> None:
    """SideEffectWarning where tracing changed watched values (a counter the forward
    increments): eager changes them every step, the traced step never. A bool flipped is
    refused (NOTE [A flag the forward sets once])."""
    now = watched.values(list(model.modules()))
    before = watched.set_once(before, now)
    if now == before:
        return
    refuse_flags_flipped(model, watched, before, now)
    warnings.warn(SideEffectWarning(
        f"monet_opt: {type(model).__name__}'s forward changed module attributes while "
        f"optimize() traced it: {watched.changed(model, before, now)}. A training step runs "
        "the traced graph, not the forward's Python, so it will not change them again as "
        "eager would each step. If the forward's result depends on one (a step counter "
        "that anneals a value), keep it in a buffer and update it in place "
        "(self.count.add_(1)): the step does that each time."), stacklevel=user_stacklevel())


def refuse_flags_flipped(model: nn.Module, watched: Watched, before: tuple, now: tuple) -> None:
    """NOTE [A flag the forward sets once]: CaptureError naming each bool attribute of a
    module that tracing flipped, each put back first."""
    modules, names = list(model.modules()), [name for name, _ in model.named_modules()]
    flipped = [(p, name, old, new) for p, name, old, new in watched.pairs(before, now)
               if type(old) is bool and type(new) is bool and old != new and p < len(modules)]
    if not flipped:
        return
    for p, name, old, _ in flipped:
        setattr(modules[p], name, old)
    said = ", ".join(f"{'.'.join(filter(None, (names[p], name)))} {old} -> {new}"
                     for p, name, old, new in flipped)
    raise CaptureError(
        f"monet_opt.optimize: {type(model).__name__}'s forward flipped {said} while optimize() "
        "traced it (put back as it was). A training step runs the traced graph, not the "
        "forward's Python, and the trace ran the forward past that flag on stand-in tensors: "
        "what it guards (a first-call initialization, such as a quantizer's scale set from "
        "the first batch) would never be done on the model. Run the model once on a batch "
        "before optimize(), so that it is done and the flag stays set, then optimize(); a "
        "flag meant to change at every step belongs in a buffer (NOTE [A flag the forward "
        "sets once] in monet_opt/side_effects.py).")

