"""What making results late is worth (NOTE [Results made late] in monet_opt/late_grads.py): each
bench model at its CPU size lowered with the rewrite off and on, its store-all peak (simulated),
the least peak "auto" reaches, and with the rewrite on the store-all plan's measured peak beside
eager's. Prints markdown (docs/benchmarks/late_grads.md).

    python -m monet_opt.bench_late [--time-limit 30] [--models vgg16,resnet50]
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch

import monet_opt
import solvers
from monet_opt import late_grads
from monet_opt.bench.measure import runner_for
from monet_opt.bench.models import SPECS


@contextlib.contextmanager
def rewrite_off():
    real = late_grads.make_results_late
    late_grads.make_results_late = lambda gm: 0
    try:
        yield
    finally:
        late_grads.make_results_late = real


def _peaks(model, x, time_limit_s: float) -> tuple[int, int, int]:
    """(floor, store-all peak, least peak "auto" reaches) of the lowered step."""
    problem = monet_opt.lower_problem(model, x, profile_repeats=1)
    store_all = solvers.simulate(problem, solvers.schedule_from_kept(
        problem, problem.saved_for_backward))
    least = solvers.solve(problem, problem.fixed_bytes, "auto", time_limit_s=time_limit_s)
    floor = problem.fixed_bytes + sum(problem.tensors[t].bytes for t in problem.backward_outputs)
    return floor, store_all.peak_bytes, least.min_feasible_bytes


def _measured(model, x) -> tuple[int, int]:
    """(eager's measured peak, the store-all plan's measured peak), the bench's step."""
    opt = monet_opt.optimize(model, x, 1 << 50, profile_repeats=1, profile_dir=None)
    peaks = []
    for name, module in (("eager", model), ("ours", opt)):
        runner = runner_for(name, module, model, x)
        runner.clear_grads()
        peaks.append(monet_opt.measure_peak(lambda: runner.step(x), runner.resident))
        runner.clear_grads()
    return peaks[0], peaks[1]


def mib(b: int) -> str:
    return f"{b / 2**20:,.1f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--models", default=",".join(SPECS))
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    print("| model | floor | store-all off | store-all on | least off | least on "
          "| eager measured | store-all on measured |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        started = time.perf_counter()
        model, x, config = SPECS[name].build("cpu")
        with rewrite_off():
            floor, sa_off, least_off = _peaks(model, x, args.time_limit)
        _, sa_on, least_on = _peaks(model, x, args.time_limit)
        eager, ours = _measured(model, x)
        over = lambda b: f"{mib(b)} (+{mib(b - floor)})"  # noqa: E731
        print(f"| `{config}` | {mib(floor)} | {over(sa_off)} | {over(sa_on)} | {over(least_off)} "
              f"| {over(least_on)} | {over(eager)} | {over(ours)} |", flush=True)
        print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
