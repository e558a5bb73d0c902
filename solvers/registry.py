"""Every solver behind one signature: solve(problem, budget_bytes, solver=name, options)."""
from __future__ import annotations

import time
from typing import Any, Callable

from solvers import baselines
from solvers.errors import UnknownSolverError
from solvers.problem import Problem
from solvers.schedule import SolveResult, Status

SolverFn = Callable[[Problem, int, Any], SolveResult]

_REGISTRY: dict[str, tuple[SolverFn, type]] = {
    "store_all": (baselines.store_all, baselines.BaselineOptions),
    "chen_sqrt": (baselines.chen_sqrt, baselines.BaselineOptions),
    "chen_greedy": (baselines.chen_greedy, baselines.BaselineOptions),
}


def available_solvers() -> list[str]:
    return ["auto", *_REGISTRY]


def solve(problem: Problem, budget_bytes: int, solver: str = "auto",
          options: Any = None) -> SolveResult:
    """Find a schedule whose simulated peak is at most `budget_bytes` (fixed memory included).

    "auto" runs every registered solver and returns the fastest feasible schedule; its
    `min_feasible_bytes` is the least peak any of them reaches. An infeasible budget is not an
    exception here: the result has status INFEASIBLE and says the least budget that would do.
    """
    if solver == "auto":
        return _auto(problem, budget_bytes)
    if solver not in _REGISTRY:
        raise UnknownSolverError(
            f"solvers.solve: no solver named {solver!r}; available: {available_solvers()}")
    fn, options_type = _REGISTRY[solver]
    return fn(problem, budget_bytes, options if options is not None else options_type())


def _auto(problem: Problem, budget_bytes: int) -> SolveResult:
    start = time.perf_counter()
    results = [solve(problem, budget_bytes, name) for name in _REGISTRY]
    min_peak = min(r.min_feasible_bytes for r in results if r.min_feasible_bytes is not None)
    feasible = [r for r in results if r.feasible]
    elapsed = time.perf_counter() - start
    if not feasible:
        return SolveResult(solver="auto", status=Status.INFEASIBLE, schedule=None,
                           objective_s=None, peak_bytes=None, bound_s=results[0].bound_s,
                           gap=None, solve_time_s=elapsed, min_feasible_bytes=min_peak)
    best = min(feasible, key=lambda r: (r.objective_s, r.peak_bytes))
    return SolveResult(solver=f"auto:{best.solver}", status=best.status, schedule=best.schedule,
                       objective_s=best.objective_s, peak_bytes=best.peak_bytes,
                       bound_s=best.bound_s, gap=best.gap, solve_time_s=elapsed,
                       min_feasible_bytes=min_peak)
