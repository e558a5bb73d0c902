"""Problems profiled earlier on this CPU (docs/benchmarks/problems_*.json.gz), for the scripts
here that measure solving alone, and their command line: a time limit and the problems to run."""
from __future__ import annotations

import argparse
import os

from monet_opt import bench_solvers as bs

PROBLEMS = {
    "unet": ("problems_unet.json.gz", "unet", {"base": 32, "batch": 4, "height": 128,
                                               "width": 128}),
    "resnet50": ("problems_cpu.json.gz", "resnet50", {"batch": 16, "size": 128}),
    "googlenet": ("problems_cpu.json.gz", "googlenet", {"batch": 32, "size": 128}),
    "bench_resnet50": ("problems_bench_resnet50.json.gz", "resnet50",
                       {"batch": 16, "size": 128}),
    "densenet121": ("problems_densenet121.json.gz", "densenet121", {"batch": 16, "size": 128}),
    "gpt2": ("problems_gpt2.json.gz", "gpt2", {"batch": 1, "seq": 256}),
}


def load(key: str):
    """(problem, floor, activations, store-all simulation) of a saved problem, as
    bench_solvers.lowered gives them."""
    file, name, size = PROBLEMS[key]
    bs.LOWERINGS.use("cpu", os.path.join(os.path.dirname(__file__), file))
    with open(os.devnull, "w") as quiet:
        return bs.lowered(name, quiet, size)


def arguments(description: str, solver: str, keys) -> argparse.Namespace:
    """--limit (the solver's time limit, default 30 s) and the problems, of `keys` (all by
    default)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--limit", type=float, default=30.0, help=f"{solver}'s time limit, s")
    ap.add_argument("models", nargs="*", help=f"of {', '.join(keys)} (default: all)")
    args = ap.parse_args()
    unknown = sorted(set(args.models) - set(keys))
    if unknown:
        ap.error(f"no problem named {', '.join(unknown)}; choose from {', '.join(keys)}")
    args.models = args.models or list(keys)
    return args
