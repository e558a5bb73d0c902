"""A small sparse mixed-integer program and the open-source backends that solve it.

Formulations (milp.py) write to `Mip`; `solve_mip` hands it to HiGHS (default), CBC (through
PuLP) or CP-SAT (OR-Tools) with a time limit and an optional starting solution, and reports
what the backend proved: a time-limit stop with an incumbent is FEASIBLE, never OPTIMAL.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import multiprocessing
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

from solvers.errors import SolverError

BACKENDS = ("highs", "cbc", "cpsat")


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


# NOTE [HiGHS in a child process]
#   The interrupt callbacks below do not reach everything: on ResNet-50's least-peak program
#   (12k variables) HiGHS 1.12 spent 78 s in one round of root cut separation under a 7.5 s
#   limit, with no callback between. A program this large is therefore solved in a forked
#   child that streams each improving solution back; at the limit plus CHILD_GRACE_S the
#   child is killed and the last solution it sent is the result (status "feasible", or
#   "timeout" without one; the bound it last reported, if any). Small programs, and platforms
#   without fork, solve in this process.
CHILD_MIN_VARS = 2000
CHILD_GRACE_S = 1.0


def _highs(mip: Mip, time_limit_s: float, start, rel_gap: float,
           relax: bool = False) -> MipResult:
    if mip.num_vars < CHILD_MIN_VARS or "fork" not in multiprocessing.get_all_start_methods():
        return _highs_here(mip, time_limit_s, start, rel_gap, relax)
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_highs_child, args=(send, mip, time_limit_s, start, rel_gap,
                                                   relax), daemon=True)
    child.start()
    send.close()
    deadline = time.monotonic() + time_limit_s + CHILD_GRACE_S
    last = MipResult("timeout", None, None, None)
    try:
        while receive.poll(max(0.0, deadline - time.monotonic())):
            kind, payload = receive.recv()
            if kind == "improved":
                last = payload
            elif kind == "done":
                return payload
            else:
                raise SolverError(f"HiGHS failed in its child process: {payload}")
    except EOFError:  # the child died without a word
        pass
    finally:
        child.kill()
        child.join()
        receive.close()
    return last


def _highs_child(send, mip: Mip, time_limit_s: float, start, rel_gap: float,
                 relax: bool) -> None:
    def improved(values, objective, bound) -> None:
        send.send(("improved", MipResult("feasible", values, objective, bound)))
    try:
        drop_inherited_scheduler()
        send.send(("done", _highs_here(mip, time_limit_s, start, rel_gap, relax, improved)))
    except Exception as e:  # reported to the parent, which raises it
        send.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        send.close()


# NOTE [HiGHS after fork]
#   HiGHS runs its tasks on one scheduler per process, started by the first run with `threads`
#   workers (default: half the cores). A forked child inherits that scheduler but not its worker
#   threads, and a run there waits on workers that do not exist: it found a first solution, if
#   any, then nothing more until we killed it at its limit (a 30-variable program, 0.02 s in a
#   fresh child: 6 s, killed). On a two-core machine the default is one thread, no workers, so
#   nothing showed here; on the H200's 16 cores every program solved in a child after any run
#   in the parent stalled: U-Net (b11, 416x608) at half its activations came out +69.0 % where
#   the same problem solved here gives +30.9 % (docs/benchmarks/gpu/README.md, fourth lease;
#   here, with a four-thread scheduler started first: +68.9 %, the same plan). So every run of
#   ours asks for one thread (the solvers were tuned on one core per program: NOTE [Work
#   aside]), and a child drops the scheduler it inherited before its first run
#   (tests/test_highs_fork.py). Where the process had started a scheduler of more threads
#   before us, HiGHS refuses a run asking for one; that run goes on with the threads it has.
HIGHS_THREADS = 1


def drop_inherited_scheduler() -> None:
    """In a forked child, before any HiGHS run: forget the parent's task scheduler, whose
    worker threads did not come along (NOTE [HiGHS after fork]); the next run starts one."""
    try:
        import highspy
    except ImportError:
        return
    highspy.Highs.resetGlobalScheduler(False)  # not blocking: its workers are not here


@contextlib.contextmanager
def _stdout_silenced():
    """NOTE [HiGHS prints regardless]
      HiGHS 1.12 prints a debugging line ("HighsMipSolverData::transformNewIntegerFeasible
      Solution tmpSolver.run();") with C's printf whenever it repairs a start solution,
      whatever output_flag says: into a user's terminal, or into a report being written
      (make bench, make bench-solvers). While it runs, file descriptor 1 points at /dev/null;
      Python's and C's buffers are flushed before and after, so nothing printed meanwhile leaks
      out later (output of other threads in that moment is lost too)."""
    try:
        sys.stdout.flush()
        flush = ctypes.CDLL(None).fflush
        saved, quiet = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    except (OSError, AttributeError, ValueError):  # no fd 1, no C library to flush: as is
        yield
        return
    os.dup2(quiet, 1)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        flush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(quiet)


def _interrupt_at(h, deadline: float, improved=None, offset: float = 0.0) -> None:
    """NOTE [HiGHS overruns its time limit]: HiGHS checks `time_limit` only at some points
    of its MIP loop; on ResNet-50's least-peak program (16k variables) a 3.8 s limit has
    run 18-19 s, in the root node after presolve, and so took the time meant for the rest of
    the solve. Its simplex and MIP interrupt callbacks come far more often: they stop it at
    the deadline (status kInterrupt, reported like the time limit)."""
    import highspy

    kinds = highspy.cb.HighsCallbackType

    def check(kind, _message, out, data_in, _user) -> None:
        if kind == kinds.kCallbackMipImprovingSolution:
            bound = out.mip_dual_bound
            improved(list(out.mip_solution), out.objective_function_value + offset,
                     bound + offset if math.isfinite(bound) else None)
        elif time.monotonic() > deadline:
            data_in.user_interrupt = True

    h.setCallback(check, None)
    for kind in (kinds.kCallbackMipInterrupt, kinds.kCallbackSimplexInterrupt):
        h.startCallback(kind)
    if improved is not None:
        h.startCallback(kinds.kCallbackMipImprovingSolution)


def _highs_here(mip: Mip, time_limit_s: float, start, rel_gap: float, relax: bool = False,
                improved=None) -> MipResult:
    """HiGHS in this process; `improved(values, objective, bound)` is called with each
    better solution it finds."""
    import highspy
    import numpy as np

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    _interrupt_at(h, time.monotonic() + time_limit_s, improved, mip.offset)
    h.setOptionValue("mip_rel_gap", float(rel_gap))
    h.setOptionValue("threads", HIGHS_THREADS)  # NOTE [HiGHS after fork]
    n = mip.num_vars
    inf = highspy.kHighsInf
    lb = np.array(mip.lb, dtype=float)
    ub = np.array([inf if math.isinf(u) else u for u in mip.ub], dtype=float)
    h.addVars(n, lb, ub)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(mip.cost, dtype=float))
    ints = np.array([j for j in range(n) if mip.integer[j] and not relax], dtype=np.int32)
    if len(ints):
        h.changeColsIntegrality(len(ints), ints,
                                np.array([highspy.HighsVarType.kInteger] * len(ints)))
    starts, idx, val, lo, hi = [], [], [], [], []
    for r_idx, r_val, r_lo, r_hi in mip.rows:
        starts.append(len(idx))
        idx.extend(r_idx)
        val.extend(r_val)
        lo.append(-inf if math.isinf(r_lo) else r_lo)
        hi.append(inf if math.isinf(r_hi) else r_hi)
    if mip.rows:
        h.addRows(len(mip.rows), np.array(lo), np.array(hi), len(idx),
                  np.array(starts, dtype=np.int32), np.array(idx, dtype=np.int32),
                  np.array(val, dtype=float))
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        h.setSolution(sol)
    with _stdout_silenced():  # NOTE [HiGHS prints regardless]
        if h.run() == highspy.HighsStatus.kError:  # a scheduler of other threads runs here
            h.setOptionValue("threads", 0)
            h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    values = list(h.getSolution().col_value) if has_solution else None
    objective = info.objective_function_value + mip.offset if has_solution else None
    bound = info.mip_dual_bound + mip.offset if math.isfinite(info.mip_dual_bound) else None
    if status == highspy.HighsModelStatus.kOptimal:
        if relax:
            bound = objective
        return MipResult("optimal", values, objective, bound if bound is not None else objective)
    if status == highspy.HighsModelStatus.kInfeasible:
        return MipResult("infeasible", None, None, None)
    return MipResult("feasible" if has_solution else "timeout", values, objective, bound)


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
