"""One exception hierarchy. Messages say what, how much, and what to do next."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import torch

_INTERNAL = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
             os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


def user_stacklevel() -> int:
    """warnings.warn's stacklevel, from the function that warns, for the first caller outside
    monet_opt and torch (a training step's warning then names the line that called the module or
    ran the backward, through nn.Module.__call__, torch.compiler.disable's wrapper and autograd's
    engine, and the code FX generates for the step's graphs); the outermost frame if every
    frame is theirs."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and (
            frame.f_code.co_filename.startswith("<eval_with_key>") or
            frame.f_code.co_filename == contextlib.__file__ or  # a warning raised in __exit__
            os.path.abspath(frame.f_code.co_filename).startswith(_INTERNAL)):
        frame, level = frame.f_back, level + 1
    return level


class MonetError(Exception):
    """Base class of every error monet_opt raises on purpose."""

    def __reduce__(self):
        """Copied and pickled as it is, its __init__ not run again: an InfeasibleBudgetError's
        takes more than its message, so a module that had remembered one (NOTE [Situations
        found infeasible] in monet_opt/refused.py) could no longer be deep-copied (an EMA's
        AveragedModel), nor the error pickled."""
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type, args: tuple, state: dict) -> MonetError:
    err = Exception.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class InfeasibleBudgetError(MonetError):
    """The memory limit is below the least peak any schedule we can build reaches."""

    def __init__(self, memory_limit_bytes: int, min_feasible_bytes: int, solver: str,
                 asked: object = None, held: Any = None, bound: Any = None,
                 time_limit_s: float | None = None, solve_time_s: float | None = None) -> None:
        """asked: the limit as given where it was a share (NOTE [Limits as shares]); held:
        what the least peak's schedule holds there (a HeldAtPeak: NOTE [Held at the peak]);
        bound: a PeakBound no schedule peaks below (NOTE [Proven or not found]); time_limit_s:
        the solver's; solve_time_s: what the solve took."""
        self.searched = bool(time_limit_s and solve_time_s is not None and
                             solve_time_s < SEARCHED * time_limit_s)
        from monet_opt.units import Share, exact_bytes, format_bytes

        self.memory_limit_bytes = int(memory_limit_bytes)
        self.min_feasible_bytes = None if min_feasible_bytes is None else int(min_feasible_bytes)
        self.lower_bound_bytes = None if bound is None else int(bound.bytes)
        self.held = held
        size = exact_bytes(memory_limit_bytes)
        if isinstance(asked, Share):
            size = f"{str(asked)!r} ({format_bytes(memory_limit_bytes)}, {memory_limit_bytes} B)"
        if min_feasible_bytes is None:  # stopped before any schedule (dp at time_limit_s=1e-3)
            super().__init__(
                f"monet_opt.optimize: solver {solver!r} found no schedule for memory_limit "
                f"{size} in " + (f"time_limit_s={time_limit_s:g}" if time_limit_s else
                                 "its time") + ", nor any least peak to report: give it a "
                "longer time_limit_s, or use solver='auto'.")
            return
        least = exact_bytes(min_feasible_bytes)
        super().__init__(
            f"monet_opt.optimize: memory_limit {size} is below the least peak solver "
            f"{solver!r} can reach, {least}." + _held_text(held) +
            _bound_text(self, bound, least, time_limit_s, solver))

    @property
    def proven(self) -> bool:
        """Whether no schedule at all fits the limit (it is under the step's sizes bound), not
        only none the solver found in its time."""
        return self.lower_bound_bytes is not None and \
            self.memory_limit_bytes < self.lower_bound_bytes


def _bound_text(err: InfeasibleBudgetError, bound: Any, least: str,
                time_limit_s: float | None, solver: str = "") -> str:
    """NOTE [Proven or not found]
      The least peak a solver reports is the least it reached in its time, not always the
      least there is. The step's sizes bound every schedule's peak from below (NOTE [A least
      peak from sizes] in solvers/peak_bound.py); a limit under it cannot be met by any plan,
      and the error says so (only a smaller batch or model helps). A limit between it and the
      least peak reached may be met by a schedule the solver did not find in time: the error
      says a longer time_limit_s may find one, before saying to raise the limit."""
    from monet_opt.units import exact_bytes

    act = f"memory_limit to at least {least}, or use a smaller batch."
    if bound is None:
        return " Raise " + act
    why = next((text for op, text in _HELD_BY.items() if bound.op.startswith(op)), "") \
        if bound.op else ""
    where = f" (what {bound.op} holds while it runs{why})" if bound.op else \
        " (the fixed memory and every gradient)"
    sizes = f"{exact_bytes(bound.bytes)}{where}"
    if err.proven:
        return (f" No schedule can fit the limit: the step's sizes alone need {sizes}. Use a "
                f"smaller batch, or raise memory_limit above that: {least} is the least peak "
                "this solve reached, and fits.")  # not the least there is: an API probe's
        #                 limit 6 % under the one it named fitted (2026-12-06)
    if solver in FIXED:  # it makes one schedule, whatever the time
        return (f" No schedule peaks below {sizes}, so a plan between may exist, which "
                f"solver='auto' may find ({solver!r} makes one schedule); otherwise raise " + act)
    if err.searched:
        return (f" No schedule peaks below {sizes}, but the solve ended well within its "
                f"time_limit_s={time_limit_s:g}, having found no lower peak to try, so a "
                "longer one would find none: raise " + act)
    longer = f"longer than time_limit_s={time_limit_s:g}" if time_limit_s else "longer"
    return (f" No schedule peaks below {sizes}, so a plan between may exist, and a solve "
            f"{longer} may find it; otherwise raise " + act)


