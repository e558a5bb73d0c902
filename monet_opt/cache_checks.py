"""NOTE [Cache files are untrusted] (monet_opt/cache.py): what a file read from the profile
directory must agree with before it is used. Each check raises `Unusable` saying why not."""
from __future__ import annotations

import math
from typing import Any

import solvers
from monet_opt.output_bytes import raised
from solvers import Problem, Schedule, SolveResult, Status, Variant


class Unusable(Exception):
    """Why a cache file cannot be used (internal: becomes a ProfileCacheWarning)."""


class Unreadable(Unusable):
    """A cache file that cannot be read at all (its mode, a folder in its place): nothing says
    it is damaged, so it is left as it is (NOTE [Files that cannot be read] in
    monet_opt/cache.py)."""


def check_key(stored: Any, expected: dict[str, Any]) -> None:
    if stored != expected:
        stored = stored if isinstance(stored, dict) else {}
        field = next(k for k in sorted(set(stored) | set(expected))
                     if stored.get(k) != expected.get(k))
        raise Unusable(f"mismatched: its key has {field} = {stored.get(field)!r}, "
                       f"expected {expected.get(field)!r}")


def check_structure(cached: Problem, fresh: Problem) -> None:
    """The cached problem is the fresh one up to measured times, the fixed loss bytes, outputs'
    measured bytes, the variants the profiler withdrew and the writes into arguments it
    withdrew (NOTE [Writing into a tensor laid out otherwise than traced] in
    monet_opt/misread_layouts.py). The profiler raised the outputs it found larger than their
    shapes (NOTE [Outputs larger than their shapes] in
    monet_opt/output_bytes.py) and withdrew the variants that were not exact or not measured
    in its time limit (their encode ops then read nothing), so the fresh graph is raised to the
    cached sizes and offered the cached variants before it is compared. Compared as lowered, a
    step returning mse_loss (or an EmbeddingBag's offsets), or one with a variant withdrawn,
    never matched its own profile: every optimize() warned and profiled again."""
    if len(cached.ops) != len(fresh.ops) or len(cached.tensors) != len(fresh.tensors):
        raise Unusable(f"mismatched: the cached graph has {len(cached.ops)} ops and "
                       f"{len(cached.tensors)} tensors, this model's {len(fresh.ops)} and "
                       f"{len(fresh.tensors)}")
    offered = {v.name for v in cached.variants}
    fresh = fresh.only_variants({k for k, v in enumerate(fresh.variants) if v.name in offered})
    if [_shape(v) for v in cached.variants] != [_shape(v) for v in fresh.variants]:
        raise Unusable("mismatched: its operator variants are not among this model's, or "
                       "read other tensors")
    for i, (a, b) in enumerate(zip(cached.ops, fresh.ops)):
        if (a.name, a.is_backward, a.inputs, a.outputs) != \
                (b.name, b.is_backward, b.inputs, b.outputs):
            raise Unusable(f"mismatched: op #{i} is {a.name!r} there, {b.name!r} here, or "
                           "reads or writes other tensors, or not in the same place")
    fresh = raised(fresh, [tuple(cached.tensors[t].bytes for t in op.outputs)
                           for op in cached.ops])
    for i, (a, b) in enumerate(zip(cached.ops, fresh.ops)):  # the profiler may withdraw
        # writes (NOTE [Writing into a tensor laid out otherwise than traced])
        if a.inplace_bytes not in (0, b.inplace_bytes) or not set(a.overwrites) <= set(
                b.overwrites):
            raise Unusable(f"made by another monet_opt: op #{i} ({a.name!r}) writes into its "
                           "inputs differently there (NOTE [Writing into a dying input])")
    if cached.tensors != fresh.tensors or cached.fixed_bytes < fresh.fixed_bytes or \
            (cached.forward_outputs, cached.backward_outputs) != \
            (fresh.forward_outputs, fresh.backward_outputs):
        raise Unusable("mismatched: tensor sizes, fixed bytes or outputs differ from this "
                       "model's graph")


def _shape(v: Variant) -> tuple:
    """A variant less its measured costs."""
    return v.name, v.op, v.replaces, v.reads, v.encode_ops


def simulated(problem: Problem, schedule: Schedule) -> solvers.Simulation:
    """The simulator's replay of a stored schedule, or Unusable if it cannot run."""
    try:
        return solvers.simulate(problem, schedule)
    except (solvers.InvalidScheduleError, solvers.InvalidProblemError, IndexError,
            TypeError) as exc:
        raise Unusable(f"its schedule fails the simulator ({exc})") from exc


def check_result(result: SolveResult, problem: Problem, limit_bytes: int) -> None:
    """A stored schedule is used only if the simulator agrees with it and its facts are
    facts a solve can report."""
    _check_facts(result, problem)
    if result.schedule is None:
        if result.status != Status.INFEASIBLE:
            raise Unusable(f"malformed: status {result.status.value} without a schedule")
        return
    if not result.feasible:
        raise Unusable(f"malformed: a schedule with status {result.status.value}")
    sim = simulated(problem, result.schedule)
    if sim.peak_bytes > limit_bytes:
        raise Unusable(f"its schedule peaks at {sim.peak_bytes} B, above its limit "
                       f"{limit_bytes} B")
    if sim.peak_bytes != result.peak_bytes or result.objective_s is None or \
            not math.isclose(sim.time_s, result.objective_s, rel_tol=1e-9, abs_tol=1e-15):
        raise Unusable(f"mismatched: it claims peak {result.peak_bytes} B and time "
                       f"{result.objective_s} s; the simulator says {sim.peak_bytes} B and "
                       f"{sim.time_s} s")


def _check_facts(result: SolveResult, problem: Problem) -> None:
    """What plan.explain() and InfeasibleBudgetError show of a solve: a gap "x" made explain()
    raise, a least peak of 1 B or a solve of -5 s were shown as measured."""
    least = problem.fixed_bytes - sum(op.state_bytes for op in problem.ops) + \
        sum(problem.tensors[t].bytes for t in set(problem.backward_outputs))
    if not (isinstance(result.solver, str) and isinstance(result.note, str)
            and _number(result.solve_time_s) and (result.gap is None or _number(result.gap))
            and (result.bound_s is None or _number(abs(result.bound_s)))
            and (result.objective_s is None or _number(result.objective_s))
            and (result.min_feasible_bytes is None or
                 (type(result.min_feasible_bytes) is int and result.min_feasible_bytes >= least))):
        raise Unusable(f"malformed: facts no solve reports (solver {result.solver!r}, "
                       f"time {result.solve_time_s!r} s, gap {result.gap!r}, bound "
                       f"{result.bound_s!r} s, least peak {result.min_feasible_bytes!r} B with "
                       f"{least} B held by every schedule)")


def _number(value: Any) -> bool:
    """A finite number, not below 0 (bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) and value >= 0
