"""auto at the least peak and a little above it: predicted overhead over store-all and how
long each solve took, against its limit (NOTE [Nothing cheap fits] in solvers/registry.py).
Problems profiled earlier on this CPU (docs/benchmarks/problems_*.json.gz), so that only the
solving differs; the least peak is found first by auto at the floor, then known to each solve
as in `bench_solvers --near-floor`.

    PYTHONPATH=. python docs/benchmarks/floor_milp_share.py [--limit 30] [MODEL ...]
"""
from __future__ import annotations

import solvers
from saved_problems import arguments, load

KEYS = ("unet", "resnet50", "googlenet", "bench_resnet50")
ABOVE = (0.0, 0.02, 0.05)


def row(key: str, limit: float) -> str:
    problem, floor, _act, store_all = load(key)
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
    args = arguments(__doc__.splitlines()[0], "auto", KEYS)
    print(f"auto in {args.limit:g} s | least peak | " +
          " | ".join(f"least +{e:.0%}" for e in ABOVE) + " |\n|---|---|" + "---|" * len(ABOVE))
    for key in args.models:
        print(row(key, args.limit), flush=True)


if __name__ == "__main__":
    main()
