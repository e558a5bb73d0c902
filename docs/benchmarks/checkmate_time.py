"""Checkmate's baseline (`solver="checkmate"`) against its time limit: at store-all's peak and
at the problem's floor (the least peak its sizes allow), how long each solve took, with what.
Problems profiled earlier on this CPU (docs/benchmarks/problems_*.json.gz), so that only the
solving differs.

    PYTHONPATH=. python docs/benchmarks/checkmate_time.py [--limit 30] [MODEL ...]
"""
from __future__ import annotations

import time

import solvers
from saved_problems import arguments, load

KEYS = ("densenet121", "gpt2", "bench_resnet50", "googlenet", "unet")


def cell(problem, budget: int, limit: float) -> str:
    start = time.perf_counter()
    r = solvers.solve(problem, budget, "checkmate", time_limit_s=limit)
    wall = time.perf_counter() - start
    how = "program not built" if "not built" in r.note else \
        "LP rounding" if "LP relaxation" in r.note else "MILP"
    return f"{r.status.value}, {how}: {r.solve_time_s:.1f} s ({wall:.1f} s in all)"


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "Checkmate", KEYS)
    print(f"Checkmate in {args.limit:g} s | ops | at store-all's peak | at the floor |\n"
          "|---|---|---|---|")
    for key in args.models:
        problem, floor, _act, store_all = load(key)
        cells = [cell(problem, b, args.limit) for b in (store_all.peak_bytes, floor)]
        print(f"| {key} | {len(problem.ops)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
