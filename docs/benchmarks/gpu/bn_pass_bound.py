"""What a schedule recomputes on the H200, and what if a recomputed BatchNorm cost one elementwise
pass there. On the H200's ResNet-50 problem: auto's schedule at half and a third of the
activations, its recomputation time by op kind; then the boundary bound and auto's schedule with
each BatchNorm that a ReLU reads given that ReLU's profiled time as its recompute time (an
assumption, not a measurement: on CUDA the BatchNorm recomputes whole, since no kernel here
normalizes from the saved statistics bitwise as cuDNN's training kernel does; NOTE [BatchNorm
recomputed from its statistics]).

    python docs/benchmarks/gpu/bn_pass_bound.py [--time-limit 60]
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import re
from collections import Counter
from pathlib import Path

import solvers
from monet_opt import bench_solvers
from solvers.bound import boundary_bound
from solvers.problem import Problem

PROBLEMS = Path(__file__).parent / "h200" / "problems_h200.json.gz"


def with_bn_as_one_pass(p: Problem) -> tuple[Problem, int]:
    """`p` with each BatchNorm read by a ReLU recomputed in that ReLU's time; how many."""
    readers: dict[int, list[int]] = {}
    for i in p.forward_ops:
        for t in p.ops[i].inputs:
            readers.setdefault(t, []).append(i)
    ops, changed = list(p.ops), 0
    for i in p.forward_ops:
        op = p.ops[i]
        if "batch_norm" not in op.name:
            continue
        relus = [j for j in readers.get(op.outputs[0], [])
                 if p.ops[j].name.startswith("relu") and ":" not in p.ops[j].name]
        if relus:
            ops[i] = dataclasses.replace(op, recompute_time_s=p.ops[relus[0]].time_s)
            changed += 1
    return dataclasses.replace(p, ops=tuple(ops)), changed


def recomputed_by_kind(p: Problem, schedule) -> str:
    """Recomputation time of `schedule` by op kind: "kind ms (runs)", the dearest first."""
    ms, runs = Counter(), Counter()
    for i in schedule.backward:
        if not p.ops[i].is_backward:
            kind = re.sub(r"_\d+$", "", p.ops[i].name.split(":")[0])
            ms[kind] += p.ops[i].rerun_s * 1e3
            runs[kind] += 1
    return ", ".join(f"{k} {v:.1f} ms ({runs[k]})" for k, v in ms.most_common())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    bench_solvers.LOWERINGS.use("cuda", str(PROBLEMS))  # read from the file, never profiled here
    problem, floor, act, store_all = bench_solvers.lowered(
        "resnet50", io.StringIO(), {"batch": 184, "size": 224})
    shares = (0.5, 1 / 3)
    print("\n# What a schedule recomputes on the H200, and a BatchNorm as one pass\n\nCommand: "
          f"`python docs/benchmarks/gpu/bn_pass_bound.py --time-limit {args.time_limit:g}` "
          "(solved on the CPU, on the H200 profile in `gpu/h200/problems_h200.json.gz`). The "
          "second table is an assumption, not a measurement: on CUDA a recomputed BatchNorm runs "
          "whole (no kernel here normalizes from the saved statistics bitwise as cuDNN's "
          "training kernel does), and here each BatchNorm a ReLU reads is given that ReLU's "
          "profiled time instead.\n")
    print(f"ResNet-50 b184 224², H200 profile, store-all step {store_all.time_s * 1e3:.1f} ms; "
          f"auto in {args.time_limit:g} s, what its schedule recomputes (ms of recomputation, "
          "runs):\n")
    for share in shares:
        found = solvers.solve(problem, floor + int(share * act), "auto",
                              time_limit_s=args.time_limit)
        print(f"- {share:.0%} of the activations: "
              f"{found.objective_s / store_all.time_s - 1:+.1%}; "
              f"{recomputed_by_kind(problem, found.schedule)}", flush=True)
    cheap, changed = with_bn_as_one_pass(problem)
    print(f"\nWith {changed} BatchNorms recomputed in their ReLU's time; bound and auto "
          f"{args.time_limit:g} s each.\n\n| activations left | "
          "bound, as profiled | bound, BatchNorm one pass | auto, BatchNorm one pass |\n"
          "|---|---|---|---|")
    for share in shares:
        budget = floor + int(share * act)
        over = [boundary_bound(p, budget, args.time_limit) / store_all.time_s - 1
                for p in (problem, cheap)]
        found = solvers.solve(cheap, budget, "auto", time_limit_s=args.time_limit)
        print(f"| {share:.0%} | {over[0]:+.1%} | {over[1]:+.1%} | "
              f"{found.objective_s / store_all.time_s - 1:+.1%} |", flush=True)


if __name__ == "__main__":
    main()
