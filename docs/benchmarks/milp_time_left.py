"""NOTE [Time left near the floor] in solvers/joint.py: the MILP solver alone (solver="milp")
at its own least peak and 10 / 20 % above it, on kept problems (the CPU's GoogLeNet and
ResNet-50, the lent H200's DenseNet-121, U-Net and BERT-base). Run from the checkout's root:
`python docs/benchmarks/milp_time_left.py [--time-limit 30] [--models googlenet,resnet50]`;
it prints markdown. Predicted overhead over store-all (the simulator's step time) and how long
the solve took; "-": no plan fits."""
from __future__ import annotations

import time

import solvers
# docs/benchmarks/remat.py: a kept problem by model and file, the scripts' arguments
from remat import arguments, problem

MODELS = (("googlenet", "cpu"), ("resnet50", "cpu"), ("densenet121", "h200b"),
          ("unet", "h200b"), ("bert_base", "h200b"))
ABOVE = (0.0, 0.1, 0.2)


def main() -> None:
    args, chosen = arguments("milp_time_left.py", 30.0, MODELS)
    print("| problem | budget | MiB | predicted overhead | solve s |")
    print("|---|---|---|---|---|")
    for name, where in MODELS:
        if name not in chosen:
            continue
        p, key = problem(name, where)
        store = solvers.simulate(p, solvers.schedule_from_kept(p, p.saved_for_backward))
        floor = p.fixed_bytes + sum(p.tensors[t].bytes for t in p.backward_outputs)
        least = solvers.solve(p, floor, "milp", time_limit_s=args.time_limit).min_feasible_bytes
        for above in ABOVE:
            budget = int(least * (1 + above))
            begun = time.perf_counter()
            r = solvers.solve(p, budget, "milp", time_limit_s=args.time_limit)
            took = time.perf_counter() - begun
            overhead = f"{r.objective_s / store.time_s - 1:+.1%}" if r.feasible else "-"
            label = "the MILP's least peak" if not above else f"{above:.0%} above it"
            print(f"| {key} | {label} | {budget / 2**20:,.1f} | {overhead} | {took:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
