"""Checkmate's baseline (`solver="checkmate"`) against its time limit: at store-all's peak and
at the problem's floor (the least peak its sizes allow), how long each solve took, with what.
Problems profiled earlier on this CPU (docs/benchmarks/problems_*.json.gz), so that only the
solving differs.

    PYTHONPATH=. python docs/benchmarks/checkmate_time.py [--limit 30] [MODEL ...]
"""
from __future__ import annotations

import argparse
import os
import time

import solvers
from monet_opt import bench_solvers as bs

PROBLEMS = {
    "densenet121": ("problems_densenet121.json.gz", "densenet121", {"batch": 16, "size": 128}),
    "resnet50": ("problems_bench_resnet50.json.gz", "resnet50", {"batch": 16, "size": 128}),
    "googlenet": ("problems_cpu.json.gz", "googlenet", {"batch": 32, "size": 128}),
    "unet": ("problems_unet.json.gz", "unet", {"base": 32, "batch": 4, "height": 128,
                                               "width": 128}),
}


def cell(problem, budget: int, limit: float) -> str:
    start = time.perf_counter()
    r = solvers.solve(problem, budget, "checkmate", time_limit_s=limit)
    wall = time.perf_counter() - start
    how = "program not built" if "not built" in r.note else \
        "LP rounding" if "LP relaxation" in r.note else "MILP"
    return f"{r.status.value}, {how}: {r.solve_time_s:.1f} s ({wall:.1f} s in all)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=30.0, help="Checkmate's time limit, s")
    ap.add_argument("models", nargs="*", help=f"of {', '.join(PROBLEMS)} (default: all)")
    args = ap.parse_args()
    unknown = sorted(set(args.models) - set(PROBLEMS))
    if unknown:
        ap.error(f"no problem named {', '.join(unknown)}; choose from {', '.join(PROBLEMS)}")
    print(f"Checkmate in {args.limit:g} s | ops | at store-all's peak | at the floor |\n"
          "|---|---|---|---|")
    for key in args.models or PROBLEMS:
        file, name, size = PROBLEMS[key]
        bs.LOWERINGS.use("cpu", os.path.join(os.path.dirname(__file__), file))
        with open(os.devnull, "w") as quiet:
            problem, floor, _act, store_all = bs.lowered(name, quiet, size)
        cells = [cell(problem, b, args.limit) for b in (store_all.peak_bytes, floor)]
        print(f"| {key} | {len(problem.ops)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