FIXED = ("store_all", "chen_sqrt")  # solvers that search nothing
# ops whose bytes at the bound are the traced step's own, beyond eager's: said where they bind
_HELD_BY = {"embedding_renorm": ": an Embedding or EmbeddingBag with max_norm renorms a copy "
            "of its table, where eager renorms the table in place, so the step holds the table "
            "twice there and may need more than eager's peak; docs/training.md"}
# NOTE [Proven or not found]: a solve that ended before this share of its time limit stopped
# searching on its own (the least-peak probes met their bound): a longer one was advised, and
# at 10, 120 and 300 s each ended in 0.8 s at the same least peak (limits probe, 2026-12-07)
SEARCHED = 0.5


def _held_text(held: Any) -> str:
    """What the least peak holds, and how much of it the step made (NOTE [Held at the peak])."""
    if held is None:
        return ""
    from monet_opt.units import format_bytes
    made = held.total_bytes - held.fixed_bytes - held.gradients.bytes
    return (f" At that peak ({held.op}) the step holds {held.text()}: activations and "
            f"workspace {format_bytes(made)}, parameters, buffers, inputs and gradients "
            f"{format_bytes(held.total_bytes - made)}.")


class CaptureError(MonetError):
    """The model could not be traced into a joint forward+backward graph."""


class NoBackwardError(MonetError, ValueError):
    """The step has no backward to plan: gradients are off, nothing requires grad, or no output
    depends on anything that does."""


def check_backward(model: torch.nn.Module, inputs: list[torch.Tensor]) -> None:
    """NoBackwardError where the step cannot have a backward, ValueError where it cannot run
    (on the meta device: its profile runs every op); checked before it is traced."""
    held = (("the model's parameters are", model.parameters()),
            ("the model's buffers are", model.buffers()),
            ("the sample input is", inputs))
    meta = next((what for what, ts in held if any(t.is_meta for t in ts)), None)
    if meta is not None:
        raise ValueError(
            f"monet_opt.optimize: {meta} on the 'meta' device, which holds no "
            "data, and optimize() measures every operator by running it on the device the "
            "model trains on. Materialize the model there first (model.to_empty(device=...) "
            "and initialize or load its weights) and pass a sample input on that device.")
    if not torch.is_grad_enabled():
        raise NoBackwardError(
            "monet_opt.optimize plans a training step (forward and backward), but gradients "
            "are off here (under torch.no_grad() or torch.inference_mode()). Call optimize() "
            "outside those blocks, where you train.")
    if not any(p.requires_grad for p in model.parameters()) and \
            not any(x.requires_grad for x in inputs):
        raise NoBackwardError(
            f"monet_opt.optimize: no parameter of {type(model).__name__} requires grad and no "
            "input does, so its step has no backward to plan. Set requires_grad on what you "
            "train, or run the model as it is.")


class PlanMismatchError(MonetError, ValueError):
    """The optimized module was called with inputs that differ from the plan's."""


class DoubleBackwardError(MonetError, RuntimeError):
    """A backward with create_graph=True reached the optimized step, whose compiled backward
    cannot itself be differentiated (NOTE [Double backward] in monet_opt/output_grad.py)."""


class UnsupportedGraphError(MonetError):
    """The traced graph has something the executor cannot schedule safely."""


class UsageError(MonetError, ValueError):
    """A command line that asks for something that cannot be done (a bad factory or shape, an
    unknown profile, a limit with no cached schedule). The message says what to do instead;
    `monet-opt` prints it on one line and exits with status 2."""


class VariantGuardError(MonetError):
    """A lossy variant refused to run where its result would be wrong (a BatchNorm whose
    weight is too near zero to rebuild its input from its output); the profiler withdraws such
    a variant, a training step raises."""


class InternalError(MonetError, AssertionError):
    """A broken invariant inside monet_opt: a bug, never the user's input."""


def internal_assert(cond: bool, msg: str) -> None:
    if not cond:
        raise InternalError(f"monet_opt internal error (this is a bug, please report it): {msg}")
