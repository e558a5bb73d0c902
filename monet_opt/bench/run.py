"""`monet-opt bench`: our memory/overhead frontier beside the peers', on the same models, in one
run. Writes bench.json (merged model by model), bench.md and PNG plots into --out."""
from __future__ import annotations

import copy
import datetime
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn
from torch.utils import _pytree as pytree

from monet_opt.bench import allocator, measure, methods, models, results
from monet_opt.bench import timeline as timeline_mod
from monet_opt.bench.methods import Context, Measured
from monet_opt.bench.settings import Settings, add_arguments, settings_from
from monet_opt.errors import UsageError
from monet_opt.memory import resident_bytes
from monet_opt.units import format_bytes


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="monet-opt bench", description=__doc__)
    add_arguments(parser)
    try:
        return run(settings_from(parser.parse_args(argv), argv))
    except UsageError as exc:  # as `monet-opt bench` says it: one line, status 2
        parser.error(str(exc))


def run(s: Settings) -> int:
    from monet_opt.bench import plots, report
    if s.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    s = replace(s, allocator=allocator.keep_freed_memory() if s.device.type == "cpu"
                else "CUDA's caching allocator")
    print(f"allocator: {s.allocator}", flush=True)
    path = s.out / results.JSON_NAME
    runs = results.load(path) if s.merge else {}
    for name in s.models:
        if name in runs:
            print(replacing(path, runs[name], s), flush=True)
    mine: dict[str, results.ModelRun] = {}  # saved into what the file holds then
    for name in s.models:
        with tempfile.TemporaryDirectory(prefix=f"monet-bench-{name}-") as profiles:
            mine[name] = bench_model(
                models.SPECS[name], replace(s, profile_dir=profiles),
                lambda r, name=name: results.save(path, {**mine, name: r}, s.merge))
        results.save(path, mine, s.merge)
    runs = results.load(path)  # with the runs another process saved there meanwhile
    report.write(s.out, runs)
    plots.write(s.out, runs)
    print(f"wrote {path}, {s.out / report.MD_NAME} and plots into {s.out}")
    return 0


def replacing(path: Path, old: results.ModelRun, s: Settings) -> str:
    """What this run replaces of `old`, the model's run in `path`: a model's run is replaced
    whole, so the points at limits, solvers or budgets this run does not have are named."""
    limits = {methods.label_of(limit) for limit in s.limits}
    budgets = {f"budget {b:g}" for b in s.compile_budgets}
    solved = {methods.method_of(solver)[1] for solver in s.solvers}
    gone = [f"{p.method} {p.setting}" for p in old.points
            if (p.family in ("ours", "checkmate") and (p.method not in solved
                                                       or p.setting not in limits))
            or (p.family == "compile" and p.setting not in budgets)]
    where = f"{path}: {old.meta.model}'s run of {old.meta.date} (commit {old.meta.git_commit})"
    if not gone:
        return f"{where} is replaced by this one"
    return (f"{where} is replaced by this one, with its points that this run does not have: "
            f"{', '.join(gone)} (--out another folder keeps them)")


