"""What operator variants are worth: the "auto" solver with variants off vs on, and with each
family alone and all but it, at limits leaving 70/50/40 % of the store-all activation memory
(MONeT's ablation), on the side-by-side benchmark's CPU sizes (its GPU sizes with --device
cuda). Prints markdown (docs/benchmarks/variants.md).

"Off" is the model lowered with `variants=False`, as `optimize(..., variants=False)` runs it
(no convolution backward split either: NOTE [Conv backward split]); "all but
batchnorm.saved_stats" is lowered with every family but BatchNorm's recomputation from its
statistics (NOTE [BatchNorm recomputed from its statistics]), which changes the graph rather
than offering solvers.Variants; the other rows share one lowering with every family offered,
cut to the families named ("batchnorm.saved_stats only": cut to none).

Per family, it also prints what its sites read instead of what they replace, and what it is
worth at the no-recompute peak: that peak with every family in its lightest form, less the same
without the family (a family can save bytes between forward and backward and still be worth
nothing there, if the peak is where its tensor is not alive).

    python -m monet_opt.bench_variants [--time-limit 30] [--models resnet50,gpt2_narrow]
                                       [--solver auto] [--lossy]
"""
from __future__ import annotations

import argparse
import sys

import solvers
from monet_opt import bn_split, zoo
from monet_opt.bench.models import SPECS
from monet_opt.bench_solvers import (FRACTIONS, LOWERINGS, add_lowering_arguments, begin,
                                     lowered, mib)
from monet_opt.variants import FAMILIES
from solvers.variants import lightest


def kib(b: float) -> str:
    return f"{b / 2**10:,.0f}"


def _no_recompute_peak(problem: solvers.Problem, chosen: frozenset[int]) -> int:
    kept = problem.with_variants(chosen).saved_for_backward
    return solvers.simulate(problem, solvers.schedule_from_kept(problem, kept, chosen)).peak_bytes


def family_table(problem: solvers.Problem, families: dict[str, set[int]], out) -> None:
    light = lightest(problem)
    peak = _no_recompute_peak(problem, light)
    print(f"No-recompute peak with every family in its lightest form: {mib(peak)} MiB; "
          f"with none: {mib(_no_recompute_peak(problem, frozenset()))} MiB.\n", file=out)
    print("| family | sites | replaced (KiB) | read instead (KiB) | worth at that peak (KiB) |",
          file=out)
    print("|---|---|---|---|---|", file=out)
    for fam, vs in sorted(families.items()):
        replaced = sum(problem.tensors[problem.variants[v].replaces].bytes for v in vs)
        reads = sum(problem.tensors[t].bytes for v in vs for t in problem.variants[v].reads)
        worth = _no_recompute_peak(problem, light - vs) - peak
        print(f"| {fam} | {len(vs)} | {kib(replaced)} | {kib(reads)} | {kib(worth)} |", file=out)
    print(file=out)


def bench_model(name: str, solver: str, time_limit_s: float, out, lossy: bool = False,
                size: dict | None = None, lower_only: bool = False) -> None:
    off, _, _, off_store_all = lowered(name, out, size, variants=False)
    whole_bn, _, _, whole_bn_store_all = lowered(  # NOTE [BatchNorm recomputed from ...]
        name, out, size, label=f"all but {bn_split.NAME}", allow_lossy=lossy,
        variants={f.name for f in FAMILIES if f.exact or lossy})
    problem, floor, act, store_all = lowered(name, out, size, allow_lossy=lossy)
    if lower_only:
        return
    families: dict[str, set[int]] = {}
    for v, var in enumerate(problem.variants):
        families.setdefault(var.name.split(":")[0], set()).add(v)
    print(f"{len(problem.variants)} variant sites: "
          + ", ".join(f"{f} x{len(vs)}" for f, vs in sorted(families.items())) + ".\n",
          file=out)
    family_table(problem, families, out)
    print(f"Solver {solver!r}, time limit {time_limit_s:g} s. Overheads are against the "
          f"store-all step of the lowering they ran on (variants off: "
          f"{off_store_all.time_s * 1e3:.0f} ms; on: {store_all.time_s * 1e3:.0f} ms). Least "
          f"peak: the least the solver's heuristics reach, not a proven minimum.\n",
          file=out)
    print("| limit (activations left) | variants | predicted step | overhead | gap "
          "| least peak (MiB) | variants chosen |", file=out)
    print("|---|---|---|---|---|---|---|", file=out)
    cases = [("off", off, off_store_all), ("all", problem, store_all),
             (f"all but {bn_split.NAME}", whole_bn, whole_bn_store_all),
             (f"{bn_split.NAME} only", problem.only_variants(set()), store_all)]
    every = set(range(len(problem.variants)))
    for f, vs in sorted(families.items()):
        cases += [(f"{f} only", problem.only_variants(vs), store_all),
                  (f"all but {f}", problem.only_variants(every - vs), store_all)]
    for frac in FRACTIONS:
        budget = floor + int(frac * act)
        for label, p, base in cases:
            if frac != 0.5 and label not in ("off", "all", f"all but {bn_split.NAME}"):
                continue
            r = solvers.solve(p, budget, solver, time_limit_s=time_limit_s)
            ok = r.feasible
            step = f"{r.objective_s * 1e3:.0f} ms" if ok else "-"
            over = f"{r.objective_s / base.time_s - 1:+.1%}" if ok else "infeasible"
            gap = f"{r.gap:.1%}" if r.gap is not None else "-"
            used = len(r.schedule.variants) if ok else "-"
            print(f"| {mib(budget)} MiB ({frac:.0%}) | {label} | {step} | {over} | {gap} "
                  f"| {mib(r.min_feasible_bytes)} | {used} |", file=out, flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--models", default="resnet50,gpt2_narrow")
    ap.add_argument("--solver", default="auto")
    ap.add_argument("--lossy", action="store_true",
                    help="offer the lossy families too (optimize(allow_lossy=True))")
    ap.add_argument("--size", default="", help="factory arguments instead of the benchmark's "
                                               "CPU sizes")
    ap.add_argument("--gpu-sizes", action="store_true",
                    help="the benchmark's GPU sizes (the default with --device cuda)")
    ap.add_argument("--lower-only", action="store_true",
                    help="lower and profile (into --problems), solve nothing")
    add_lowering_arguments(ap)
    args = ap.parse_args(argv)
    LOWERINGS.use(args.device, args.problems)
    begin("Operator-variant benchmark", "monet_opt.bench_variants", args)
    if args.lossy:
        print("\nLossy families offered (`--lossy`).")
    for name in args.models.split(","):
        spec = SPECS[name]
        gpu = args.gpu_sizes or args.device == "cuda"
        size = zoo.size_argument(ap, args.size, (name,)) or (spec.gpu if gpu else spec.cpu)
        bench_model(name, args.solver, args.time_limit, sys.stdout, args.lossy, size,
                    args.lower_only)


if __name__ == "__main__":
    main()
