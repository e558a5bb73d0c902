"""NOTE [In-place accumulation] (solvers/problem.py) into a gradient other ops read before,
and NOTE [Backward ops reordered] (solvers/simulate.py)."""
from __future__ import annotations

import pytest

from solvers import (InvalidProblemError, InvalidScheduleError, NO_PRODUCER, Op, Problem,
                     Schedule, Tensor, simulate)


def _passed_on(inplace_at: str = "acc") -> Problem:
    # fixed 100; f0 -> a0 (10); b1(t, a0) -> g (40); c(g) -> u (10, returned); b2(t) -> h (40);
    # acc(g, h) -> s (40, returned), written into g, which c read before it (a residual
    # block's gradient, passed on to the shortcut)
    ops = (Op("f0", False, 1.0, (), (0,)), Op("b1", True, 1.0, (1, 0), (2,)),
           Op("c", True, 1.0, (2,), (3,), inplace_bytes=10 if inplace_at == "c" else 0),
           Op("b2", True, 1.0, (1,), (4,)),
           Op("acc", True, 1.0, (2, 4), (5,), inplace_bytes=40 if inplace_at == "acc" else 0))
    return Problem(ops=ops, tensors=(Tensor("a0", 10, 0), Tensor("t", 10, NO_PRODUCER),
                                     Tensor("g", 40, 1), Tensor("u", 10, 2),
                                     Tensor("h", 40, 3), Tensor("s", 40, 4)),
                   fixed_bytes=100, forward_outputs=(0,), backward_outputs=(5, 3))


def test_inplace_into_an_input_read_before():
    """NOTE [In-place accumulation]: the last reader of a gradient writes into it, whichever
    ops read it before; not an op that a later one follows in reading it, and no schedule may
    run that later reader after the write (NOTE [Backward ops reordered])."""
    problem = _passed_on()
    assert simulate(problem, Schedule(frozenset({0}), (1, 2, 3, 4))).live_bytes == \
        (110, 160, 160, 200, 190)  # 230 while acc runs, written anew
    assert simulate(_passed_on(""), Schedule(frozenset({0}), (1, 2, 3, 4))).peak_bytes == 230
    with pytest.raises(InvalidProblemError, match="in place"):
        _passed_on("c")  # acc reads g after c
    with pytest.raises(InvalidScheduleError, match="reordered"):
        simulate(problem, Schedule(frozenset({0}), (1, 3, 4, 2)))
