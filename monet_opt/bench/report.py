"""bench.md: what was measured and how, then per model a summary and a table of every point."""
from __future__ import annotations

import math

from pathlib import Path

from monet_opt.bench.results import ModelRun, Point

MD_NAME = "bench.md"

HEADER = """# `monet-opt bench`: our memory/overhead frontier beside the peers'

Generated from `bench.json` by `monet-opt bench` (`make bench`); every model names the command,
commit, device and torch version it was measured with. Regenerate rather than edit.

- **Step**: gradients unset, forward, `out.sum()`, backward. Train mode, random init (seed 0),
  dropout on where the model has it.
- **Peak**: everything the step holds (parameters, buffers, input, activations, gradients). CPU:
  each point names its instrument: the allocator's events as `monet_opt.measure_peak` reads
  them, kernels' scratch included, for every method (the figure our plans count and are
  checked against) where allocation events are on (the default); with MONET_OPT_CPU_SCRATCH=0
  the live-bytes counter for eager-mode code and torch.profiler's allocation events for
  torch.compile'd code (a dispatch mode would make it run eager). The profiler figure, which
  also sees scratch memory inside kernels, is given for every method as a cross-check. CUDA:
  `max_memory_allocated` (cudnn.benchmark on).
- **Compared by** one figure for every method (NOTE [One instrument for every method] in
  monet_opt/bench/results.py): on CPU the profiler's allocation events, which the summaries
  and plots use; the tables give both, and mark our points over their limit or prediction by
  the point's instrument, and "(over limit)" by the profiler's events.
- **Floor** = parameters + buffers + input + gradients; **activations** = peak - floor.
- **Time**: median of interleaved steps after warm-up (eager, ours and checkpointing in one
  block, in a seeded order shuffled each round; each torch.compile budget in its own block
  against eager).
  **Overhead** = step / eager step of the same block - 1. **Predicted overhead** (ours): the
  plan's predicted step over its store-all step - 1, from profiled op times. On this 2-core
  machine single steps vary by 10-20 %; each model states how far apart eager timed twice in
  the same block came out (its timing noise).
- **Limits** are shares of eager's measured peak, or ("33% act") the floor and that share of
  eager's activations; "min" is the least peak the solver reports when asked (a solve at
  the floor) or at an earlier limit, "min+10%" 10 % above it
  (the knee of the frontier: a rematerialized least point is much slower than one a little
  higher).
- **Predicted**: the plan's simulated peak; error = (predicted - measured) / measured.
- **grad diff**: max |g - g_eager| / max |g_eager| over all parameters, same seed. torch.compile
  draws dropout masks differently from eager, so on models with dropout its gradients differ
  by design.
"""


def unit_for(eager_peak_bytes: int) -> tuple[str, int]:
    """MiB for real models, KiB for the tiny smoke-test ones."""
    return ("MiB", 2**20) if eager_peak_bytes >= 16 * 2**20 else ("KiB", 2**10)


def size(b: int | None, unit: tuple[str, int]) -> str:
    return "-" if b is None else f"{b / unit[1]:,.1f}"


def pct(v: float | None, signed: bool = True) -> str:
    return "-" if v is None else (f"{v:+.1%}" if signed else f"{v:.0%}")


def write(out: Path, runs: dict[str, ModelRun]) -> Path:
    path = out / MD_NAME
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + "".join(section(run) for run in runs.values()))
    return path


def section(run: ModelRun) -> str:
    m = run.meta
    u = unit_for(m.eager_peak_bytes)

    def fmt(b: int | None) -> str:
        return size(b, u)

    lines = [
        f"\n## {m.model}\n",
        f"`{m.config}` on {m.device}, torch {m.torch_version}, commit {m.git_commit}, "
        f"{m.date}; command `{m.command}`; {m.wall_time_s / 60:.1f} min.\n",
        f"Sizes in {u[0]}. Floor {fmt(m.floor_bytes)} (parameters {fmt(m.param_bytes)}, buffers "
        f"{fmt(m.buffer_bytes)}, input {fmt(m.input_bytes)}, gradients {fmt(m.grad_bytes)}). "
        f"Eager: peak {fmt(m.eager_peak_bytes)}, activations "
        f"{fmt(m.eager_peak_bytes - m.floor_bytes)} "
        f"({(m.eager_peak_bytes - m.floor_bytes) / m.eager_peak_bytes:.0%} of the peak), step "
        f"{m.eager_step_time_s:.3f} s. Allocator: {m.allocator} (NOTE [CPU allocator] in "
        f"monet_opt/bench/allocator.py).\n",
    ]
    if m.timing_noise is not None:
        lines.append(f"Timing noise: eager timed twice in the same block came out "
                     f"{m.timing_noise:.1%} apart; overheads closer than that are ties.\n")
    if m.as_built_step_time_s is not None:
        lines.append(f"Every method ran on the model and input made channels-last; eager on the "
                     f"model as built (contiguous), timed in the same block, took "
                     f"{m.as_built_step_time_s:.3f} s a step, "
                     f"{m.eager_step_time_s / m.as_built_step_time_s - 1:+.1%} for "
                     f"channels-last eager. Overheads are against channels-last eager.\n")
    if m.skipped:
        lines.append("Not run: " + "; ".join(m.skipped) + ".\n")
    lines += summary(run, u) + ["", *table(run.points, m.floor_bytes, m.eager_peak_bytes, u)]
    return "\n".join(lines) + "\n"


