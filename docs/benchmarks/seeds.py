"""NOTE [A portfolio of seeds] (solvers/highs.py), measured: one stored problem at a few limits,
solved with 1 and with n HiGHS seeds at once, in equal wall time; prints the predicted overhead
of each against store-all.

--what program: the joint MILP's whole program alone (from its warm start, as solvers/joint.py
builds both), nothing else running: with n up to the idle cores, each seed has one to itself.
--what auto: "auto" whole (with its least-peak program and coarser ladder aside, each also with
n seeds), which needs about 3n + 1 cores: for the lent machines' 16.

    python docs/benchmarks/seeds.py --problems docs/benchmarks/gpu/h200/problems_h200b.json.gz \
        --model unet --size batch=11,height=416,width=608,base=64 --seeds 1,2
"""
from __future__ import annotations

import argparse
import os
import time

import solvers
from monet_opt.bench_solvers import LOWERINGS
from solvers import highs, joint
from solvers.milp import MilpOptions, Program, build_stages, solve_program


def _program(problem: solvers.Problem, budget: int, time_limit_s: float):
    """The whole program's schedule from its warm start, in `time_limit_s`."""
    o = MilpOptions(time_limit_s=time_limit_s)
    program = Program(build_stages(problem, o.max_recompute_vars, o.max_held_vars), budget)
    warm = joint._best_start(problem, budget, program, joint._heuristic(problem, budget), 10.0)
    res, schedule = solve_program(program, o, warm)
    return res.status, schedule or warm


def _auto(problem: solvers.Problem, budget: int, time_limit_s: float):
    r = solvers.solve(problem, budget, "auto", time_limit_s=time_limit_s)
    return r.status.value, r.schedule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", required=True, help="a problems file (make bench-solvers')")
    ap.add_argument("--device", default="cuda", help="where its problems were profiled")
    ap.add_argument("--model", required=True)
    ap.add_argument("--size", required=True, help="its factory's arguments: batch=11,size=224")
    ap.add_argument("--fractions", default="0.5,0.33",
                    help="shares of store-all's activations to keep")
    ap.add_argument("--seeds", default="1,2", help="how many seeds at once, each in turn")
    ap.add_argument("--what", choices=("program", "auto"), default="program")
    ap.add_argument("--time-limit", type=float, default=20.0)
    args = ap.parse_args()
    LOWERINGS.use(args.device, args.problems)
    LOWERINGS.path = None  # read only
    size = {k: int(v) for k, v in (kv.split("=") for kv in args.size.split(","))}
    problem, _, where = LOWERINGS.get(args.model, size, {})
    store_all = solvers.simulate(problem, solvers.schedule_from_kept(
        problem, problem.saved_for_backward))
    floor = problem.fixed_bytes + sum(problem.tensors[t].bytes for t in problem.backward_outputs)
    act = store_all.peak_bytes - floor
    print(f"{args.model}({args.size}), profiled on {where}; {args.what}, {args.time_limit:g} s "
          f"each, {len(os.sched_getaffinity(0))} cores here", flush=True)
    solve = _program if args.what == "program" else _auto
    for frac in (float(f) for f in args.fractions.split(",")):
        budget = floor + int(frac * act)
        for n in (int(s) for s in args.seeds.split(",")):
            highs.seeds = lambda n=n: n  # NOTE [A portfolio of seeds]
            t0 = time.perf_counter()
            status, schedule = solve(problem, budget, args.time_limit)
            sim = solvers.simulate(problem, schedule) if schedule is not None else None
            over = "-" if sim is None else f"{sim.time_s / store_all.time_s - 1:+.1%}"
            fits = "" if sim is None or sim.peak_bytes <= budget else " OVER THE LIMIT"
            print(f"{frac:.0%} of the activations, {n} seed(s): {over}{fits} ({status}, "
                  f"{time.perf_counter() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
