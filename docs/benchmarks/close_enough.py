"""NOTE [Close enough] in solvers/registry.py: "auto" at limits a little under store-all's peak
(the user who ran out of memory by a few percent), its plan's predicted overhead and the time
it took. Run from the checkout's root: `python docs/benchmarks/close_enough.py`; the problems
are read from docs/benchmarks/problems_cpu.json.gz (GPT-2 narrow is lowered here and kept in
memory if the file lacks it; the file is not written)."""
from __future__ import annotations

import time

import solvers
from monet_opt.bench_solvers import LOWERINGS

MODELS = (("resnet50", dict(batch=16, size=128)), ("gpt2_narrow", dict(batch=4, seq=256)))


def main() -> None:
    LOWERINGS.use("cpu", "docs/benchmarks/problems_cpu.json.gz")
    LOWERINGS.path = None  # read, never written
    print("| model | limit (share of store-all's peak) | predicted overhead | solve s | plan |")
    print("|---|---|---|---|---|")
    for name, size in MODELS:
        p, _, _ = LOWERINGS.get(name, size, {})
        store_all = solvers.simulate(p, solvers.schedule_from_kept(p, p.saved_for_backward))
        for share in (0.95, 0.9):
            t0 = time.perf_counter()
            r = solvers.solve(p, int(store_all.peak_bytes * share), "auto", time_limit_s=30)
            print(f"| {name} | {share:.0%} | {r.objective_s / p.no_recompute_time_s - 1:+.2%} | "
                  f"{time.perf_counter() - t0:.1f} | {r.solver} |", flush=True)


if __name__ == "__main__":
    main()