def bench_model(spec: models.BenchModel, s: Settings,
                save: Callable[[results.ModelRun], None] = lambda run: None
                ) -> results.ModelRun:
    """One model's run. `save` is handed the run as it stands before each torch.compile budget
    (NOTE [A run cut short])."""
    started = time.perf_counter()
    model, x, config = spec.build(s.regime, s.size)
    model, x = model.to(s.device), to_device(x, s.device)
    as_built = None
    if s.channels_last:
        as_built = _as_built(model)
        model, x = _channels_last(spec.name, model, x)
        config += ", channels-last (model and input)"
    print(f"\n== {spec.name}: {config} on {device_name(s.device)}", flush=True)
    eager = measure.runner_for("eager", model, model, x)
    ref, _ = measure.first_step(eager, x, s.device)
    peak, instrument = measure.peak_bytes(eager, x, s.device, compiled=False)
    ctx = Context(spec.name, model, x, s.device, eager, peak, ref, _floor(model, x)[-1],
                  s.profile_dir)
    eager_point = methods.measured_point(ctx, eager, results.Point(
        model=spec.name, method="eager", family="eager", setting="", status="ok",
        grad_rel_diff=0.0, solve_time_s=0.0))
    print(f"  eager peak {format_bytes(peak)} ({instrument})", flush=True)
    skipped, measured = [], []
    for solver in s.solvers:
        if not methods.registered(solver):
            why = "not registered" if solver == "checkmate" else "not in available_solvers()"
            skipped.append(f"solver {solver!r}: {why}")
            print(f"  skipping solver {solver!r}: {why}", flush=True)
            continue
        measured += methods.ours(ctx, solver, s.limits, s.time_limit_s)
    measured += [methods.checkpoint(ctx, peer) for peer in spec.checkpoint]
    save(results.ModelRun(  # NOTE [A run cut short]: measured, not yet timed
        meta=_meta(spec.name, config, s, ctx, eager_point,
                   (*skipped, "timing: the run ended before it"), time.perf_counter() - started),
        points=(eager_point, *(m.point for m in measured))))
    points, noise, as_built_s = _timed(ctx, eager_point, measured, s.rounds, as_built)
    timeline = _timeline(ctx, measured, s.device)

    def model_run(pending: tuple[float, ...]) -> results.ModelRun:
        not_run = tuple(skipped) + tuple(f"torch.compile budget {b:g}: the run ended before "
                                         f"it" for b in pending)
        meta = _meta(spec.name, config, s, ctx, points[0], not_run, time.perf_counter() - started)
        meta = replace(meta, timing_noise=noise, as_built_step_time_s=as_built_s)
        return results.ModelRun(meta=meta, points=tuple(points), timeline=timeline)

    for i, budget in enumerate(s.compile_budgets):
        save(model_run(s.compile_budgets[i:]))
        points.append(methods.compiled(ctx, s.compile_backend, budget, s.rounds))
    return model_run(())


# NOTE [The bench's own profiles]
#   Every optimize() of a model's run uses one profile directory, new for that run, as a clean
#   clone's first run would: its points then depend on this code and this run alone. With the
#   default directory they took in what earlier runs had left: a gpt2_narrow run (2026-11-30)
#   had auto's points solved as "a schedule the profile directory held at another limit" from
#   runs earlier that day, and Checkmate's (timed out) answered at every limit with a least-peak
#   schedule a run before 5eff336 had stored under its name, the DP's (NOTE [Least peaks
#   recalled in the process] in solvers/remembered.py), where the run before had it infeasible.
#   Within the run the directory still serves what optimize() would serve a user: one profile
#   for all the points, "min" solved from the least-peak schedule the floor's solve left.


# NOTE [A run cut short]
#   torch.compile's first call can take minutes (GPT-2 at budget 0.5 on the H200: 131 s), and a
#   lent machine's run is cut at its time limit, where everything of the model would be lost with
#   the points already timed (the seventh lease lost GPT-2's that way). So the bench saves the
#   model's run before each budget, each budget not yet run named in the run's "Not run" (its
#   meta.skipped), and once more when the model is done; and before the timing block, its
#   points measured but untimed, so a run cut or failing there keeps its peaks, predictions
#   and gradient checks (a GPT-2 run's ~100 s of a lease).


def _timed(ctx: Context, eager_point: results.Point, measured: list[Measured], rounds: int,
           as_built: measure.Runner | None = None
           ) -> tuple[list[results.Point], float, float | None]:
    """Eager, ours and the checkpoint peers in one interleaved timing block, with eager once
    more (NOTE [Timing noise]) and `as_built` if given: the points, |repeat / eager - 1| and
    `as_built`'s step time."""
    repeat = replace(ctx.eager, name=ctx.eager.name + " (repeat)")
    runners = [ctx.eager, repeat] + [m.runner for m in measured if m.runner is not None]
    runners += [as_built] if as_built is not None else []
    print(f"  timing {len(runners)} methods x {rounds} interleaved rounds", flush=True)
    times = measure.interleaved_times(runners, ctx.x, rounds, ctx.device)
    eager_s = times[ctx.eager.name]
    noise = abs(times[repeat.name] / eager_s - 1)
    print(f"  eager {eager_s:.3f} s, eager again {times[repeat.name]:.3f} s: timing noise "
          f"{noise:.1%}", flush=True)
    out = [replace(eager_point, step_time_s=eager_s, eager_step_time_s=eager_s, overhead=0.0)]
    for m in measured:
        if m.runner is None:
            out.append(m.point)
            continue
        step = times[m.runner.name]
        print(f"  {m.runner.name:<32} {step:.3f} s, overhead {step / eager_s - 1:+.1%}",
              flush=True)
        out.append(replace(m.point, step_time_s=step, eager_step_time_s=eager_s,
                           overhead=step / eager_s - 1))
    if as_built is not None:
        print(f"  eager on the model as built {times[as_built.name]:.3f} s", flush=True)
    return out, noise, None if as_built is None else times[as_built.name]


