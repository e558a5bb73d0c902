"""Checkmate's MILP (Jain et al., MLSys 2020) as a baseline: solving its program
(solvers/checkmate_program.py) within a time limit.

The program is O(stages x forward ops). Above `max_exact_vars` integer variables it solves the
LP relaxation instead and rounds it as Checkmate's approximation does (at 90 % of the budget,
for slack), in two phases: deterministic thresholds on the relaxation's kept set S[0], then the
recompute-on-demand schedule for each rounded set (solvers.ondemand); the relaxation at the
budget itself gives the bound (and is rounded too). The note says so; the status is never
optimal. Bounds: the MILP's dual bound, or the LP relaxation's value where the LP solved to
optimality; both hold within this space (recomputations run in op order before a backward op).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass

from solvers.checkmate_program import CheckmateProgram, OutOfTime
from solvers.counted import counted_above
from solvers.highs import CHILD_GRACE_S
from solvers.mip import MipResult, band, solve_mip, solve_relaxation
from solvers.ondemand import schedule_from_kept
from solvers.problem import Problem
from solvers.schedule import Schedule, SolveResult, Status, gap_of
from solvers.simulate import fastest_within, simulate


@dataclass(frozen=True)
class CheckmateOptions:
    """backend: "highs" | "cbc" | "cpsat" (the LP relaxation always uses HiGHS). time_limit_s:
    wall time for the whole solve (least_share of it goes to the least-peak program, once per
    problem). rel_gap: stop once the proven gap is below this. max_exact_vars: above this many
    integer variables, LP relaxation and rounding instead of the MILP."""

    backend: str = "highs"
    time_limit_s: float = 60.0
    rel_gap: float = 1e-3
    max_exact_vars: int = 30000
    least_share: float = 0.25


@dataclass(frozen=True)
class LeastPeak:
    """peak_bytes: the least simulated peak among Checkmate's schedules; schedule: one that
    reaches it. floor_bytes: where the least-peak program was solved to optimality, its proven
    optimum (no budget below it admits a solution of the program); else None."""

    peak_bytes: int
    schedule: Schedule
    floor_bytes: int | None


def checkmate_milp(problem: Problem, budget_bytes: int, options: CheckmateOptions) -> SolveResult:
    """Least step time within the budget in Checkmate's space: the MILP (no warm start, as in
    Checkmate), or on large graphs the LP relaxation and its rounding. The least-peak schedule
    is also a candidate, so a budget at min_feasible_bytes is always met. Building the program
    counts against the time limit: where it is not built in time (DenseNet-121's has 2.6M
    integer variables, about 16 s of Python here), the least-peak schedule is the answer."""
    start = time.perf_counter()
    deadline = start + options.time_limit_s
    least = least_peak(problem, options)  # cached; a quarter of the limit
    # Above store-all's peak a budget holds no schedule more: the program is built at that
    # peak. Built at 2**63 - 1 its rows' bounds (~9e18) broke HiGHS: a slower schedule than
    # store-all's came back "optimal" (solvers fuzzing, 2026-12-02).
    store_all = schedule_from_kept(problem, problem.saved_for_backward)
    roof = simulate(problem, store_all).peak_bytes
    res, scheds, how, notes = MipResult("infeasible", None, None, None), [], "milp", []
    if least.floor_bytes is None or budget_bytes >= least.floor_bytes:
        try:
            program = CheckmateProgram(problem, min(budget_bytes, roof), deadline)
            res, scheds, how = _run(program, options, deadline - program.freeing_s)
            if how != "milp":
                notes.append(
                    f"{program.num_integer_vars} integer variables (over "
                    f"{options.max_exact_vars}): Checkmate's LP relaxation (at 90 % and 100 % "
                    f"of the budget) rounded: kept set S[0] >= tau, recomputing on demand")
            del program  # freed within the time counted
        except OutOfTime as e:
            res = MipResult("timeout", None, None, None)
            notes.append(str(e))
    # store-all too: the program's rows are held a band under the budget (NOTE [Rows that must
    # hold to the byte] in solvers/mip.py), where store-all's peak may lie
    candidates = [(s, how) for s in scheds] + [(least.schedule, "least-peak program"),
                                                (store_all, "store-all")]
    best = fastest_within(problem, budget_bytes, candidates, "Checkmate")
    elapsed = time.perf_counter() - start
    if best is None:
        status = Status.TIMEOUT if res.status == "timeout" else Status.INFEASIBLE
        return SolveResult(solver="checkmate", status=status, schedule=None, objective_s=None,
                           peak_bytes=None, bound_s=None, gap=None, solve_time_s=elapsed,
                           min_feasible_bytes=least.peak_bytes,
                           note="; ".join(notes + [f"the backend ended {res.status}"]))
    sched, sim, origin = best
    if origin != how:
        notes.append(f"the schedule is the {origin}'s; the backend ended {res.status}")
    bound = problem.no_recompute_time_s
    above = counted_above(problem, first_runs=False)  # NOTE [Counted above the step]
    if res.bound is not None and res.status != "infeasible" and above:
        notes.append(f"the program's bound counting {above} at full size is "
                     f"{res.bound:.6g} s; the bound reported is the no-recompute time")
    elif res.bound is not None and res.status != "infeasible" and not band(budget_bytes):
        bound = max(bound, res.bound)  # a dual bound holds at a stop, at the budget itself
        # (NOTE [Rows that must hold to the byte] in solvers/mip.py)
    gap = gap_of(sim.time_s, bound)
    proven = how == "milp" and origin == "milp" and res.status == "optimal"
    status = Status.OPTIMAL if proven and gap <= options.rel_gap + 1e-9 else Status.FEASIBLE
    return SolveResult(solver="checkmate", status=status, schedule=sched, objective_s=sim.time_s,
                       peak_bytes=sim.peak_bytes, bound_s=bound, gap=gap, solve_time_s=elapsed,
                       min_feasible_bytes=min(least.peak_bytes, sim.peak_bytes),
                       note="; ".join(notes), floor_schedule=sched  # its least, met again
                       if sim.peak_bytes < least.peak_bytes else None)


def _run(program: CheckmateProgram, options: CheckmateOptions, deadline: float,
         rel_gap: float | None = None) -> tuple[MipResult, list[Schedule], str]:
    """The MILP where it is small enough (given at least a second), else Checkmate's
    approximation until `deadline`: round the LP relaxation at 90 % of the budget (Checkmate's
    slack for rounding), then solve it at the budget itself for a bound, and round that too.
    Returns the backend's result at the budget (status "timeout" and no bound for an LP stopped
    early: it proves nothing), the schedules, and which way ("milp" or "LP rounding")."""
    if program.num_integer_vars <= options.max_exact_vars:
        gap = options.rel_gap if rel_gap is None else rel_gap
        res = solve_mip(program.mip, options.backend,
                        max(1.0, deadline - time.perf_counter()), None, gap)
        return res, ([program.schedule(res.values)] if res.values is not None else []), "milp"
    scheds: list[Schedule] = []
    budget = program.budget
    if budget is not None:
        fixed = program.problem.fixed_bytes  # Checkmate's budget counts activations only
        program.rebudget(fixed + int(0.9 * (budget - fixed)))
        lp = _relaxation(program, (deadline + time.perf_counter()) / 2)
        scheds += program.roundings(lp.values, deadline) if lp.values is not None else []
        program.rebudget(budget)
    lp = _relaxation(program, deadline)
    scheds += program.roundings(lp.values, deadline) if lp.values is not None else []
    res = lp if lp.status in ("optimal", "infeasible") else \
        dataclasses.replace(lp, status="timeout", bound=None)
    return res, scheds, "LP rounding"


def _relaxation(program: CheckmateProgram, deadline: float) -> MipResult:
    """The LP relaxation by `deadline`: above max_exact_vars it is solved in a child process,
    which HiGHS's side lets run a grace past its limit (NOTE [HiGHS in a child process])."""
    left = deadline - time.perf_counter() - CHILD_GRACE_S
    if left <= 0:
        return MipResult("timeout", None, None, None)
    return solve_relaxation(program.mip, left)


