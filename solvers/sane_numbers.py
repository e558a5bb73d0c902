"""NOTE [Numbers a problem may hold]
  A profile read back from a profile directory is checked as a Problem, and a time or size that
  was NaN or infinite passed checks of the form `< 0`: a NaN op time hung HiGHS, 1e300 overflowed
  a solver, a NaN workspace failed the simulator, on that call and on every later one (the
  directory's entry was never refused). Past these bounds a number is no measurement (a million
  seconds for one op, an exbibyte), so the problem is refused and the profile made again. Sizes
  are whole numbers and times real ones: 1.5 B made the DP time out on one op, "3" B raised a
  bare TypeError. A variant's extra workspace may be negative, down to what leaves its op a
  workspace of 0 (NOTE [A variant's workspace below its op's] in solvers/variant_checks.py).
  A step's sizes together stay under 2**48 B (256 TiB, past any device): the programs count
  bytes in floating point, and a two-op step of a 1 PiB tensor got back from the least-peak
  program a schedule that dropped the tensor its backward reads (solvers fuzzing, 2026-12-06;
  2**49 B solved)."""
from __future__ import annotations

import numbers
from typing import Any, Callable

from solvers.errors import InvalidProblemError, SolverError
from solvers.variant_checks import least_workspaces

MAX_SECONDS, MAX_BYTES = 1e6, 1 << 48


def check_numbers(p: Any, fail: Callable[[str], None]) -> None:
    """fail(message) where one of Problem `p`'s times or sizes is negative, NaN or absurd."""
    if not _bytes_ok(p.fixed_bytes):
        fail(f"fixed_bytes is not a whole number, negative or absurd ({p.fixed_bytes!r})")
    for op in p.ops:
        if not (_seconds_ok(op.time_s) and _seconds_ok(op.rerun_s)
                and _bytes_ok(op.workspace_bytes)):
            fail(f"op {op.name!r} has a negative, infinite or absurd time or workspace "
                 f"({op.time_s!r} s, rerun {op.rerun_s!r} s, {op.workspace_bytes!r} B)")
        for first in (op.first_workspace_bytes, op.captured_workspace_bytes):
            if first is not None and not (_bytes_ok(first) and first <= op.workspace_bytes):
                fail(f"op {op.name!r} has a first run's workspace ({first!r} B) that is not a "
                     f"whole number of bytes at most its workspace ({op.workspace_bytes!r} B)")
    states = [op.state_bytes for op in p.ops]
    if not all(_bytes_ok(b) for b in states) or sum(states) > p.fixed_bytes:
        fail("an op's generator state is not a whole number of bytes, or the states come to "
             f"more than fixed_bytes ({sum(states)!r} B of {p.fixed_bytes!r}): they are part "
             "of it (NOTE [States kept only where used] in monet_opt/recompute.py)")
    for ten in p.tensors:
        if not _bytes_ok(ten.bytes):
            fail(f"tensor {ten.name!r} has bytes not a whole number, negative or absurd "
                 f"({ten.bytes!r})")
    total = p.fixed_bytes + sum(t.bytes for t in p.tensors) + sum(o.workspace_bytes for o in p.ops)
    if total >= MAX_BYTES:
        fail(f"its sizes come to {total} B, past any device (2**48 B): refused (NOTE [Numbers a "
             "problem may hold] in solvers/sane_numbers.py)")
    for var in p.variants:
        extra = var.extra_workspace_bytes
        if not (_whole(extra) and abs(extra) < MAX_BYTES and _real(var.extra_time_s)
                and abs(var.extra_time_s) < MAX_SECONDS):
            fail(f"variant {var.name!r} has an extra workspace that is not a whole number or "
                 f"absurd ({extra!r} B) or an absurd extra time ({var.extra_time_s!r} s)")
    for op, least in zip(p.ops, least_workspaces(p)):
        if least < 0:  # NOTE [A variant's workspace below its op's]
            fail(f"op {op.name!r} has {op.workspace_bytes!r} B of workspace and its variants "
                 f"may take off {op.workspace_bytes - least!r} B (each group's most): a "
                 "variant may not leave its op a negative workspace")


def check_solve_arguments(problem: Any, budget_bytes: Any, time_limit_s: Any) -> None:
    """SolverError where solve's problem is not a Problem (None or a dict failed deep inside,
    AttributeError 'with_variants'), its budget is not a number or NaN, or its time limit is
    not a positive number (a NaN budget got a schedule from milp and a TypeError from auto; a
    NaN time limit passed a check of the form `<= 0`)."""
    from solvers.problem import Problem  # this module is the problem's own checker
    if not isinstance(problem, Problem):
        raise InvalidProblemError(f"solvers.solve: problem must be a solvers.Problem (from "
                                  f"Problem.from_dict for a dict), got {type(problem).__name__}")
    if not _real(budget_bytes) or budget_bytes != budget_bytes:
        raise SolverError(f"solvers.solve: budget_bytes must be a number of bytes, got "
                          f"{budget_bytes!r}")
    if time_limit_s is not None and not (_real(time_limit_s) and time_limit_s > 0):
        raise SolverError(f"solvers.solve: time_limit_s must be a positive number of seconds "
                          f"or None, got {time_limit_s!r}")


def _seconds_ok(value: float) -> bool:
    return _real(value) and 0 <= value < MAX_SECONDS  # NaN fails too


def _bytes_ok(value: int) -> bool:
    return _whole(value) and 0 <= value < MAX_BYTES


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def plain_number(value: Any) -> int | float:
    """A number of another type (numpy's int64, float32), which the checks take as whole or
    real, as JSON writes it; to_json raised TypeError on it."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not a number JSON can hold")
