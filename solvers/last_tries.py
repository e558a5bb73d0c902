"""What auto tries last where nothing it found fits: the least peak in the time left, and
Checkmate's program.

NOTE [Checkmate where nothing fits]
  Auto's programs recompute at the starts of their stages only and hold a kept tensor to its
  last read; Checkmate's (solvers/checkmate_program.py) may drop a held tensor at any backward
  op and recompute it before a later one, and so reaches lower peaks: a 4-layer tanh MLP
  (batch 512) was refused at 700,000 B by auto, saying no schedule of its space peaks below
  755,728 B and a longer solve would find none, where Checkmate planned it at 641,296 B,
  measured to the byte and bitwise eager's (closures probe, 2026-12-07). Where nothing of
  auto's fits, it now runs Checkmate's program in what is left of its time (at least
  CHECKMATE_SHARE of it), on problems of up to CHECKMATE_OPS forward ops (its program grows
  with their square: DenseNet-121's took 16 s to build), and takes its schedule where it fits.
  Its least peak is not said where it finds no plan: the profiling pass cannot keep to it (a
  tanh net's pass peaked at 3,252,544 B under limits down to 2,973,549 B that Checkmate met,
  and optimize() near such a least passed its limit by 12 %; README: near the least peak the
  pass can pass the limit), so a refusal names auto's own. Not run below the bound the step's
  sizes set, where nothing fits (the probes keep their time there: a chain's least, asked
  with a budget of 1 B, came out 7 % over its bound where it had been within 2 %).
"""
from __future__ import annotations

import time

from solvers import checkmate, probes
from solvers.peak_bound import least_peak_bound
from solvers.problem import Problem
from solvers.remembered import floor_of
from solvers.schedule import Schedule, SolveResult

CHECKMATE_SHARE = 0.2
CHECKMATE_OPS = 400
# Checkmate's least-peak program's share of that time: the budgeted program is what finds a
# plan. With a quarter (and with 0.6) on a 12x64 tanh MLP at 0.99 of auto's least, the
# least-peak program took its time without finishing and the budgeted one timed out, so that
# limit was refused while 0.9 of it was planned (reorder probe, 2026-12-07); with a tenth both
# are planned (1,656,920 and 1,444,696 B)
LEAST_SHARE = 0.1


def last_tries(problem: Problem, budget_bytes: int, start: float, limit: float,
               min_peak: int | None, floor: Schedule | None
               ) -> tuple[int | None, Schedule | None, list[SolveResult]]:
    """(least peak, its schedule, [a schedule within the budget] or []) from the probes under
    auto's least peak (NOTEs [The least peak in the time left], [Probes under the least peak]),
    then Checkmate's program (NOTE [Checkmate where nothing fits]), until `start` + `limit`."""
    from solvers.registry import solve  # it calls this
    deadline = start + limit
    checkmate_too = len(problem.forward_ops) <= CHECKMATE_OPS and \
        budget_bytes >= least_peak_bound(problem).bytes  # else none fits, whatever it does
    late = probes.least_until(problem, budget_bytes, deadline - limit * CHECKMATE_SHARE
                              if checkmate_too else deadline, min_peak)
    min_peak, floor = floor_of([(min_peak, floor), (late.min_feasible_bytes,
                                                    late.floor_schedule)])
    if late.feasible or not checkmate_too:
        return min_peak, floor, [late] if late.feasible else []
    moved = solve(problem, budget_bytes, "checkmate", checkmate.CheckmateOptions(
        time_limit_s=max(1.0, deadline - time.perf_counter()), least_share=LEAST_SHARE))
    return min_peak, floor, [moved] if moved.feasible else []  # its least alone is not said
