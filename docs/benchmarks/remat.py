"""NOTE [Rematerializing under the budget] in solvers/remat.py: "auto" with and without the
rematerializing heuristic, and the heuristic alone, on kept problems (the lent H200's BERT-base,
U-Net and DenseNet-121, the CPU's ResNet-50 and GoogLeNet), at the least peak auto reaches
without it, 10 % above that, and at half, a third and a fifth of the store-all activations.
Run from the checkout's root: `python docs/benchmarks/remat.py [--time-limit 12]
[--models bert_base,unet]` (12 s: the side-by-side bench's own limit for auto); it prints
markdown. Predicted overhead over store-all, the simulator's step time; "-": no plan fits."""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import platform
import time

import solvers
from solvers import baselines, registry, remat

FILES = {"h200b": "docs/benchmarks/gpu/h200/problems_h200b.json.gz",
         "h200": "docs/benchmarks/gpu/h200/problems_h200.json.gz",
         "cpu": "docs/benchmarks/problems_cpu.json.gz"}
MODELS = (("bert_base", "h200b"), ("unet", "h200b"), ("densenet121", "h200b"),
          ("resnet50", "cpu"), ("googlenet", "cpu"))
SHARES = (0.5, 1 / 3, 0.2)


def problem(name: str, where: str) -> tuple[solvers.Problem, str]:
    with gzip.open(FILES[where], "rt") as f:
        saved = json.load(f)["problems"]
    key = next(k for k in saved if k.startswith(name + " "))
    return solvers.Problem.from_json(saved[key]["problem"]), f"{key} ({saved[key]['where']})"


def without_remat() -> dict:
    """The registry as before the heuristic: store-all in its place (it never fits where auto
    searches, so auto goes on as it did without it)."""
    def store_all(p, budget, _options):
        return dataclasses.replace(baselines.store_all(p, budget, baselines.BaselineOptions()),
                                   solver="remat")
    return {**registry._REGISTRY, "remat": (store_all, remat.RematOptions)}


def overhead(r: solvers.SolveResult, base_s: float) -> str:
    return f"{r.objective_s / base_s - 1:+.1%}" if r.feasible else "-"


def arguments(script: str, time_limit_s: float, models, repeated: str = ""
              ) -> tuple[argparse.Namespace, set]:
    """A kept-problem script's --time-limit and --models (`models`: its (name, file) pairs),
    and the models chosen; prints the command line it was run with. `repeated`: the name of
    one more option that may be given many times (args.repeated, a list)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=time_limit_s)
    ap.add_argument("--models", help="default: " + ",".join(m for m, _ in models))
    if repeated:
        ap.add_argument(f"--{repeated}", action="append", default=[], dest="repeated")
    args = ap.parse_args()
    print(f"Command: `python docs/benchmarks/{script} --time-limit {args.time_limit:g}"
          + (f" --models {args.models}" if args.models else "")
          + "".join(f" --{repeated} {v}" for v in getattr(args, "repeated", []))
          + f"`. Solved on {platform.machine()}, {time.strftime('%Y-%m-%d')}.\n")
    return args, set(args.models.split(",")) if args.models else {m for m, _ in models}


def main() -> None:
    args, chosen = arguments("remat.py", 12.0, MODELS)
    full, old = registry._REGISTRY, without_remat()
    for name, where in MODELS:
        if name not in chosen:
            continue
        p, key = problem(name, where)
        store = solvers.simulate(p, solvers.schedule_from_kept(p, p.saved_for_backward))
        grads = sum(p.tensors[t].bytes for t in p.backward_outputs)
        floor = p.fixed_bytes + grads
        act = store.peak_bytes - floor
        registry._REGISTRY = old
        least = solvers.solve(p, floor, "auto", time_limit_s=args.time_limit)
        registry._REGISTRY = full
        mine = solvers.solve(p, floor, "remat", time_limit_s=args.time_limit)
        print(f"### {key}\n\nStore-all peak {store.peak_bytes / 2**20:,.0f} MiB, activations "
              f"{act / 2**20:,.0f} MiB. Least peak: auto without rematerializing "
              f"{least.min_feasible_bytes / 2**20:,.1f} MiB; rematerializing "
              f"{mine.min_feasible_bytes / 2**20:,.1f} MiB ({mine.solve_time_s:.1f} s).\n")
        print("| limit | MiB | auto without it | auto | winner | rematerializing alone |")
        print("|---|---|---|---|---|---|")
        budgets = [("least without it", least.min_feasible_bytes),
                   ("that +10 %", int(least.min_feasible_bytes * 1.1))]
        budgets += [(f"{share:.0%} of activations", floor + int(share * act))
                    for share in SHARES]
        for label, budget in budgets:
            registry._REGISTRY = old
            before = solvers.solve(p, budget, "auto", time_limit_s=args.time_limit)
            registry._REGISTRY = full
            after = solvers.solve(p, budget, "auto", time_limit_s=args.time_limit)
            alone = solvers.solve(p, budget, "remat", time_limit_s=args.time_limit)
            print(f"| {label} | {budget / 2**20:,.0f} | {overhead(before, store.time_s)} | "
                  f"{overhead(after, store.time_s)} | {after.solver} | "
                  f"{overhead(alone, store.time_s)} ({alone.solve_time_s:.1f} s) |", flush=True)
        print()


if __name__ == "__main__":
    main()
