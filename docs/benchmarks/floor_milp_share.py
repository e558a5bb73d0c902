"""auto at the least peak and a little above it: predicted overhead over store-all and how
long each solve took, against its limit (NOTE [Nothing cheap fits] in solvers/registry.py).
Problems profiled earlier on this CPU (docs/benchmarks/problems_*.json.gz), so that only the
solving differs; the least peak is found first by auto at the floor, then known to each solve
as in `bench_solvers --near-floor`.

    PYTHONPATH=. python docs/benchmarks/floor_milp_share.py [--limit 30] [MODEL ...]
"""
from __future__ import annotations

import argparse
import os

import solvers
from monet_opt import bench_solvers as bs

PROBLEMS = {
    "unet": ("problems_unet.json.gz", "unet", {"base": 32, "batch": 4, "height": 128,
                                               "width": 128}),
    "resnet50": ("problems_cpu.json.gz", "resnet50", {"batch": 16, "size": 128}),
    "googlenet": ("problems_cpu.json.gz", "googlenet", {"batch": 32, "size": 128}),
    "bench_resnet50": ("problems_bench_resnet50.json.gz", "resnet50",
                       {"batch": 16, "size": 128}),
}
ABOVE = (0.0, 0.02, 0.05)


def row(key: str, limit: float) -> str:
    file, name, size = PROBLEMS[key]
    bs.LOWERINGS.use("cpu", os.path.join(os.path.dirname(__file__), file))
    with open(os.devnull, "w") as quiet:
        problem, floor, _act, store_all = bs.lowered(name, quiet, size)
    first = solvers.solve(problem, floor, "auto", time_limit_s=limit)
    least = first.min_feasible_bytes
    known = [first.floor_schedule] if first.floor_schedule is not None else []
    cells = []
    for extra in ABOVE:
        r = solvers.solve(problem, int(least * (1 + extra)), "auto", time_limit_s=limit,
                          known=known)
        cells.append(f"{r.objective_s / store_all.time_s - 1:+.1%} in {r.solve_time_s:.1f} s"
                     if r.feasible else r.status.value)
    return f"| {key} | {least / 2 ** 20:.1f} MiB | " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=30.0, help="auto's time limit, s")
    ap.add_argument("models", nargs="*", help=f"of {', '.join(PROBLEMS)} (default: all)")
    args = ap.parse_args()
    unknown = sorted(set(args.models) - set(PROBLEMS))
    if unknown:
        ap.error(f"no problem named {', '.join(unknown)}; choose from {', '.join(PROBLEMS)}")
    print(f"auto in {args.limit:g} s | least peak | " +
          " | ".join(f"least +{e:.0%}" for e in ABOVE) + " |\n|---|---|" + "---|" * len(ABOVE))
    for key in args.models or PROBLEMS:
        print(row(key, args.limit), flush=True)


if __name__ == "__main__":
    main()
