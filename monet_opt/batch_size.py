"""The largest batch whose training step fits a memory limit, and its plan.

NOTE [The largest batch]
  A user out of memory has two questions: how to fit the batch they have (optimize()), and
  how large a batch fits their device at all. Checkmate reports the second (VGG-19: 289
  against eager's 167). `largest_batch(model, make_input, limit)` answers it by planning: a
  batch fits where `optimize()` finds a plan within the limit, and that plan is what it
  returns. A try traces, profiles and solves one batch size (the solver's time limit each),
  and profiling's time grows with the batch, so the search spends few tries, and none on a
  batch whose sizes alone say it cannot fit.
  1. Traced: batches are only traced and lowered (a second or a few each) and their size
     bound (NOTE [A least peak from sizes] in solvers/peak_bound.py) held against the limit,
     until the largest batch whose bound is within it, B, and B + 1 are found. No larger
     batch can fit. On VGG-19 (64², CPU) the bound was 1,102.3 MiB at 132 and 2,233.2 MiB at
     528, where the solver's least peaks were 1,104.9 and 2,265.3 MiB; on the bench's CNNs
     it sees 58-74 % of the least peak's activations, on its transformers little (GPT-2
     narrow, 256 tokens, under 300 MiB: B = 87, where a plan fits at most 39).
  2. Estimated: a try of a batch that cannot fit is the dearest (its profiling pass is held
     within the limit, NOTE [Profiling within the limit], making values again; GPT-2's try at
     87 was still profiling after 8 minutes), so the first batch tried is the largest up to B
     whose sizes alone the lower-set DP fits within the limit (a trace and a fraction of a
     second each), found from B as tries are below. The DP's least is no proof either way
     (the tried step's solver reaches lower, profiling raises sizes) but follows the least
     peak's shape where the bound does not (GPT-2 at 19: 289.0 MiB, the try's 181.5; at 27:
     393.5, the bound 119.6); on VGG-19 (the bound within 1.5 %) it cost a try, 4 for 3.
  3. Tried: each try a whole optimize(). The least peak is not proportional to the batch: on
     VGG-19 flat (9 MiB above the parameters and their gradients at 132, the fully connected
     layers' gradients at its peak), then steep (the first convolutions at 528). So after a
     try, the next batch is the largest whose estimate, scaled so that above the batchless
     memory the tried batch's meets its least peak, is within the limit (estimated again);
     where none is between the largest batch found to fit and the smallest found not to,
     after a failed try the bound scaled the same way, and otherwise where a line through
     two tries' least peaks reaches the limit: the chord between the largest batch that fits
     and the smallest that does not (below a convex curve's crossing), with the Illinois rule
     against closing in from one side only; before any try fails, the lower of two lines
     through the largest batch that fits, at most GROWTH times it (batch_chord.py). The
     traced and estimated searches use the same rule on their bounds and estimates. GROWTH
     3: of 2, 3 and 4, the least sum of batches tried on the curves of
     tests/test_largest_batch.py. On those curves, with bounds 0-40 % below them above the
     batchless memory, at most 3 tries (B, the answer, the next; 4 on the noisy one), where
     the tries alone took up to 7; with bounds seeing 0-30 % and estimates 5 % under to 30 %
     over, 3 tries (5 on the noisy curve, whose least peak falls as well as rises with the
     batch) and at most 10 estimates (16).
  Where a batch's step fits with nothing recomputed, optimize() searches for its least peak
  only briefly (NOTE [The least peak where store-all fits] in solvers/least.py), and a least
  peak found too high puts the next guess short of the largest batch; there the least is
  asked for by a solve at the step's floor, which with a profile directory runs the solver
  alone. The search ends when the largest batch found to fit and the smallest found not to
  (tried, or traced) are neighbours (the answer is then the largest that fits, as far as the
  solver's least peaks go: a longer solve can lower a least peak) or after `max_tries`
  (`BatchFit.proven` False).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any, Callable

import torch
from torch import nn
from torch.utils import _pytree as pytree

import solvers
from monet_opt import api
from monet_opt.batch_chord import next_batch
from monet_opt.batch_fit import BatchFit, Try
from monet_opt.arguments import check_options
from monet_opt.errors import CaptureError, InfeasibleBudgetError
from monet_opt.memory import resident_bytes
from monet_opt.module import OptimizedModule
from monet_opt.units import Share, format_bytes, parse_memory_limit
from solvers.peak_bound import least_peak_bound

log = logging.getLogger("monet_opt")
_OPTIMIZE = api.optimize  # whose options optimize_options are (tests stand in for api.optimize)
SIZED_TRIES = 32  # batches traced at most for their size bounds (a trace each: seconds)
ESTIMATE_S = 5.0  # the DP's time on a batch's sizes alone, before it is tried


def largest_batch(model: nn.Module, make_input: Callable[[int], Any],
                  memory_limit: int | str, *, start: int | None = None,
                  max_batch: int = 1 << 16,
                  max_tries: int = 12, **optimize_options: Any) -> BatchFit:
    """The largest batch size whose training step `optimize()` plans within `memory_limit`
    (NOTE [The largest batch]).

    Args:
        model: as `optimize()` takes it.
        make_input: batch size -> a sample input of that many samples, as `optimize()` takes
            it (e.g. `lambda b: torch.randn(b, 3, 224, 224)`).
        memory_limit: bytes, or a size such as "16GiB" (not a share of a step: which batch's
            step would it be a share of?).
        start: the first batch traced (NOTE [The largest batch]); by default 8, or max_batch
            where that is smaller.
        max_batch: no larger batch is tried.
        max_tries: at most this many batches are tried (each a whole `optimize()`; batches
            only traced for their size bounds, at most SIZED_TRIES, are not counted).
        optimize_options: passed to every `optimize()` (solver, time_limit_s, profile_dir, ...).

    Raises:
        ValueError: a bad limit, start or max_batch, or a `make_input` whose inputs do not
            change shape with the batch.
        InfeasibleBudgetError: not even a batch of 1 fits (its least peak in the error).
        torch.OutOfMemoryError is not raised for a batch the device cannot hold while it is
        planned: that batch does not fit.
    """
    limit = limit_bytes(memory_limit)
    if start is None and isinstance(max_batch, int):
        start = min(8, max_batch)  # max_batch=5 alone was refused: "got start=8"
    if not all(isinstance(n, int) and not isinstance(n, bool)
               for n in (start, max_batch, max_tries)):  # make_input(2.5) failed in the user's
        raise TypeError(f"monet_opt.largest_batch: start, max_batch and max_tries must be ints, "
                        f"got start={start!r}, max_batch={max_batch!r}, "
                        f"max_tries={max_tries!r}")
    if not 1 <= start <= max_batch or max_tries < 1:
        raise ValueError(f"monet_opt.largest_batch: need 1 <= start <= max_batch and max_tries "
                         f">= 1, got start={start}, max_batch={max_batch}, "
                         f"max_tries={max_tries}")
    check_options("largest_batch", optimize_options, _OPTIMIZE)
    _check_batched(make_input)
    fixed = _batchless_bytes(model)
    every: list[Try] = []  # traced and tried, in order
    traced = _sized_search(model, make_input, limit, 0, max_batch + 1, fixed, optimize_options,
                           every, start=start)
    best: OptimizedModule | None = None  # the plan of the largest batch found to fit
    tries: list[Try] = []
    lo, hi = 0, min([t.batch for t in traced if not t.fits], default=max_batch + 1)
    batch = _estimated_search(model, make_input, limit,
                              max([t.batch for t in traced if t.fits], default=1), fixed, every,
                              optimize_options)
    while len(tries) < max_tries:
        tried, module = _try(model, make_input, batch, limit, optimize_options)
        tries.append(_told(every, tried))
        if module is not None:
            best, lo = module, batch
        else:
            hi = batch
            if batch == 1:
                raise _not_even_one(tried, limit, optimize_options.get("solver", "auto"))
        if hi == lo + 1:
            break
        batch = next_batch(tries, fixed, limit, lo, hi)
        if tried.least_bytes is None:
            continue
        guided = _calibrated(model, make_input, tried, limit, lo, hi, fixed, every,
                             optimize_options)
        if guided is None and module is None:
            guided = _scaled(model, make_input, tried, limit, lo, fixed, every, optimize_options)
        batch = guided if guided is not None and lo < guided < hi else batch
    if best is None:  # every try failed above 1 and the tries ran out
        raise ValueError(f"monet_opt.largest_batch: no batch tried fits {format_bytes(limit)} "
                         f"within {max_tries} tries (the smallest tried: {hi}); try more "
                         "max_tries")
    return BatchFit(lo, best, hi == lo + 1, tuple(every))


def _told(every: list[Try], tried: Try) -> Try:
    """`tried`, logged and added to `every`."""
    log.info("largest_batch: %s", tried.text())
    every.append(tried)
    return tried


def _sized_search(model: nn.Module, make_input: Callable[[int], Any], limit: int, lo: int,
                  hi: int, fixed: int, options: dict[str, Any], every: list[Try],
                  known: list[Try] = (), start: int | None = None,
                  held_to: int | None = None, estimate: bool = False) -> list[Try]:
    """Batches between `lo` and `hi` traced, not profiled, until the largest whose size bound
    (`estimate`: whose estimate) is within `limit` and the next are found (or SIZED_TRIES are
    spent): the same search on the bounds, from `start` or where `known` (batches traced
    already, held against this limit) put it. The batches it traced (added to `every`;
    `held_to`: the limit is a scaled one, said so)."""
    tries = [dataclasses.replace(t, fits=t.least_bytes <= limit) for t in known]
    for t in tries:
        lo, hi = (max(lo, t.batch), hi) if t.fits else (lo, min(hi, t.batch))
    found: list[Try] = []
    batch = start if start is not None else next_batch(tries, fixed, limit, lo, hi)
    while hi > lo + 1 and len(found) < SIZED_TRIES:
        measure = _estimated if estimate else _sized
        tried = _told(every, dataclasses.replace(measure(model, make_input, batch, limit,
                                                         options), held_to=held_to))
        tries.append(tried)
        found.append(tried)
        lo, hi = (batch, hi) if tried.fits else (lo, batch)
        if hi > lo + 1:
            batch = next_batch(tries, fixed, limit, lo, hi)
    return found


def _estimated(model: nn.Module, make_input: Callable[[int], Any], batch: int, limit: int,
               options: dict[str, Any]) -> Try:
    """A batch traced and its sizes alone solved by the lower-set DP (at most ESTIMATE_S): its
    least peak, within the limit or not (NOTE [The largest batch], 2.)."""
    begun = time.perf_counter()
    with _named(batch):
        problem = api.lower_problem(model, make_input(batch), timed=False,
                                    variants=options.get("variants", True),
                                    allow_lossy=options.get("allow_lossy", False))
    result = solvers.solve(problem, limit, "dp", time_limit_s=ESTIMATE_S)
    least = result.min_feasible_bytes
    least = least_peak_bound(problem).bytes if least is None else least  # DP out of time
    return Try(batch, least <= limit, least, None, time.perf_counter() - begun,
               profiled=False, estimated=True)


def _estimated_search(model: nn.Module, make_input: Callable[[int], Any], limit: int,
                      start: int, fixed: int, every: list[Try], options: dict[str, Any]) -> int:
    """The first batch to try: the largest up to `start` (the largest the bounds allow) whose
    estimate is within the limit, searched from there as the tries are after a failed one
    (NOTE [The largest batch], 2.); 1 where none is."""
    first = _told(every, _estimated(model, make_input, start, limit, options))
    if first.fits or start == 1:
        return start
    scaled = _scaled(model, make_input, first, limit, 0, fixed, every, options)
    guessed = _sized_search(model, make_input, limit, 0, start, fixed, options, every, [first],
                            start=scaled if scaled is not None and 0 < scaled < start else None,
                            estimate=True)
    return max([t.batch for t in guessed if t.fits], default=1)


def _calibrated(model: nn.Module, make_input: Callable[[int], Any], tried: Try, limit: int,
                lo: int, hi: int, fixed: int, every: list[Try], options: dict[str, Any]
                ) -> int | None:
    """After a try: the largest batch between `lo` and `hi` whose estimate, scaled so that
    above the batchless memory the tried batch's meets its least peak, is within the limit
    (NOTE [The largest batch], 3.); None where none is. What it estimates joins `every`."""
    own = [t for t in every if t.estimated and t.batch == tried.batch] or \
        [_told(every, _estimated(model, make_input, tried.batch, limit, options))]
    guess = own[0].least_bytes
    if not (fixed < guess and fixed < tried.least_bytes):
        return None
    target = fixed + (limit - fixed) * (guess - fixed) // (tried.least_bytes - fixed)
    known = sorted((t for t in every if t.estimated and lo <= t.batch <= hi),
                   key=lambda t: t.batch)  # the tried batch's own among them
    _sized_search(model, make_input, target, lo, hi, fixed, options, every, known,
                  held_to=None if target == limit else target, estimate=True)
    return max([t.batch for t in every if t.estimated and lo < t.batch < hi
                and t.least_bytes <= target], default=None)


def _scaled(model: nn.Module, make_input: Callable[[int], Any], failed: Try, limit: int,
            lo: int, fixed: int, every: list[Try], options: dict[str, Any]) -> int | None:
    """After a try that did not fit: the largest batch above `lo` whose size bound, scaled
    so that above the batchless memory it meets the failed try's least peak, is within the
    limit (NOTE [The largest batch]); None where no batch above `lo` is. The batches this
    traces are added to `every`."""
    bounds = {t.batch: t.least_bytes for t in every if t.is_bound}
    if failed.batch not in bounds:
        bounds[failed.batch] = _told(every, _sized(model, make_input, failed.batch, limit,
                                                   options)).least_bytes
    bound = bounds[failed.batch]
    if not fixed < bound < failed.least_bytes:
        return None
    target = fixed + (limit - fixed) * (bound - fixed) // (failed.least_bytes - fixed)
    known = sorted((t for t in every if t.is_bound and lo < t.batch <= failed.batch),
                   key=lambda t: t.batch)
    _sized_search(model, make_input, target, lo, failed.batch, fixed, options, every, known,
                  held_to=target)
    below = [t.batch for t in every if t.is_bound and lo < t.batch < failed.batch
             and t.least_bytes <= target]
    return max(below, default=None)


def _sized(model: nn.Module, make_input: Callable[[int], Any], batch: int, limit: int,
           options: dict[str, Any]) -> Try:
    """A batch traced and lowered, not profiled: its size bound against the limit."""
    begun = time.perf_counter()
    with _named(batch):
        problem = api.lower_problem(model, make_input(batch), timed=False,
                                    variants=options.get("variants", True),
                                    allow_lossy=options.get("allow_lossy", False))
    bound = least_peak_bound(problem).bytes
    return Try(batch, bound <= limit, bound, None, time.perf_counter() - begun, profiled=False)


def limit_bytes(memory_limit: object) -> int:
    """`memory_limit` in bytes; a share of the step is refused (the step changes with the
    batch), and a bad value's message does not offer one (it did)."""
    if isinstance(memory_limit, Share) or (isinstance(memory_limit, str) and "%" in memory_limit):
        raise ValueError(f"monet_opt.largest_batch: memory_limit {str(memory_limit)!r} is a "
                         "share of one step, but the step changes with the batch: give bytes or "
                         "a size such as '16GiB'")
    try:
        return parse_memory_limit(memory_limit)
    except ValueError as exc:
        raise ValueError(f"monet_opt.largest_batch: {exc}") from None


