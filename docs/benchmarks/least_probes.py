"""The least peak "auto" reports where nothing fits, without and with probes of the least-peak
program's budgets in the time it has left (docs/benchmarks/least_probes.md; NOTE [Probes under
the least peak] in solvers/probes.py).

    python docs/benchmarks/least_probes.py [--limit 30] [--e2e]

Each saved problem (docs/benchmarks/problems_chains.json.gz, problems_cpu.json.gz) is asked for
1 byte, read afresh for every run (a problem keeps its rematerializing search between solves)
with the least-peak program's cache cleared. --e2e: make bench's U-Net profiled, its least peak
asked for through optimize(), then a plan at it measured against its prediction.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # PYTHONPATH first: a worktree

from solvers import least, remat, solve  # noqa: E402
from solvers import registry  # noqa: E402
from solvers.milp import MilpOptions, build_stages  # noqa: E402
from solvers.probes import relaxation_bound  # noqa: E402
from solvers.problem import Problem  # noqa: E402

HERE = Path(__file__).resolve().parent


def saved() -> dict[str, str]:
    out = {}
    for name in ("problems_chains.json.gz", "problems_cpu.json.gz"):
        with gzip.open(HERE / name, "rt") as f:
            out.update({k.split(" ")[0]: v["problem"]
                        for k, v in json.load(f)["problems"].items()})
    return out


def relaxed(p: Problem) -> int:
    options = MilpOptions()
    stages = build_stages(p, options.max_recompute_vars, options.max_held_vars)
    return relaxation_bound(stages, time.perf_counter() + 60.0)


def asked(text: str, limit: float, probes: bool) -> tuple[int, float]:
    least.cache_clear()
    original = registry.probes.least_until
    if not probes:
        registry.probes.least_until = remat.least_until
    try:
        start = time.perf_counter()
        res = solve(Problem.from_json(text), 1, "auto", time_limit_s=limit)
        return res.min_feasible_bytes, time.perf_counter() - start
    finally:
        registry.probes.least_until = original


def solver_table(limit: float) -> None:
    print(f"auto asked for 1 B, {limit:g} s; least peak reported, B (time taken)\n")
    print("| problem | ops | relaxation's bound | without probes | with probes | change |")
    print("|---|---|---|---|---|---|")
    for name, text in saved().items():
        p = Problem.from_json(text)
        bound = relaxed(p)
        (before, t0), (after, t1) = asked(text, limit, False), asked(text, limit, True)
        print(f"| {name} | {len(p.ops)} | {bound:,.0f} | {before:,} ({t0:.1f} s) | "
              f"{after:,} ({t1:.1f} s) | {(after - before) / before:+.2%} |", flush=True)


def e2e(limit: float) -> None:
    import copy

    import torch

    import monet_opt
    from monet_opt.bench.models import _specs
    from monet_opt.errors import InfeasibleBudgetError

    torch.set_num_threads(2)
    model, x, what = _specs()["unet"].build("cpu")
    try:
        monet_opt.optimize(copy.deepcopy(model), x, 1, profile_dir=None, time_limit_s=limit)
        raise SystemExit("a 1-byte limit fitted")
    except InfeasibleBudgetError as exc:
        floor = exc.min_feasible_bytes
    opt = monet_opt.optimize(copy.deepcopy(model), x, floor, profile_dir=None,
                             time_limit_s=limit)
    plan = opt.plan
    resident = monet_opt.resident_tensors(opt.model, x)
    measured = monet_opt.measure_peak(lambda: opt(x).sum().backward(), resident)
    print(f"\n{what}: least peak {floor:,} B; the plan there ({plan.solver}) predicted "
          f"{plan.predicted_peak_bytes:,} B at "
          f"{plan.predicted_step_time_s / plan.store_all_step_time_s - 1:+.1%}, measured "
          f"{measured:,} B ({measured - plan.predicted_peak_bytes:+,})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=float, default=30.0)
    parser.add_argument("--e2e", action="store_true")
    args = parser.parse_args()
    solver_table(args.limit)
    if args.e2e:
        e2e(args.limit)
