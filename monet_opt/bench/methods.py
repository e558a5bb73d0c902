"""Each method of the benchmark on one model: build it, take its gradients and measured peak.
Step times come afterwards, from one interleaved timing block (see run.py)."""
from __future__ import annotations

import math
import sys
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

import monet_opt
import solvers
from monet_opt.bench import measure, peers
from monet_opt.bench.measure import Runner
from monet_opt.bench.results import Point
from monet_opt.errors import InfeasibleBudgetError
from monet_opt.units import format_bytes


@dataclass(frozen=True)
class Context:
    """What every method on one model shares."""

    name: str
    model: nn.Module
    x: Any
    device: torch.device
    eager: Runner
    eager_peak_bytes: int
    ref_grads: list[torch.Tensor | None]
    floor_bytes: int = 0  # parameters, buffers, input, gradients
    profile_dir: str | None = None  # NOTE [The bench's own profiles] in bench/run.py


@dataclass(frozen=True)
class Measured:
    """A point with the runner that made it (for timing) and our plan where there is one."""

    point: Point
    runner: Runner | None = None
    plan: monet_opt.Plan | None = None


def _failure(exc: BaseException) -> str:
    traceback.print_exception(exc, file=sys.stderr, limit=-3)
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def measured_point(ctx: Context, runner: Runner, base: Point) -> Point:
    """`base` with the runner's gradient difference and peaks filled in."""
    grads, _ = measure.first_step(runner, ctx.x, ctx.device)
    peak, instrument = measure.peak_bytes(runner, ctx.x, ctx.device, compiled=False)
    prof = measure.profiler_peak(runner, ctx.x) if ctx.device.type == "cpu" else None
    return replace(base, peak_bytes=peak, peak_instrument=instrument, profiler_peak_bytes=prof,
                   grad_rel_diff=measure.grad_rel_diff(grads, ctx.ref_grads))


def check_limit(setting: str) -> None:
    """Raises ValueError, saying what a limit may be, unless `setting` is one (`limit_of`)."""
    number = setting[4:] if setting.startswith("min+") else setting[1:] \
        if setting.startswith("a") else setting
    try:
        ok = setting == "min" or 0 < float(number) < math.inf
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"limit {setting!r}: give a share of eager's peak in % ('50'), of its activations "
            f"('a33': the floor and 33 % of them), 'min' (the least peak the solver reports) or "
            f"'min+10' (10 % above it)")


def limit_of(setting: str, ctx: Context, least: int | None) -> int | None:
    """"50": half of eager's measured peak; "a33": the floor and a third of eager's activations
    (3x less activation memory); "min": the least peak the solver reported; "min+10": 10 %
    above it (None while no solve has reported it)."""
    if setting == "min":
        return least
    if setting.startswith("min+"):
        return None if least is None else int(least * (1 + float(setting[4:]) / 100))
    if setting.startswith("a"):
        activations = ctx.eager_peak_bytes - ctx.floor_bytes
        return ctx.floor_bytes + int(activations * float(setting[1:]) / 100)
    return int(ctx.eager_peak_bytes * float(setting) / 100)


def label_of(setting: str) -> str:
    if setting.startswith("min"):
        return setting + ("%" if "+" in setting else "")
    return f"{setting[1:]}% act" if setting.startswith("a") else f"{setting}%"


# NOTE [The least peak, asked for]
#   The "min" point was the least peak the solver had reported at the limits before it. Where
#   every one of them fits, that is the least a search which found a schedule in time happened
#   to see on its way, and no solve ever looked below it (auto spends the time it has left on
#   the least peak only where nothing fits: NOTE [The least peak in the time left] in
#   solvers/remat.py). A user who wants the least asks for it: a limit nothing can meet, and
#   the least from the InfeasibleBudgetError. The bench does the same at "min" (the floor:
#   parameters, buffers, input and gradients) and takes the lower of the two; the least-peak
#   schedule that solve leaves in the profile directory is then the one "min" is solved from.
def asked_least(ctx: Context, solver: str, time_limit_s: float) -> int | None:
    """The least peak `solver` reports at a limit no schedule meets (None if it reports none)."""
    try:
        monet_opt.optimize(ctx.model, ctx.x, max(1, ctx.floor_bytes), solver=solver,
                           time_limit_s=time_limit_s, profile_dir=ctx.profile_dir)
    except InfeasibleBudgetError as exc:
        print(f"  {solver} asked for its least peak: {format_bytes(exc.min_feasible_bytes)}",
              flush=True)
        return exc.min_feasible_bytes
    except Exception as exc:  # noqa: BLE001 - the earlier limits' least stands
        _failure(exc)
    return None


def method_of(solver: str) -> tuple[str, str]:
    """The family and method name of `solver`'s points."""
    if solver == "checkmate":
        return "checkmate", "checkmate (our executor)"
    return "ours", f"monet_opt {solver}"


