"""A small sparse mixed-integer program and the open-source backends that solve it.

Formulations (milp.py) write to `Mip`; `solve_mip` hands it to HiGHS (default), CBC (through
PuLP) or CP-SAT (OR-Tools) with a time limit and an optional starting solution, and reports
what the backend proved: a time-limit stop with an incumbent is FEASIBLE, never OPTIMAL. HiGHS's
side (child processes, seeds, interrupts) is solvers/highs.py.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

from solvers.errors import SolverError

BACKENDS = ("highs", "cbc", "cpsat")


# NOTE [Rows that must hold to the byte]
#   A backend accepts a solution whose rows miss their bounds by its feasibility tolerances,
#   relative to the rows' scale (HiGHS: 1e-7 on rows, 1e-6 on integrality), and a memory row
#   counts bytes: at a budget of 3.5 GiB, the joint MILP's schedule of a 9-op chain of 1 GiB
#   tensors peaked 1 B over the budget the program held it to, and the solve stopped with
#   "its memory rows are wrong" (solvers fuzzing, 2026-12-06: from 16 MiB tensors up; HiGHS
#   at tolerances of 1e-9 met the budget). So a program held to a budget writes its memory
#   rows against the budget less one part in a million of it (`within`): 3.5 KiB at 3.5 GiB,
#   nothing under 1 MB. A schedule peaking in the band between is missed, never one over the
#   budget returned; and with sizes multiples of 512 B such schedules are common (solvers
#   fuzzing: a 6.25 s schedule peaking at the budget, the MILP's 6.75 s called optimal), so
#   where the band is not empty the program's "optimal" and its bound are not reported as
#   the budget's (the bounds reported hold for every schedule). A program that bounds the
#   time from below writes its rows against the budget plus the band (`beyond`): HiGHS at
#   presolve called 8.2 s optimal for a 1-cut bound program of 2 GiB tensors whose 8.1 s
#   assignment met every row, and "auto" reported the slower schedule optimal. The
#   least-peak programs, whose budget is a variable, are simulated.
BUDGET_BAND = 1e-6


def band(budget_bytes: float) -> int:
    """The bytes under `budget_bytes` a program held to it does not search."""
    return math.floor(budget_bytes * BUDGET_BAND)


def within(budget_bytes: float) -> float:
    """The bound a memory row of a program held to `budget_bytes` is written against."""
    return budget_bytes - band(budget_bytes)


def beyond(budget_bytes: float) -> float:
    """The bound a memory row of a program bounding the time from below is written against."""
    return budget_bytes + band(budget_bytes)


@dataclass
class Mip:
    """min cost·x + offset  s.t.  lo <= A x <= hi,  lb <= x <= ub,  x integer where marked."""

    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[list[int], list[float], float, float]] = field(default_factory=list)
    offset: float = 0.0
    trivially_infeasible: bool = False  # a row with no variables that cannot hold

    def var(self, lb: float = 0.0, ub: float = 1.0, cost: float = 0.0,
            integer: bool = True) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.cost.append(cost)
        self.integer.append(integer)
        return len(self.lb) - 1

    def row(self, terms: list[tuple[int, float]], lo: float = -math.inf,
            hi: float = math.inf) -> None:
        merged: dict[int, float] = {}
        for j, c in terms:
            merged[j] = merged.get(j, 0.0) + c
        idx = [j for j, c in merged.items() if c != 0.0]
        if not idx:
            self.trivially_infeasible |= not lo <= 0.0 <= hi
            return
        self.rows.append((idx, [merged[j] for j in idx], lo, hi))

    @property
    def num_vars(self) -> int:
        return len(self.lb)


@dataclass(frozen=True)
class MipResult:
    """status: "optimal" | "feasible" | "infeasible" | "timeout". bound: the best proven lower
    bound on the objective (offset included), or None where the backend gives none."""

    status: str
    values: list[float] | None
    objective: float | None
    bound: float | None


def solve_mip(mip: Mip, backend: str = "highs", time_limit_s: float = 60.0,
              start: list[float] | None = None, rel_gap: float = 1e-3) -> MipResult:
    """Solve `mip`; `start` is a full assignment the backend may begin from."""
    if backend not in BACKENDS:
        raise SolverError(f"unknown MILP backend {backend!r}; choose one of {BACKENDS}")
    if time_limit_s <= 0:
        raise SolverError(f"time_limit_s must be positive, got {time_limit_s}")
    if mip.trivially_infeasible:
        return MipResult("infeasible", None, None, None)
    if mip.num_vars == 0:
        return MipResult("optimal", [], mip.offset, mip.offset)
    return {"highs": _highs, "cbc": _cbc, "cpsat": _cpsat}[backend](
        mip, time_limit_s, start, rel_gap)


def solve_relaxation(mip: Mip, time_limit_s: float) -> MipResult:
    """The linear relaxation (integrality dropped), with HiGHS: its optimum is a lower bound and
    its values guide rounding heuristics."""
    if mip.trivially_infeasible:
        return MipResult("infeasible", None, None, None)
    if mip.num_vars == 0:
        return MipResult("optimal", [], mip.offset, mip.offset)
    return _highs(mip, time_limit_s, None, 0.0, relax=True)


def _highs(mip: Mip, time_limit_s: float, start, rel_gap: float,
           relax: bool = False) -> MipResult:
    from solvers import highs  # here: it imports this module's types
    return highs.solve(mip, time_limit_s, start, rel_gap, relax)


def _cbc(mip: Mip, time_limit_s: float, start, rel_gap: float) -> MipResult:
    import pulp

    prob = pulp.LpProblem("monet", pulp.LpMinimize)
    xs = [pulp.LpVariable(f"x{j}", lowBound=mip.lb[j],
                          upBound=None if math.isinf(mip.ub[j]) else mip.ub[j],
                          cat=pulp.LpInteger if mip.integer[j] else pulp.LpContinuous)
          for j in range(mip.num_vars)]
    prob += pulp.lpSum(c * xs[j] for j, c in enumerate(mip.cost) if c) + mip.offset
    for r_idx, r_val, lo, hi in mip.rows:
        expr = pulp.lpSum(c * xs[j] for j, c in zip(r_idx, r_val))
        if lo == hi:
            prob += expr == lo
        else:
            if not math.isinf(lo):
                prob += expr >= lo
            if not math.isinf(hi):
                prob += expr <= hi
    if start is not None:
        for x, v in zip(xs, start):
            x.setInitialValue(v)
    with warnings.catch_warnings():  # PuLP 3 deprecates the bundled CBC; it still ships it
        warnings.simplefilter("ignore", DeprecationWarning)
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=rel_gap,
                                   warmStart=start is not None)
        prob.solve(solver)
    # NOTE: PuLP calls a time-limit stop "Optimal" in LpStatus; sol_status tells the truth.
    if prob.sol_status == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible:
        return MipResult("infeasible", None, None, None)
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return MipResult("timeout", None, None, None)
    values = [x.value() or 0.0 for x in xs]
    objective = pulp.value(prob.objective)
    if prob.sol_status == pulp.LpSolutionOptimal:
        return MipResult("optimal", values, objective, objective)
    return MipResult("feasible", values, objective, None)


def _cpsat(mip: Mip, time_limit_s: float, start, rel_gap: float) -> MipResult:
    """CP-SAT needs integers: every variable becomes integer (continuous ones in our models are
    sums of integer terms) and the objective is scaled so its largest cost becomes 1e6."""
    from ortools.sat.python import cp_model

    scale = 1e6 / max(1e-12, max((abs(c) for c in mip.cost), default=1.0))
    model = cp_model.CpModel()
    big = 2 ** 62
    xs = [model.NewIntVar(math.ceil(mip.lb[j]), big if math.isinf(mip.ub[j])
                          else math.floor(mip.ub[j]), f"x{j}") for j in range(mip.num_vars)]
    for r_idx, r_val, lo, hi in mip.rows:
        if any(c != round(c) for c in r_val):
            raise SolverError("the CP-SAT backend needs integer constraint coefficients")
        expr = sum(int(c) * xs[j] for j, c in zip(r_idx, r_val))
        model.AddLinearConstraint(expr, -big if math.isinf(lo) else math.ceil(lo),
                                  big if math.isinf(hi) else math.floor(hi))
    model.Minimize(sum(round(c * scale) * xs[j] for j, c in enumerate(mip.cost) if c))
    if start is not None:
        for x, v in zip(xs, start):
            model.AddHint(x, round(v))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = 8
    solver.parameters.relative_gap_limit = rel_gap
    code = solver.Solve(model)
    if code == cp_model.INFEASIBLE:
        return MipResult("infeasible", None, None, None)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return MipResult("timeout", None, None, None)
    values = [float(solver.Value(x)) for x in xs]
    objective = sum(c * v for c, v in zip(mip.cost, values)) + mip.offset
    bound = solver.BestObjectiveBound() / scale + mip.offset
    status = "optimal" if code == cp_model.OPTIMAL else "feasible"
    return MipResult(status, values, objective, min(bound, objective))
