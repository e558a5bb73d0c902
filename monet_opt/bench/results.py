"""What the benchmark records, and its JSON file (merged model by model, so it can be run in
pieces: `--models resnet50`, then `--models gpt2`, into the same file)."""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from monet_opt.errors import MonetError

SCHEMA_VERSION = 1
JSON_NAME = "bench.json"

FAMILIES = ("eager", "ours", "checkmate", "checkpoint", "compile")


@dataclass(frozen=True)
class Point:
    """One method at one setting on one model.

    family: "eager", "ours" (optimize() with one solver), "checkmate" (Checkmate's MILP through our
    executor), "checkpoint" (torch.utils.checkpoint), "compile" (torch.compile with an activation
    memory budget). setting: the limit as a share of eager's measured peak ("50%", "min") or of its
    activations above the floor ("33% act"), or the
    compile budget ("budget 0.5"). status: "ok", "infeasible" (the solver cannot reach the
    limit; the note says its least peak) or "failed" (the note says why).
    peak_bytes: measured with `peak_instrument`; profiler_peak_bytes: the profiler's allocation
    events on CPU, for every method (a cross-check that also sees scratch memory in kernels).
    step_time_s: median of interleaved steps; eager_step_time_s: eager's median in the same
    timing block, which `overhead` (step / eager - 1) is relative to. solve_time_s: the solver's
    time (ours), the first call including compilation (compile), 0 (checkpoint).
    plan_time_s: the whole optimize() call (trace, profile, solve). prediction_error:
    (predicted - measured) / measured. grad_rel_diff: max |g - g_eager| / max |g_eager| over
    all parameters, same seed. predicted_overhead (ours): the plan's predicted step time over
    its store-all step time - 1, from the profiled op times.
    """

    model: str
    method: str
    family: str
    setting: str
    status: str
    limit_bytes: int | None = None
    peak_bytes: int | None = None
    peak_instrument: str = ""
    profiler_peak_bytes: int | None = None
    step_time_s: float | None = None
    eager_step_time_s: float | None = None
    overhead: float | None = None
    solve_time_s: float | None = None
    plan_time_s: float | None = None
    predicted_peak_bytes: int | None = None
    prediction_error: float | None = None
    predicted_overhead: float | None = None
    grad_rel_diff: float | None = None
    note: str = ""

    @property
    def within_limit(self) -> bool | None:
        if self.limit_bytes is None or self.peak_bytes is None:
            return None
        return self.peak_bytes <= self.limit_bytes

    @property
    def compared_bytes(self) -> int | None:
        """The peak methods are compared by (NOTE [One instrument for every method])."""
        return self.peak_bytes if self.profiler_peak_bytes is None else self.profiler_peak_bytes


# NOTE [One instrument for every method]
#   On CPU our executor, eager and torch.utils.checkpoint are measured by the live-bytes
#   counter (the figure our plans are made for and checked against), torch.compile'd code by
#   torch.profiler's allocation events (a dispatch mode would make it run eager). The events
#   also see memory allocated inside kernels (oneDNN's scratch in convolutions, ATen's
#   temporaries), which the counter does not, so the two figures side by side favoured the
#   counted methods: by the events, MobileNetV2's least activations of ours were 187 MiB, not
#   the 139 counted, and U-Net's plans reached half of eager's activations at no limit
#   (2026-12-02, on the bench.json then committed). The summaries and the frontier plots
#   compare every method by the one figure all have: on CPU the allocation events (taken for
#   every method), on CUDA max_memory_allocated; the counter's figure stays in the tables,
#   beside each plan's prediction and limit. With allocation events on (the default since
#   2026-12-02; NOTE [Allocation events] in monet_opt/alloc_events.py) every CPU
#   method's own figure is monet_opt.measure_peak's, from those events too
#   (monet_opt/bench/measure.py).