@functools.lru_cache(maxsize=8)
def least_peak(problem: Problem, options: CheckmateOptions) -> LeastPeak:
    """The least simulated peak among Checkmate's schedules: the least-peak program (the budget
    its objective, solved to a zero gap; MILP or LP rounding as above) given least_share of the
    time limit (at least a second), building included, and checkpoint-all (keep everything the
    backward reads). Cached per problem, so the budget it reports is met again by the same
    call."""
    deadline = time.perf_counter() + max(1.0, options.time_limit_s * options.least_share)
    store_all = schedule_from_kept(problem, problem.saved_for_backward)
    best = (simulate(problem, store_all).peak_bytes, store_all)
    try:
        program = CheckmateProgram(problem, None, deadline)
    except OutOfTime:
        return LeastPeak(peak_bytes=best[0], schedule=best[1], floor_bytes=None)
    res, scheds, how = _run(program, options, deadline - program.freeing_s, rel_gap=0.0)
    for sched in scheds:
        best = min(best, (simulate(problem, sched).peak_bytes, sched), key=lambda b: b[0])
    floor = None
    if how == "milp" and res.status == "optimal" and res.bound is not None:
        floor = math.ceil(res.bound - 1e-6 * max(1.0, abs(res.bound)))
    return LeastPeak(peak_bytes=best[0], schedule=best[1], floor_bytes=floor)
