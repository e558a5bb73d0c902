"""optimize()'s plain arguments, checked before anything is traced: a wrong type or value says
which argument and what it takes (a string of variant names was split into characters, None
was not iterable, a string time limit failed a comparison, profile_repeats=0 was taken and
1.5 blamed the model)."""
from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Callable

import solvers


def check_arguments(solver: Any, time_limit_s: Any, profile_time_limit_s: Any,
                    new_shapes: Any, profile_repeats: Any, variants: Any,
                    allow_lossy: Any = False) -> tuple[float, float | None, int]:
    """ValueError or TypeError naming the first argument that is wrong; else time_limit_s,
    profile_time_limit_s and profile_repeats as Python numbers (numpy's int64 failed writing
    the profile's key, a Fraction printing the solve's progress)."""
    if solver not in solvers.available_solvers():
        raise ValueError(f"monet_opt.optimize: unknown solver {solver!r}; choose one of "
                         f"{solvers.available_solvers()}")
    if not _number(time_limit_s) or not 0 < time_limit_s < math.inf:  # inf: HiGHS's poll
        raise ValueError(f"monet_opt.optimize: time_limit_s must be a positive, finite number "
                         f"of seconds (the solvers' search), got {time_limit_s!r}")
    if profile_time_limit_s is not None and (not _number(profile_time_limit_s)
                                             or not profile_time_limit_s > 0):
        raise ValueError("monet_opt.optimize: profile_time_limit_s must be a positive number "
                         f"of seconds or None, got {profile_time_limit_s!r}")
    if new_shapes not in ("plan", "error"):
        raise ValueError(f"monet_opt.optimize: new_shapes must be 'plan' or 'error', got "
                         f"{new_shapes!r}")
    if isinstance(profile_repeats, bool) or not isinstance(profile_repeats, numbers.Integral) \
            or profile_repeats < 1:
        raise ValueError("monet_opt.optimize: profile_repeats must be an int of at least 1 "
                         f"(timed runs of each op), got {profile_repeats!r}")
    if not isinstance(variants, bool) and (isinstance(variants, (str, bytes)) or not all(
            isinstance(name, str) for name in _iterable(variants))):
        raise TypeError("monet_opt.optimize: variants must be True, False or a collection of "
                        f"family names (['relu.bool_mask']), got {variants!r}")
    if not isinstance(allow_lossy, bool):  # "False" turned the lossy variants on
        raise TypeError(f"monet_opt.optimize: allow_lossy must be True or False, got "
                        f"{allow_lossy!r}")
    return float(time_limit_s), profile_time_limit_s and float(profile_time_limit_s), \
        int(profile_repeats)


def check_options(who: str, options: dict[str, Any], optimize: Callable) -> None:
    """`options` as `who` hands them to every optimize(), checked before its first batch is
    traced: a typo or a bad solver failed only after the batches traced for their sizes."""
    own = {"model", "sample_input", "memory_limit"}
    params = inspect.signature(optimize).parameters
    unknown = [k for k in options if k not in params or k in own]
    if unknown:
        raise TypeError(f"monet_opt.{who}: {unknown[0]!r} is not one of optimize()'s options "
                        f"({', '.join(k for k in params if k not in own)})")
    check_arguments(*(options.get(k, params[k].default) for k in (
        "solver", "time_limit_s", "profile_time_limit_s", "new_shapes", "profile_repeats",
        "variants", "allow_lossy")))


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and \
        not math.isnan(value)


def _iterable(value: Any) -> Any:
    try:
        return iter(value)
    except TypeError:
        return iter([None])  # not a collection: refused by the caller
