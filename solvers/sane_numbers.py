"""NOTE [Numbers a problem may hold]
  A profile read back from a profile directory is checked as a Problem, and a time or size that
  was NaN or infinite passed checks of the form `< 0`: a NaN op time hung HiGHS, 1e300 overflowed
  a solver, a NaN workspace failed the simulator, on that call and on every later one (the
  directory's entry was never refused). Past these bounds a number is no measurement (a million
  seconds for one op, an exbibyte), so the problem is refused and the profile made again. Sizes
  are whole numbers and times real ones: 1.5 B made the DP time out on one op, "3" B raised a
  bare TypeError."""
from __future__ import annotations

import numbers
from typing import Any, Callable

MAX_SECONDS, MAX_BYTES = 1e6, 1 << 60


def check_numbers(p: Any, fail: Callable[[str], None]) -> None:
    """fail(message) where one of Problem `p`'s times or sizes is negative, NaN or absurd."""
    if not _bytes_ok(p.fixed_bytes):
        fail(f"fixed_bytes is not a whole number, negative or absurd ({p.fixed_bytes!r})")
    for op in p.ops:
        if not (_seconds_ok(op.time_s) and _seconds_ok(op.rerun_s)
                and _bytes_ok(op.workspace_bytes)):
            fail(f"op {op.name!r} has a negative, infinite or absurd time or workspace "
                 f"({op.time_s!r} s, rerun {op.rerun_s!r} s, {op.workspace_bytes!r} B)")
        first = op.first_workspace_bytes
        if first is not None and not (_bytes_ok(first) and first <= op.workspace_bytes):
            fail(f"op {op.name!r} has a first run's workspace ({first!r} B) that is not a "
                 f"whole number of bytes at most its workspace ({op.workspace_bytes!r} B)")
    for ten in p.tensors:
        if not _bytes_ok(ten.bytes):
            fail(f"tensor {ten.name!r} has bytes not a whole number, negative or absurd "
                 f"({ten.bytes!r})")
    for var in p.variants:
        if not (_bytes_ok(var.extra_workspace_bytes) and _real(var.extra_time_s)
                and abs(var.extra_time_s) < MAX_SECONDS):
            fail(f"variant {var.name!r} has a negative or absurd extra workspace "
                 f"({var.extra_workspace_bytes!r} B) or an absurd extra time "
                 f"({var.extra_time_s!r} s)")


def _seconds_ok(value: float) -> bool:
    return _real(value) and 0 <= value < MAX_SECONDS  # NaN fails too


def _bytes_ok(value: int) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and \
        0 <= value < MAX_BYTES


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
