"""NOTE [Aimed at the least peak] in solvers/evict.py: cheapest-first eviction's least peak (its
min_feasible_bytes, asked at a budget no schedule needs) and how long finding it took, on the
kept problems (each with no variants). Run from the checkout's root:
`python docs/benchmarks/evict_least.py docs/benchmarks/problems_cpu.json.gz ...`."""
from __future__ import annotations

import gzip
import json
import sys
import time

import solvers


def main(paths: list[str]) -> None:
    print("| problem | ops | evict's least peak MiB | s |")
    print("|---|---|---|---|")
    for path in paths:
        with gzip.open(path, "rt") as f:
            kept = json.load(f)["problems"]
        for key, entry in kept.items():
            p = solvers.Problem.from_json(entry["problem"])
            t0 = time.perf_counter()
            r = solvers.solve(p, 10**15, "evict", time_limit_s=30)
            print(f"| {key} | {len(p.ops)} | {r.min_feasible_bytes / 2**20:.1f} | "
                  f"{time.perf_counter() - t0:.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