def summary(run: ModelRun, u: tuple[str, int]) -> list[str]:
    """Per method, by the figure every method has (NOTE [One instrument for every method]):
    the least overhead with activations at most half of eager's, and the least peak; then how
    our points held their limits and predictions."""
    m = run.meta
    eager = run.eager_compared_bytes
    half = m.floor_bytes + (eager - m.floor_bytes) // 2
    rows = [f"Compared by {run.instrument} for every method (eager's peak {size(eager, u)}).",
            "", "| method | least overhead with activations halved (peak <= "
            f"{size(half, u)}) | least peak (activations cut vs eager), its overhead |",
            "|---|---|---|"]
    ok = [p for p in run.points if p.status == "ok" and p.compared_bytes is not None]
    for method in dict.fromkeys(p.method for p in ok if p.family != "eager"):
        mine = [p for p in ok if p.method == method]
        under = [p.overhead for p in mine if p.compared_bytes <= half and p.overhead is not None]
        least = min(mine, key=lambda p: (p.compared_bytes, math.inf if p.overhead is None
                                         else p.overhead))  # at one peak, the fastest
        cut = 1 - (least.compared_bytes - m.floor_bytes) / max(1, eager - m.floor_bytes)
        rows.append(f"| {method} | {pct(min(under)) if under else 'none reached'} | "
                    f"{size(least.compared_bytes, u)} ({cut:.0%}), {pct(least.overhead)} |")
    planned = [p for p in ok if p.limit_bytes is not None]
    if planned:
        rows.append("")
        rows += held(planned, u)
        rows += same_plan_spread(planned)
    return ["", *rows]


def held(planned: list[Point], u: tuple[str, int]) -> list[str]:
    """How our points held their limits and predictions, by the figure plans are made for
    and, on CPU, by the allocation events (which see memory inside kernels, NOTE
    [Workspace])."""
    within = sum(1 for p in planned if p.within_limit)
    errors = [p.prediction_error for p in planned if p.prediction_error is not None]
    over = [p for p in planned if p.predicted_peak_bytes is not None and p.peak_bytes is not None
            and p.peak_bytes > p.predicted_peak_bytes]
    text = (f"Our executor's points: {within} of {len(planned)} within their limit; "
            f"largest |prediction error| {max(map(abs, errors), default=0):.2%}; "
            f"{len(over)} measured over their prediction" +
            (f" (by up to {size(max(p.peak_bytes - p.predicted_peak_bytes for p in over), u)})"
             if over else ""))
    events = [p for p in planned if p.profiler_peak_bytes is not None]
    above = [p.profiler_peak_bytes - p.limit_bytes for p in events
             if p.profiler_peak_bytes > p.limit_bytes]
    if events:
        text += (f". By allocation events, {len(above)} of {len(events)} over their limit" +
                 (f", by up to {size(max(above), u)}: memory inside kernels, which plans on "
                  "CPU do not count (NOTE [Workspace])" if above else ""))
    return [text + "."]


def same_plan_spread(points: list[Point]) -> list[str]:
    """NOTE [Timing noise], seen from our side: points that predict the same peak and step time
    ran the same schedule (one solver's plan at two limits, or several solvers' at one), so
    their measured overheads differ by noise alone. The widest such spread, if any."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        if p.predicted_overhead is not None and p.overhead is not None:
            key = (p.predicted_peak_bytes, round(p.predicted_overhead, 6))
            groups.setdefault(key, []).append(p)
    same = [g for g in groups.values() if len(g) > 1]
    if not same:
        return []
    widest = max(same, key=lambda g: max(p.overhead for p in g) - min(p.overhead for p in g))
    spread = max(p.overhead for p in widest) - min(p.overhead for p in widest)
    runs = ", ".join(f"{p.method} {p.setting} {pct(p.overhead)}" for p in widest)
    return [f"Identical plans (same predicted peak and time): {sum(map(len, same))} points in "
            f"{len(same)} groups; the widest measured {spread * 100:.1f} points apart ({runs})."]


def table(points: tuple[Point, ...], floor: int, eager_peak: int,
          u: tuple[str, int]) -> list[str]:
    def fmt(b: int | None) -> str:
        return size(b, u)

    rows = ["| method | setting | status | limit | peak | % of eager | activations "
            "| profiler | step s | overhead | predicted overhead | solve s | predicted | error "
            "| grad diff | note |",
            "|" + "---|" * 16]
    for p in points:
        share = pct(p.peak_bytes / eager_peak, signed=False) if p.peak_bytes else "-"
        act = fmt(p.peak_bytes - floor) if p.peak_bytes is not None else "-"
        step = "-" if p.step_time_s is None else f"{p.step_time_s:.3f}"
        solve = "-" if p.solve_time_s is None else f"{p.solve_time_s:.1f}"
        err = "-" if p.prediction_error is None else f"{p.prediction_error:+.2%}"
        grad = "-" if p.grad_rel_diff is None else f"{p.grad_rel_diff:.1e}"
        over = (" **over limit**" if p.within_limit is False else "") + (
            " **over prediction**" if p.predicted_peak_bytes is not None and
            p.peak_bytes is not None and p.peak_bytes > p.predicted_peak_bytes else "")
        beyond = " (over limit)" if p.limit_bytes is not None and p.profiler_peak_bytes \
            is not None and p.profiler_peak_bytes > p.limit_bytes else ""
        rows.append(f"| {p.method} | {p.setting} | {p.status} | {fmt(p.limit_bytes)} | "
                    f"{fmt(p.peak_bytes)}{over} | {share} | {act} | "
                    f"{fmt(p.profiler_peak_bytes)}{beyond} | {step} | {pct(p.overhead)} | "
                    f"{pct(p.predicted_overhead)} | {solve} | "
                    f"{fmt(p.predicted_peak_bytes)} | "
                    f"{err} | {grad} | {p.note.replace('|', '/')} |")
    return rows
