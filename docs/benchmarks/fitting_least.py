"""What "auto" spends where store-all fits, and the least peak it says there, with the
least-peak program given a quarter of the limit (before) and AUTO_FITTING_LEAST_SHARE of it
(after; NOTE [The least peak where store-all fits] in solvers/least.py); then, after the
fitting call, a solve at half the activations, whose least peak the whole program searches.

Problems profiled earlier on this CPU (docs/benchmarks/problems_*.json.gz), so that only the
solving differs; each pair of solves starts with the least-peak cache empty.

    PYTHONPATH=. python docs/benchmarks/fitting_least.py
"""
from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

import solvers
from solvers import least, registry
from solvers.problem import Problem

FILES = ("problems_cpu.json.gz", "problems_bench_resnet50.json.gz")
LIMIT_S = 30.0


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def _pair(problem: Problem, share: float) -> str:
    """The fitting solve and then the solve at half the activations, with `share`."""
    registry.AUTO_FITTING_LEAST_SHARE = share
    least.cache_clear()
    store_all = solvers.solve(problem, 1 << 62, "store_all").peak_bytes
    start = time.perf_counter()
    fits = solvers.solve(problem, store_all, "auto", time_limit_s=LIMIT_S)
    fit_s = time.perf_counter() - start
    half = problem.fixed_bytes + (store_all - problem.fixed_bytes) // 2
    tight = solvers.solve(problem, half, "auto", time_limit_s=LIMIT_S)
    return (f"{fit_s:.1f} s | {_mib(fits.min_feasible_bytes)} | "
            f"{_mib(tight.min_feasible_bytes)} ({tight.solve_time_s:.1f} s)")


def main() -> None:
    default = registry.AUTO_FITTING_LEAST_SHARE
    here = Path(__file__).parent
    print(f"auto, time_limit_s={LIMIT_S:g}; python {sys.version.split()[0]}\n")
    print("| problem | ops | share | fitting solve | its least peak (MiB) | "
          "least peak at half the activations (MiB, solve time) |")
    print("|---|---|---|---|---|---|")
    for name in FILES:
        problems = json.loads(gzip.open(here / name).read())["problems"]
        for key, entry in problems.items():
            problem = Problem.from_json(entry["problem"])
            for label, share in (("1/4 (before)", 0.25), (f"1/{1 / default:.0f}", default)):
                print(f"| {key} | {len(problem.ops)} | {label} | {_pair(problem, share)} |",
                      flush=True)


if __name__ == "__main__":
    main()
