"""NOTE [Numbers a problem may hold]
  A profile read back from a profile directory is checked as a Problem, and a time or size that
  was NaN or infinite passed checks of the form `< 0`: a NaN op time hung HiGHS, 1e300 overflowed
  a solver, a NaN workspace failed the simulator, on that call and on every later one (the
  directory's entry was never refused). Past these bounds a number is no measurement (a million
  seconds for one op, an exbibyte), so the problem is refused and the profile made again."""
from __future__ import annotations

from typing import Any, Callable

MAX_SECONDS, MAX_BYTES = 1e6, 1 << 60


def check_numbers(p: Any, fail: Callable[[str], None]) -> None:
    """fail(message) where one of Problem `p`'s times or sizes is negative, NaN or absurd."""
    if not _bytes_ok(p.fixed_bytes):
        fail(f"fixed_bytes is negative or absurd ({p.fixed_bytes})")
    for op in p.ops:
        if not (_seconds_ok(op.time_s) and _seconds_ok(op.rerun_s)
                and _bytes_ok(op.workspace_bytes)):
            fail(f"op {op.name!r} has a negative, infinite or absurd time or workspace "
                 f"({op.time_s} s, rerun {op.rerun_s} s, {op.workspace_bytes} B)")
    for ten in p.tensors:
        if not _bytes_ok(ten.bytes):
            fail(f"tensor {ten.name!r} has negative or absurd bytes ({ten.bytes})")
    for var in p.variants:
        if not (_bytes_ok(var.extra_workspace_bytes) and abs(var.extra_time_s) < MAX_SECONDS):
            fail(f"variant {var.name!r} has a negative or absurd extra workspace "
                 f"({var.extra_workspace_bytes} B) or an absurd extra time ({var.extra_time_s} s)")


def _seconds_ok(value: float) -> bool:
    return 0 <= value < MAX_SECONDS  # NaN fails too


def _bytes_ok(value: int) -> bool:
    return 0 <= value < MAX_BYTES