def ours(ctx: Context, solver: str, limits: tuple[str, ...], time_limit_s: float
         ) -> list[Measured]:
    """optimize() with `solver` at every limit (`limit_of`). Limits below the least peak the
    solver reported are not solved again."""
    family, method = method_of(solver)
    out: list[Measured] = []
    least: int | None = None

    def unplanned(point: Point) -> None:  # said too: only the json and markdown had them
        out.append(Measured(point))
        print(f"  {method:<26} {point.setting:>5}  {point.status}: {point.note}", flush=True)
    for setting in limits:
        label = label_of(setting)
        base = Point(model=ctx.name, method=method, family=family, setting=label, status="ok")
        if setting == "min":  # NOTE [The least peak, asked for]
            asked = asked_least(ctx, solver, time_limit_s)
            least = asked if least is None else least if asked is None else min(least, asked)
        limit = limit_of(setting, ctx, least)
        if limit is None or (least is not None and limit < least):
            why = "least peak unknown" if limit is None else \
                f"below the least peak {solver} reaches, {format_bytes(least)}"
            unplanned(replace(base, status="infeasible", limit_bytes=limit, note=why))
            continue
        base = replace(base, limit_bytes=limit)
        start = time.perf_counter()
        try:
            opt = monet_opt.optimize(ctx.model, ctx.x, limit, solver=solver,
                                     time_limit_s=time_limit_s, profile_dir=ctx.profile_dir)
        except InfeasibleBudgetError as exc:
            least = exc.min_feasible_bytes
            unplanned(replace(base, status="infeasible", note=(
                f"below the least peak {solver} reaches, {format_bytes(least)}")))
            continue
        except Exception as exc:  # noqa: BLE001 - a benchmark records a failing method and goes on
            unplanned(replace(base, status="failed", note=_failure(exc)))
            continue
        plan_s = time.perf_counter() - start
        plan = opt.plan
        least = plan.min_feasible_bytes if least is None else min(least, plan.min_feasible_bytes)
        gap = "" if plan.gap is None else f", gap {plan.gap:.1%}"
        note = (f"{plan.solver} {plan.status}{gap}; {plan.recomputed_ops} op runs recomputed"
                + (f"; {plan.solver_note}" if plan.solver_note else "")
                + (f"; peak at {plan.peak_op}" if plan.peak_op else ""))
        predicted_overhead = plan.predicted_step_time_s / plan.store_all_step_time_s - 1 \
            if plan.store_all_step_time_s else None
        point = replace(base, solve_time_s=plan.solve_time_s, plan_time_s=plan_s,
                        predicted_peak_bytes=plan.predicted_peak_bytes,
                        predicted_overhead=predicted_overhead, note=note)
        try:  # a plan whose step fails is a failed point, as a peer's is
            runner = measure.runner_for(f"{method} {label}", opt, ctx.model, ctx.x)
            point = measured_point(ctx, runner, point)
        except Exception as exc:  # noqa: BLE001 - recorded, the benchmark goes on
            unplanned(replace(point, status="failed", note=f"{note}; {_failure(exc)}"))
            continue
        point = replace(point, prediction_error=(
            (plan.predicted_peak_bytes - point.peak_bytes) / point.peak_bytes))
        out.append(Measured(point, runner, plan))
        print(f"  {method:<26} {label:>5}  limit {format_bytes(limit):>11}  measured "
              f"{format_bytes(point.peak_bytes):>11}  predicted "
              f"{format_bytes(plan.predicted_peak_bytes):>11}  plan {plan_s:5.1f} s", flush=True)
    return out


def checkpoint(ctx: Context, peer: peers.CheckpointPeer) -> Measured:
    base = Point(model=ctx.name, method=peer.name, family="checkpoint", setting="",
                 status="ok", solve_time_s=0.0, note=peer.describe)
    try:
        wrapped = peer.build(ctx.model)
        runner = measure.runner_for(peer.name, wrapped.module, wrapped.module, ctx.x,
                                    params=wrapped.params)
        point = measured_point(ctx, runner, base)
    except Exception as exc:  # noqa: BLE001 - recorded, the benchmark goes on
        return Measured(replace(base, status="failed", note=f"{peer.describe}; {_failure(exc)}"))
    print(f"  {peer.name:<26}        measured {format_bytes(point.peak_bytes):>11}", flush=True)
    return Measured(point, runner)


def compiled(ctx: Context, backend: str, budget: float, rounds: int) -> Point:
    """torch.compile at one activation memory budget, timed against eager in its own block."""
    base = Point(model=ctx.name, method=f"torch.compile {backend}", family="compile",
                 setting=f"budget {budget:g}", status="ok")
    try:
        with peers.compile_settings(budget):
            wrapped = peers.compiled(ctx.model, backend)
            runner = measure.runner_for(base.method, wrapped.module, ctx.model, ctx.x)
            grads, first_s = measure.first_step(runner, ctx.x, ctx.device)
            peak, instrument = measure.peak_bytes(runner, ctx.x, ctx.device, compiled=True)
            prof = measure.profiler_peak(runner, ctx.x) \
                if instrument == measure.EVENTS else None  # the figure methods are compared by
            times = measure.interleaved_times([ctx.eager, runner], ctx.x, rounds, ctx.device,
                                              warmup=2)
            note, really = peers.compile_note()
    except Exception as exc:  # noqa: BLE001 - recorded, the benchmark goes on
        return replace(base, status="failed", note=_failure(exc))
    step, eager = times[runner.name], times[ctx.eager.name]
    point = replace(base, status="ok" if really else "failed",
                    note=note if really else f"did not compile (ran eager): {note}",
                    peak_bytes=peak, peak_instrument=instrument,
                    profiler_peak_bytes=peak if instrument == measure.PROFILER else prof,
                    step_time_s=step, eager_step_time_s=eager, overhead=step / eager - 1,
                    solve_time_s=first_s, grad_rel_diff=measure.grad_rel_diff(grads,
                                                                              ctx.ref_grads))
    print(f"  {base.method:<26} {budget:5g}  measured {format_bytes(peak):>11}  "
          f"overhead {point.overhead:+.1%}  first call {first_s:.0f} s", flush=True)
    return point


def registered(name: str) -> bool:
    return name in solvers.available_solvers()
