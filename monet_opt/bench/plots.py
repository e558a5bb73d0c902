"""PNG plots: the memory/overhead frontier of every method (per model, and all models in one
figure), and predicted vs measured memory over one step of one schedule."""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

from monet_opt.bench.results import ModelRun

STYLE = {  # family -> (marker, line style)
    "ours": ("o", "-"), "checkmate": ("s", "--"), "checkpoint": ("D", ""),
    "compile": ("^", ":"), "eager": ("*", "")}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write(out: Path, runs: dict[str, ModelRun]) -> list[Path]:
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, run in runs.items():
        fig, ax = plt.subplots(figsize=(7.5, 5))
        frontier(ax, run)
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        _footer(fig, [run])
        paths.append(_save(fig, out / f"bench_frontier_{name}.png"))
        if run.timeline is not None:
            fig, ax = plt.subplots(figsize=(9, 4.5))
            timeline(ax, run)
            fig.tight_layout(rect=(0, 0.03, 1, 1))
            _footer(fig, [run])
            paths.append(_save(fig, out / f"bench_timeline_{name}.png"))
    if runs:
        paths.append(_overview(plt, out, runs))
    return paths


def _overview(plt, out: Path, runs: dict[str, ModelRun]) -> Path:
    cols = min(4, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows), squeeze=False)
    for ax, run in zip(axes.flat, runs.values()):
        frontier(ax, run, legend=False)
    for ax in list(axes.flat)[len(runs):]:
        ax.axis("off")
    handles, labels = {}, []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    labels = list(handles)
    ncol = max(1, min(len(labels), 2 * cols))
    height = fig.get_figheight()
    footer_in, legend_in = 0.4, 0.25 * math.ceil(len(labels) / ncol) + 0.1
    fig.legend([handles[k] for k in labels], labels, loc="lower center", ncol=ncol, fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, footer_in / height))
    fig.tight_layout(rect=(0, (footer_in + legend_in) / height, 1, 1))
    _footer(fig, list(runs.values()))
    return _save(fig, out / "bench_frontier.png")


# One colour per method in every panel (matplotlib's cycle would follow each panel's methods).
_METHOD_ORDER = ("monet_opt auto", "monet_opt milp", "monet_opt dp", "checkmate (our executor)",
                 "checkpoint per block", "checkpoint_sequential", "torch.compile inductor")


def _color(method: str) -> str:
    k = _METHOD_ORDER.index(method) if method in _METHOD_ORDER else \
        len(_METHOD_ORDER) + sum(map(ord, method))
    return f"C{k % 10}"


def frontier(ax, run: ModelRun, legend: bool = True) -> None:
    """Measured peak (% of eager's) against overhead, one series per method."""
    m = run.meta
    ok = [p for p in run.points if p.status == "ok" and p.compared_bytes is not None
          and p.overhead is not None]
    eager = run.eager_compared_bytes  # NOTE [One instrument for every method]
    for method in dict.fromkeys(p.method for p in ok):
        pts = [p for p in ok if p.method == method]
        family = pts[0].family
        marker, line = STYLE.get(family, ("x", "-"))
        if family != "compile":
            pts.sort(key=lambda p: p.compared_bytes)
        xs = [100 * p.compared_bytes / eager for p in pts]
        ys = [100 * p.overhead for p in pts]
        color = "black" if family == "eager" else _color(method)
        ax.plot(xs, ys, marker=marker, linestyle=line or "none", label=method, color=color,
                markersize=10 if family == "eager" else 5, linewidth=1)
        if family == "compile":
            for p, x, y in zip(pts, xs, ys):
                ax.annotate(p.setting.replace("budget ", ""), (x, y), fontsize=6,
                            textcoords="offset points", xytext=(3, 3))
    floor = 100 * m.floor_bytes / eager
    half = 100 * (m.floor_bytes + (eager - m.floor_bytes) / 2) / eager
    ax.axvline(floor, color="grey", linestyle=":", linewidth=1)
    ax.axvline(half, color="grey", linestyle="--", linewidth=0.8)
    ax.text(floor, ax.get_ylim()[1], " floor", fontsize=7, color="grey", va="top")
    ax.text(half, ax.get_ylim()[1], " activations halved", fontsize=7, color="grey", va="top")
    ax.set_xlabel("peak, % of eager's" + (" (allocation events)" if run.instrument.startswith(
        "torch.profiler") else ""))
    ax.set_ylabel("step time overhead vs eager, %")
    ax.set_title(f"{m.model}: {_short(m.config)}", fontsize=9)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7, loc="upper right")


def timeline(ax, run: ModelRun) -> None:
    tl = run.timeline
    mib = 2 ** 20
    by = next((p.peak_instrument for p in run.points
               if p.method == tl.method and p.peak_instrument), "live-bytes counter")
    ax.plot([t for t, _ in tl.measured], [b / mib for _, b in tl.measured], linewidth=0.8,
            drawstyle="steps-post", label=f"measured ({by})")
    ax.plot([t for t, _ in tl.predicted], [b / mib for _, b in tl.predicted], linewidth=0.8,
            drawstyle="steps-post", label="predicted (the plan's simulation)")
    ax.axhline(tl.limit_bytes / mib, color="red", linestyle="--", linewidth=0.8, label="limit")
    ax.axhline(run.meta.floor_bytes / mib, color="grey", linestyle=":", linewidth=0.8,
               label="floor (parameters, buffers, input, gradients)")
    for at, style in ((tl.measured_backward_at, "-"), (tl.predicted_backward_at, "--")):
        ax.axvline(at, color="grey", linestyle=style, linewidth=0.6)
    ax.set_xlabel("fraction of the step (predicted: profiled op times; measured: wall clock); "
                  "vertical lines: backward starts", fontsize=8)
    ax.set_ylabel("memory, MiB")
    limit = "the least feasible" if tl.setting == "min" else \
        f"{tl.setting[4:]} above the least feasible" if tl.setting.startswith("min+") else \
        f"the floor and {tl.setting.split()[0]} of eager's activations" \
        if tl.setting.endswith(" act") else f"{tl.setting} of eager's peak"
    ax.set_title(f"{run.meta.model}: {tl.method}, limit {limit}", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)


def _short(config: str) -> str:
    return config.replace("monet_opt.zoo.", "").replace(", channels-last", ",\nchannels-last")


def _footer(fig, runs: list[ModelRun]) -> None:
    m = runs[0].meta
    commits = sorted({r.meta.git_commit for r in runs})
    commands = sorted({r.meta.command for r in runs})
    text = (f"{m.device}; torch {m.torch_version}; commit {', '.join(commits)}; "
            f"{'; '.join(commands)}")
    width = int(fig.get_figwidth() * 22)
    fig.text(0.01, 0.005, "\n".join(textwrap.wrap(text, width)[:3]), fontsize=6, color="grey",
             ha="left", va="bottom")


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path