def _as_built(model: nn.Module) -> measure.Runner:
    """Eager on a copy of `model` as built, fed its input made contiguous (the input the bench
    times every method with is channels-last)."""
    copy_ = copy.deepcopy(model)
    return measure.runner_for("eager (as built)", lambda x: copy_(x.contiguous()), copy_, ())


def _channels_last(name: str, model: nn.Module, x) -> tuple[nn.Module, torch.Tensor]:
    if not (isinstance(x, torch.Tensor) and x.dim() == 4):
        what = f"a {x.dim()}-d tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise UsageError(f"--channels-last: {name} takes {what}, not an image "
                         f"batch (N, C, H, W); run it without --channels-last")
    return (model.to(memory_format=torch.channels_last),
            x.contiguous(memory_format=torch.channels_last))


def _timeline(ctx: Context, measured: list[Measured], device: torch.device):
    """Predicted vs measured memory for one schedule: ours at 50 % of eager's peak, else the
    tightest limit that ran."""
    if not timeline_mod.available(device):
        return None
    ran = [m for m in measured if m.plan is not None and m.point.family == "ours"]
    if not ran:
        return None
    pick = next((m for m in ran if m.point.setting == "50%"),
                min(ran, key=lambda m: m.point.limit_bytes))
    try:
        return timeline_mod.record(pick.runner, ctx.x, pick.plan, pick.point.method,
                                   pick.point.setting, device)
    except Exception as exc:  # noqa: BLE001 - the points already measured are worth more
        print(f"  no timeline for {pick.point.method} {pick.point.setting}: "
              f"{methods._failure(exc)}", flush=True)
        return None


def _meta(name: str, config: str, s: Settings, ctx: Context, eager: results.Point,
          skipped: tuple[str, ...], wall_s: float) -> results.Meta:
    param_bytes, buffer_bytes, input_bytes, grad_bytes, floor = _floor(ctx.model, ctx.x)
    return results.Meta(
        model=name, config=config, device=device_name(s.device),
        torch_version=torch.__version__, command=s.command, git_commit=s.git_commit,
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        threads=torch.get_num_threads(), param_bytes=param_bytes, buffer_bytes=buffer_bytes,
        input_bytes=input_bytes, grad_bytes=grad_bytes,
        floor_bytes=floor,
        eager_peak_bytes=ctx.eager_peak_bytes, eager_step_time_s=eager.step_time_s or 0.0,
        skipped=skipped, wall_time_s=wall_s, allocator=s.allocator)


def _floor(model: nn.Module, x) -> tuple[int, int, int, int, int]:
    """Bytes of (parameters, buffers, input, gradients, all four)."""
    param_bytes = resident_bytes(list(model.parameters()))
    buffer_bytes = resident_bytes(list(model.buffers()))
    input_bytes = resident_bytes(pytree.tree_leaves(x))
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return (param_bytes, buffer_bytes, input_bytes, grad_bytes,
            param_bytes + buffer_bytes + input_bytes + grad_bytes)


def to_device(x, device: torch.device | str):
    """A model's input (a tensor, or a dict of them) on `device`."""
    if isinstance(x, dict):
        return {k: v.to(device) for k, v in x.items()}
    return x.to(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    except OSError:
        pass
    return f"CPU {cpu}, {torch.get_num_threads()} threads"