def _not_even_one(tried: Try, limit: int, solver: str) -> Exception:
    if tried.least_bytes is None:
        return ValueError(f"monet_opt.largest_batch: a batch of 1 ran the device out of memory "
                          f"while planning it: the device holds less than {format_bytes(limit)}; "
                          "give a smaller memory_limit")
    error = InfeasibleBudgetError(limit, tried.least_bytes, solver)
    error.args = (str(error).replace(", or use a smaller batch", "", 1),)  # none is smaller
    error.add_note("monet_opt.largest_batch: not even a batch of 1 fits this limit")
    return error


@contextlib.contextmanager
def _named(batch: int):
    """A CaptureError at a batch the search made (a model that takes only some batch sizes: a
    multiple of 4, or 2 and more where BatchNorm trains) says which: it said to fix the
    sample input, which the caller never gave."""
    try:
        yield
    except CaptureError as exc:
        exc.add_note(f"monet_opt.largest_batch: at a batch of {batch}, one the search made "
                     f"(make_input({batch})); where the model takes only some batch sizes, "
                     "keep the search to them with start and max_batch")
        raise


def _try(model: nn.Module, make_input: Callable[[int], Any], batch: int, limit: int,
         options: dict[str, Any]) -> tuple[Try, OptimizedModule | None]:
    log.info("largest_batch: trying a batch of %d under %s ...", batch, format_bytes(limit))
    start = time.perf_counter()
    try:
        with _named(batch):
            module = api.optimize(model, make_input(batch), limit, **options)
    except InfeasibleBudgetError as exc:
        return Try(batch, False, exc.min_feasible_bytes, None,
                   time.perf_counter() - start), None
    except torch.OutOfMemoryError:  # the device itself is smaller than the limit
        return Try(batch, False, None, None, time.perf_counter() - start), None
    plan = module.plan
    least = plan.min_feasible_bytes
    if plan.store_all_peak_bytes <= limit and options.get("profile_dir", "profiles") is not None:
        least = _least(model, make_input(batch), plan.fixed_bytes + plan.gradient_bytes,
                       options)
    return Try(batch, True, least, plan.store_all_peak_bytes,
               time.perf_counter() - start), module


