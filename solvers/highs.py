"""HiGHS, solve_mip's default backend: small programs in this process, large ones in a forked
child (NOTE [HiGHS in a child process]).
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import multiprocessing
import os
import sys
import time

from solvers.errors import SolverError
from solvers.mip import Mip, MipResult

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

# The random seed of every HiGHS run in this process and the children it forks (NOTE [A
# portfolio of seeds] in solvers/portfolio.py: each search of a portfolio sets its own).
SEED = 0


def solve(mip: Mip, time_limit_s: float, start, rel_gap: float,
          relax: bool = False) -> MipResult:
    """`mip` (or its relaxation) solved by HiGHS within `time_limit_s`, from `start` if given."""
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
    h.setOptionValue("random_seed", SEED)
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
