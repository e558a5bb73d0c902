"""What optimize() is doing, told on the `monet_opt` logger.

NOTE [Progress]
  A first optimize() of a large model traces it, profiles every op on the device and solves
  for half a minute or more; only a profiling that ran long said so (its progress, printed to
  stderr: monet_opt/profile_budget.py), and a call served from the profile directory looked
  the same from outside. Each planned step now logs, at INFO on the
  `monet_opt` logger (silent unless the program turns logging on, e.g.
  `logging.basicConfig(level=logging.INFO)`), when it starts tracing, profiling and solving,
  how long the last two took, and the plan it made: its predicted peak against the limit, its
  predicted overhead, the solver, and whether the profile and the schedule came from the
  directory.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from monet_opt.plan import Plan
from monet_opt.units import format_bytes

log = logging.getLogger("monet_opt")


def tracing(name: str, inputs: str) -> None:
    log.info("%s: tracing one training step on %s ...", name, inputs)


class Progress:
    """The phases of planning one step of `name`, logged as they run."""

    def __init__(self, name: str, timed: bool = True) -> None:
        """timed False: the step is not to be profiled (its sizes only: lower_problem)."""
        self.name, self.timed = name, timed
        self.profiled = self.solved = False

    def profiling(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """`fn` (the profiler's run), logged."""
        def run():
            self.profiled = True
            log.info("%s: profiling every op ...", self.name)
            start = time.perf_counter()
            out = fn()
            log.info("%s: profiled in %.1f s", self.name, time.perf_counter() - start)
            return out
        return run

    def solving(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` (solvers.solve: problem, budget bytes, solver, ...), logged."""
        def run(problem, budget, solver, *args, **kwargs):
            self.solved = True
            limit = kwargs.get("time_limit_s")
            log.info("%s: solving for %s with %r%s ...", self.name, _size(budget), solver,
                     "" if limit is None else f" (up to {limit:g} s)")
            return fn(problem, budget, solver, *args, **kwargs)
        return run

    def planned(self, plan: Plan, inputs: str) -> None:
        cached = [what for what, done in (("profile", self.profiled or not self.timed),
                                          ("schedule", self.solved)) if not done]
        log.info("%s: plan for %s: predicted peak %s of %s (store-all %s), %+.1f %% step time, "
                 "%d op runs recomputed, solver %s (%s, %s %.1f s)%s", self.name, inputs,
                 format_bytes(plan.predicted_peak_bytes), format_bytes(plan.memory_limit_bytes),
                 format_bytes(plan.store_all_peak_bytes), plan.predicted_overhead * 100,
                 plan.recomputed_ops, plan.solver, plan.status,
                 "solved in" if self.solved else "solved before, in", plan.solve_time_s,
                 (f"; {' and '.join(cached)} from the profile directory" if cached else "")
                 + ("" if self.timed else "; sizes only, not profiled"))


def _size(n: int) -> str:
    return "no limit" if n >= 2 ** 62 else format_bytes(n)