def _least(model: nn.Module, x: Any, floor: int, options: dict[str, Any]) -> int:
    """The least peak of a step whose store-all fits, asked for by a solve at its floor (the
    profile is the directory's, so only the solver runs)."""
    try:
        return api.optimize(model, x, floor, **options).plan.predicted_peak_bytes
    except InfeasibleBudgetError as exc:
        return exc.min_feasible_bytes


def _batchless_bytes(model: nn.Module) -> int:
    """What no batch size changes: parameters, buffers, and the trainable parameters'
    gradients."""
    params = list(model.parameters())
    return (resident_bytes(params + list(model.buffers()))
            + resident_bytes([p for p in params if p.requires_grad]))


def _check_batched(make_input: Callable[[int], Any]) -> None:
    if not callable(make_input):
        raise ValueError("monet_opt.largest_batch: make_input must be a function of the batch "
                         f"size returning a sample input, got a {type(make_input).__name__}")
    made = [make_input(b) for b in (1, 2)]
    shapes = [[tuple(t.shape) for t in pytree.tree_leaves(m) if isinstance(t, torch.Tensor)]
              for m in made]
    if not shapes[0]:
        raise ValueError("monet_opt.largest_batch: make_input(1) returned no tensor (got a "
                         f"{type(made[0]).__name__}): make_input(b) must return a batch of "
                         "b samples, e.g. lambda b: torch.randn(b, 3, 224, 224)")
    if shapes[0] == shapes[1]:
        raise ValueError("monet_opt.largest_batch: make_input(1) and make_input(2) gave inputs "
                         f"of the same shapes ({shapes[0]}): make_input(b) must return a batch "
                         "of b samples, e.g. lambda b: torch.randn(b, 3, 224, 224)")