@dataclass(frozen=True)
class Meta:
    """Where and how one model was measured. floor_bytes = parameters + buffers + input +
    gradients: what no schedule can avoid; peak - floor is activation memory."""

    model: str
    config: str
    device: str
    torch_version: str
    command: str
    git_commit: str
    date: str
    threads: int
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    grad_bytes: int
    floor_bytes: int
    eager_peak_bytes: int
    eager_step_time_s: float
    skipped: tuple[str, ...] = ()   # methods not run, each with the reason
    wall_time_s: float = 0.0
    # NOTE [Timing noise]: a second eager runner times in the same block as the first; its
    # median's distance from eager's says how far apart two identical methods come out. One
    # pair understates it: identical plans of ours spread 2-10 points in every model's run
    # (report.same_plan_spread prints it per model).
    timing_noise: float | None = None
    # NOTE [CPU allocator]; runs recorded before it was named used glibc's defaults
    allocator: str = "the C library's default malloc"
    # `monet-opt bench --channels-last`: eager on the model as built (contiguous), timed in the
    # same block as every method here, which ran on the model made channels-last
    as_built_step_time_s: float | None = None


@dataclass(frozen=True)
class Timeline:
    """Predicted and measured memory over one step of one schedule. Times are fractions of the
    step (predicted: cumulative profiled op times; measured: wall clock under the instrument)."""

    method: str
    setting: str
    limit_bytes: int
    predicted: tuple[tuple[float, int], ...]
    measured: tuple[tuple[float, int], ...]
    predicted_backward_at: float
    measured_backward_at: float


@dataclass(frozen=True)
class ModelRun:
    meta: Meta
    points: tuple[Point, ...]
    timeline: Timeline | None = None

    @property
    def eager_compared_bytes(self) -> int:
        """Eager's peak by the figure every method is compared by (NOTE [One instrument for
        every method])."""
        eager = [p.compared_bytes for p in self.points
                 if p.family == "eager" and p.compared_bytes is not None]
        return eager[0] if eager else self.meta.eager_peak_bytes

    @property
    def instrument(self) -> str:
        """The figure the summaries and plots compare by."""
        if any(p.profiler_peak_bytes is not None for p in self.points):
            return "torch.profiler's allocation events"
        return next((p.peak_instrument for p in self.points if p.peak_instrument), "")


class BenchFileError(MonetError):
    """The benchmark JSON to merge into cannot be read."""


def load(path: Path) -> dict[str, ModelRun]:
    """The runs in `path` by model name; {} if the file does not exist."""
    if not path.exists():
        return {}
    redo = "; move it away or pass --no-merge to overwrite it"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BenchFileError(f"monet-opt bench: {path} cannot be read as JSON ({exc}){redo}") \
            from exc
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        got = data.get("schema_version") if isinstance(data, dict) else type(data).__name__
        raise BenchFileError(
            f"monet-opt bench: {path} has schema version {got!r}, this benchmark writes "
            f"{SCHEMA_VERSION}{redo}")
    try:
        return {name: _run_from_dict(d) for name, d in data["models"].items()}
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise BenchFileError(f"monet-opt bench: {path} does not hold the benchmark's runs "
                             f"({type(exc).__name__}: {exc}){redo}") from exc


def save(path: Path, runs: dict[str, ModelRun], merge: bool = True) -> None:
    """Write atomically (a temporary file, then rename), readable as the umask allows, under a
    lock on the folder; merge: into the runs the file holds then, which another run into the
    same folder may have saved since this one began (two runs at once each wrote the runs they
    had read at their start: the first to finish was lost; bench probe, 2026-12-06)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        runs = {**load(path), **runs} if merge else runs
        data = {"schema_version": SCHEMA_VERSION,
                "models": {name: dataclasses.asdict(run) for name, run in runs.items()}}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bench-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's is 0600
        os.replace(tmp, path)
    finally:
        os.close(folder)  # and the lock with it


def _run_from_dict(d: dict) -> ModelRun:
    meta = d["meta"]
    meta = Meta(**{**meta, "skipped": tuple(meta.get("skipped", ()))})
    points = tuple(Point(**p) for p in d["points"])
    tl = d.get("timeline")
    timeline = None if tl is None else Timeline(**{
        **tl, "predicted": tuple(tuple(p) for p in tl["predicted"]),
        "measured": tuple(tuple(p) for p in tl["measured"])})
    return ModelRun(meta=meta, points=points, timeline=timeline)
