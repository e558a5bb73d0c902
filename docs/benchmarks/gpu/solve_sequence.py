"""Solve one stored problem with "auto" at the limits `monet-opt bench` gave it, in the bench's
order and in one process (each solve knowing the least-peak schedule and the schedules of the
solves before it, as the profile directory hands them to optimize()), and print each plan's
predicted overhead, time and notes.

Why (2026-11-27, gpu/README.md, fourth lease): on the H200 machine the bench's U-Net (batch 11,
416x608) came out +69.0 % predicted with activations halved and +41.2 % at its least peak, a
looser limit dearer than a tighter one; the same model's problem, lowered there and solved on
the 2-core CPU machine in this order, gave +30.9 % and +34.4 %. The cause was HiGHS in forked
children on 16 cores (NOTE [HiGHS after fork] in solvers/highs.py, since fixed): run there with
--runs 1, this checks the fix; without, what four searches at once (NOTE [A portfolio of seeds])
add on 16 cores. Needs no GPU.
"""
from __future__ import annotations

import argparse
import time

import solvers
from monet_opt.bench_solvers import LOWERINGS
from solvers import portfolio

MiB = 2 ** 20
UNET_GPU = "batch=11,height=416,width=608,base=64"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default="docs/benchmarks/gpu/h200/problems_h200b.json.gz")
    ap.add_argument("--model", default="unet")
    ap.add_argument("--size", default=UNET_GPU, help="the factory arguments it was lowered at")
    ap.add_argument("--limits-mib", default="11607.5,5803.7,4010.4,least",
                    help="in order; 'least': the least peak the solves before it reported")
    ap.add_argument("--time-limit", type=float, default=12.0)
    ap.add_argument("--runs", type=int, default=None,
                    help="searches at once (default: NOTE [A portfolio of seeds]'s rule)")
    args = ap.parse_args()
    if args.runs is not None:
        portfolio.runs = lambda: args.runs
    LOWERINGS.use("cuda", args.problems)
    size = {k: int(v) for k, v in (kv.split("=") for kv in args.size.split(","))}
    problem, _, where = LOWERINGS.get(args.model, size, {})
    print(f"{args.model}({args.size}), profiled on {where}; auto, {args.time_limit:g} s each, "
          f"{portfolio.runs()} search(es) at once")
    known, held, least = [], [], None
    for limit in args.limits_mib.split(","):
        budget = least if limit == "least" else int(float(limit) * MiB)
        if budget is None:
            raise SystemExit("--limits-mib: 'least' needs a solve before it")
        t0 = time.perf_counter()
        r = solvers.solve(problem, budget, "auto", time_limit_s=args.time_limit, known=known,
                          candidates=held)
        if r.floor_schedule is not None:
            known = [r.floor_schedule]
        least = r.min_feasible_bytes
        if r.schedule is not None:
            held.append(r.schedule)
        over = "-" if r.objective_s is None else \
            f"{r.objective_s / problem.no_recompute_time_s - 1:+.1%}"
        print(f"{budget / MiB:,.1f} MiB: {r.status.value} {over} in "
              f"{time.perf_counter() - t0:.1f} s, {r.solver}; {r.note}", flush=True)


if __name__ == "__main__":
    main()
