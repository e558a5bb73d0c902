"""How "auto" shares its time (solvers/registry.py's AUTO_* constants), tried on the kept
problems: auto as it is and with constants overridden, each at a half, a third and a quarter
of the problem's activations. Run from the checkout's root:
`python docs/benchmarks/auto_shares.py [--time-limit 30] [--models googlenet,resnet50]
[--try AUTO_ANNEAL_SHARE=0.15 --try AUTO_REMAT_MARGIN=0.05,AUTO_FINE_SHARE=0.4]`; it prints
markdown, a column per setting: predicted overhead over store-all (the simulator's step time),
the seconds auto took and the gap it reported, "-" where no plan fits, and the sum of each
column's overheads over the cells where every setting fits."""
from __future__ import annotations

import math

import solvers
from solvers import registry
# docs/benchmarks/remat.py: a kept problem by model and file, the scripts' arguments
from remat import arguments, problem

CASES = (("googlenet", "cpu", (0.5, 1 / 3, 0.25)), ("resnet50", "cpu", (1 / 3, 0.25)),
         ("resnet50", "h200", (1 / 3, 0.25)), ("densenet121", "h200b", (0.5, 1 / 3, 0.25)),
         ("bert_base", "h200b", (1 / 3,)))


def settings(tried: list[str]) -> list[dict[str, float]]:
    """auto as it is, then each --try: NAME=VALUE[,NAME=VALUE...] of registry's constants."""
    out: list[dict[str, float]] = [{}]
    for spec in tried:
        setting = {}
        for pair in spec.split(","):
            name, _, value = pair.partition("=")
            if not hasattr(registry, name) or not value:
                raise SystemExit(f"--try {spec!r}: want NAME=VALUE with NAME one of "
                                 "solvers/registry.py's constants (e.g. AUTO_FINE_SHARE=0.4)")
            setting[name] = float(value)
        out.append(setting)
    return out


def solved(name: str, where: str, budget: int, setting: dict[str, float], limit: float
           ) -> tuple[float, str]:
    """auto's predicted overhead with `setting`, on the problem loaded afresh (a solve leaves
    what it found with the problem, NOTE [Heuristics in their time], for a later one), and its
    cell: that overhead, the seconds auto took and the gap it reported."""
    p, _ = problem(name, where)
    kept = {constant: getattr(registry, constant) for constant in setting}
    try:
        for constant, value in setting.items():
            setattr(registry, constant, value)
        r = solvers.solve(p, budget, "auto", time_limit_s=limit)
    finally:
        for constant, value in kept.items():
            setattr(registry, constant, value)
    if not r.feasible:
        return math.nan, "-"
    over = r.objective_s / p.no_recompute_time_s - 1
    return over, f"{over:+.2%} ({r.solve_time_s:.0f} s, gap {r.gap:.1%})"


def main() -> None:
    args, chosen = arguments("auto_shares.py", 30.0, [(m, w) for m, w, _ in CASES], "try")
    tried = settings(args.repeated)
    names = ["as is"] + [", ".join(f"{k}={v:g}" for k, v in s.items()) for s in tried[1:]]
    print("| problem | activations left | MiB | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    sums = [0.0] * len(tried)
    for name, where, shares in CASES:
        if name not in chosen:
            continue
        p, key = problem(name, where)
        floor = p.fixed_bytes + sum(p.tensors[t].bytes for t in p.backward_outputs)
        act = solvers.solve(p, 1 << 62, "store_all").peak_bytes - floor
        for share in shares:
            budget = floor + int(act * share)
            got = [solved(name, where, budget, s, args.time_limit) for s in tried]
            if not any(math.isnan(g) for g, _ in got):
                sums = [a + g for a, (g, _) in zip(sums, got)]
            cells = " | ".join(cell for _, cell in got)
            print(f"| {key} | {share:.0%} | {budget / 2**20:,.1f} | {cells} |", flush=True)
    print("| sum | | | " + " | ".join(f"{s:+.2%}" for s in sums) + " |")


if __name__ == "__main__":
    main()
