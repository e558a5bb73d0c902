"""Limits for tests, derived from the step's own figures rather than fixed shares.

NOTE [Limits between the least peak and store-all]
  With kernels' scratch counted on CPU (NOTE [Allocation events]) a convolution backward's
  scratch grows with its activations, so small_cnn's least peak is about 60 % of its activations
  at any input size, where the live-bytes counter put it at 34 %: a fixed share such as '50% of
  activations' is no longer reachable. A test that means "a limit that forces some recomputation
  and can be met" takes it from the step's least peak and store-all peak instead.
"""
from __future__ import annotations

from typing import Any

import monet_opt


def figures(model: Any, x: Any, **options: Any) -> tuple[int, int, int]:
    """(floor, least peak, store-all peak): the floor is parameters, buffers, inputs and
    gradients; the least peak the one 'auto' reaches (plan.min_feasible_bytes)."""
    options = {"profile_repeats": 1, "time_limit_s": 5, "profile_dir": None, **options}
    plan = monet_opt.optimize(model, x, "100% of peak", **options).plan
    return plan.fixed_bytes + plan.gradient_bytes, plan.min_feasible_bytes, \
        plan.store_all_peak_bytes


def between(model: Any, x: Any, at: float = 0.5, **options: Any) -> int:
    """A limit in bytes `at` of the way from the least peak to the store-all peak."""
    _, least, peak = figures(model, x, **options)
    return least + int(at * (peak - least))


def share_between(model: Any, x: Any, at: float = 0.5, **options: Any) -> str:
    """The same limit written as a share of activations ('71.2% of activations'), rounded up
    to a tenth of a percent so that it stays above the least peak."""
    floor, least, peak = figures(model, x, **options)
    limit = least + at * (peak - least)
    return f"{-(-1000 * (limit - floor) // (peak - floor)) / 10:g}% of activations"
