"""Solver benchmark: lower real models, then run every solver at limits leaving 70/50/40 % of
the store-all activation memory. Prints a markdown report (docs/benchmarks/solvers.md).

    python -m monet_opt.bench_solvers [--time-limit 60] [--models resnet50,gpt2]
                                      [--solvers milp,checkmate]
                                      [--size batch=64,size=160] [--least-only]
                                      [--near-floor REPEATS] [--bounds]
                                      [--problems F.json.gz]

--size: the models' factory arguments (zoo); --least-only: only the least peak "auto" reaches,
against the store-all peak and its activations (Kusumoto et al.'s measure); --near-floor N:
each solver N times at the least peak and 2/5/10/20 % above it (docs/benchmarks/near_floor.md);
--bounds: at half, a third and a quarter of the activations, the least overhead any schedule
can have (NOTE [The boundary bound]) beside auto's (docs/benchmarks/bounds.md).
"""
from __future__ import annotations

import argparse
import ast
import gzip
import inspect
import json
import math
import platform
import re
import sys
import time
from pathlib import Path

import torch
from torch.utils._pytree import tree_map_only

import monet_opt
import solvers
from monet_opt import zoo
from monet_opt.bench.allocator import keep_freed_memory
from solvers.bound import boundary_bound

FRACTIONS = (0.7, 0.5, 0.4)
SOLVERS = ("store_all", "chen_sqrt", "chen_greedy", "evict", "dp", "milp", "checkmate", "auto")


def mib(b: float) -> str:
    return f"{b / 2**20:,.1f}"


class Lowerings:
    """Where `lowered` gets its problems: lowered and profiled here, on `device`, or read from
    `path`, a gzipped JSON file that runs with the same path fill, so that profiling can happen
    on a GPU machine and the solving on another (`--device cuda --problems F` there,
    `--problems F` here)."""

    def __init__(self) -> None:
        self.device = "cpu"
        self.path: Path | None = None
        self.saved: dict[str, tuple] = {}

    def use(self, device: str, path: str | None) -> None:
        self.device, self.path = device, Path(path) if path else None
        if self.path is not None and self.path.exists():
            with gzip.open(self.path, "rt") as f:
                data = json.load(f)
            self.saved = {_canonical(k): (solvers.Problem.from_json(v["problem"]), v["lower_s"],
                                          v["where"])
                          for k, v in data["problems"].items()}

    def get(self, name: str, size: dict | None, options: dict):
        """(problem, seconds to lower it, where it was profiled). A file's problems are all
        profiled on one kind of device: one missing from a file of another device's is an
        error, not a profile made here and added to it."""
        key = f"{name} {sorted((size or {}).items())} {_describe(options)}"
        if key not in self.saved:
            here = "CPU" if self.device == "cpu" else "GPU"
            other = {w for _, _, w in self.saved.values() if w.startswith("CPU") != (here == "CPU")}
            if other:
                raise SystemExit(
                    f"{self.path} holds problems profiled on {sorted(other)[0]}, but not {key!r}; "
                    f"lowering it here ({here}) would mix devices in one file. Pass the device "
                    f"its problems came from (--device), or another --problems file. It holds: "
                    f"{sorted(self.saved)}")
            model, x = zoo.ALL_MODELS[name](**(size or {}))
            model = model.to(self.device)
            x = tree_map_only(torch.Tensor, lambda t: t.to(self.device), x)
            t0 = time.perf_counter()
            problem = monet_opt.lower_problem(model, x, profile_repeats=3, **options)
            where = torch.cuda.get_device_name() if self.device == "cuda" else "CPU"
            self.saved[key] = (problem, time.perf_counter() - t0,
                               f"{where}, torch {torch.__version__}")
            self._save()
        return self.saved[key]

    def _save(self) -> None:
        if self.path is None:
            return
        data = {"problems": {k: {"problem": p.to_json(), "lower_s": s, "where": w}
                             for k, (p, s, w) in self.saved.items()}}
        part = self.path.with_name(self.path.name + ".part")
        with gzip.open(part, "wt") as f:
            json.dump(data, f)
        part.replace(self.path)


LOWERINGS = Lowerings()


_DEFAULTS = {k: p.default for k, p in inspect.signature(monet_opt.lower_problem).parameters.items()
             if p.kind is p.KEYWORD_ONLY}


def _describe(options: dict) -> str:
    """The same text for the same options in any process (sets in sorted order, lower_problem's
    defaults left out, so that {} and {"allow_lossy": False} are one problem)."""
    return repr(sorted((k, sorted(v) if isinstance(v, (set, frozenset, list)) else v)
                       for k, v in options.items() if _DEFAULTS.get(k, ...) != v))


def _canonical(key: str) -> str:
    """A stored key as _describe writes it now (files written before it left defaults in)."""
    name, size, options = re.fullmatch(r"(\S+) (\[.*?\]) (\[.*\])", key).groups()
    return f"{name} {size} {_describe(dict(ast.literal_eval(options)))}"


def lowered(name: str, out, size: dict | None = None, label: str | None = None, **options):
    """Lower and profile a zoo model (`size`: its factory's arguments; `options` for
    lower_problem), or take it from LOWERINGS; print its sizes under a heading (`label`: what
    the options are, if not every variant). (problem, floor, activations, store-all
    simulation): floor = parameters, inputs and gradients."""
    problem, lower_s, where = LOWERINGS.get(name, size, options)
    store_all = solvers.simulate(problem, solvers.schedule_from_kept(
        problem, problem.saved_for_backward))
    grads = sum(problem.tensors[t].bytes for t in problem.backward_outputs)
    floor = problem.fixed_bytes + grads
    act = store_all.peak_bytes - floor
    args = ", ".join(f"{k}={v}" for k, v in (size or {}).items())
    variants = f", {label}" if label else "" if options.get("variants", True) \
        else ", variants off"
    print(f"\n### {name}({args}){variants}\n\n{len(problem.forward_ops)} forward ops, "
          f"{len(problem.backward_ops)} backward ops, {len(problem.tensors)} tensors (lowered "
          f"and profiled in {lower_s:.0f} s on {where}). Store-all peak "
          f"{mib(store_all.peak_bytes)} MiB = "
          f"{mib(floor)} MiB parameters, inputs and gradients + {mib(act)} MiB activations; "
          f"step {store_all.time_s * 1e3:.0f} ms"
          " (sum of profiled op times).\n", file=out)
    return problem, floor, act, store_all


def least_only(name: str, time_limit_s: float, out, size: dict | None = None) -> None:
    """The least peak "auto" reaches (its min_feasible_bytes), against store-all's."""
    problem, floor, act, store_all = lowered(name, out, size)
    r = solvers.solve(problem, floor, "auto", time_limit_s=time_limit_s)
    least, peak = r.min_feasible_bytes, store_all.peak_bytes
    print(f"Least peak {mib(least)} MiB of a {mib(peak)} MiB store-all peak: "
          f"{least / peak - 1:+.1%} of the peak, {(least - floor) / act - 1:+.1%} of the "
          f"activations (the floor is {floor / peak:.1%} of the peak; found in "
          f"{r.solve_time_s:.0f} s).", file=out, flush=True)


NEAR_FLOOR = (0.0, 0.02, 0.05, 0.1, 0.2)  # budgets above the least peak, as its share


def near_floor(name: str, time_limit_s: float, out, names=("auto",), size: dict | None = None,
               repeats: int = 2, above: tuple[float, ...] = NEAR_FLOOR) -> None:
    """Each solver `repeats` times at the least peak "auto" reaches and a little above it
    (`above`: shares of it), the least peak known to every solve as an earlier call's (NOTE
    [Least peaks remembered]): how far the predicted step time moves from solve to solve
    there."""
    problem, floor, _act, store_all = lowered(name, out, size)
    # at a budget nothing fits: the least-peak program's whole time (NOTE [The least peak
    # where store-all fits] in solvers/least.py)
    first = solvers.solve(problem, floor, "auto", time_limit_s=time_limit_s)
    least = first.min_feasible_bytes
    known = [first.floor_schedule] if first.floor_schedule is not None else []
    print(f"Least peak {mib(least)} MiB. Predicted overhead vs store-all of each solve "
          f"({repeats} per cell):\n\n| solver | " +
          " | ".join(f"least +{e * 100:g}%" if e else "least" for e in above) +
          " |\n|---|" + "---|" * len(above), file=out, flush=True)
    for s in names:
        cells = []
        for extra in above:
            runs = [solvers.solve(problem, int(least * (1 + extra)), s,
                                  time_limit_s=time_limit_s, known=known)
                    for _ in range(repeats)]
            cells.append(", ".join(f"{r.objective_s / store_all.time_s - 1:+.1%}" if r.feasible
                                   else r.status.value for r in runs))
        print(f"| {s} | " + " | ".join(cells) + " |", file=out, flush=True)


# Activation shares the bound is taken at (--bounds): halved, MONeT's regime (3x less), a quarter.
BOUND_SHARES = (0.5, 1 / 3, 0.25)


def bounds(name: str, time_limit_s: float, out, size: dict | None = None,
           shares: tuple[float, ...] = BOUND_SHARES) -> None:
    """At budgets leaving `shares` of the store-all activations: NOTE [The boundary bound]
    (the least step time any schedule of this problem can have there, with its ops and variants
    at their profiled costs, or HiGHS's dual bound of it where `time_limit_s` ran out), beside
    what "auto" finds in as long, and the bound auto proved on its way (NOTE [Cuts where the
    schedule goes over] in solvers/lazy_cuts.py). Where the higher bound's overhead exceeds a
    target, no schedule meets it on this profile, whatever the solver."""
    problem, floor, act, store_all = lowered(name, out, size)
    print("| limit (activations left) | bound: overhead at least | auto: overhead "
          "| auto's own bound | auto above the higher bound | bound time |\n"
          "|---|---|---|---|---|---|", file=out, flush=True)
    for share in shares:
        budget = floor + int(share * act)
        start = time.perf_counter()
        bound = boundary_bound(problem, budget, time_limit_s)
        spent = time.perf_counter() - start
        r = solvers.solve(problem, budget, "auto", time_limit_s=time_limit_s)
        over = "infeasible" if bound == math.inf else "none proved" if bound is None else \
            f"{bound / store_all.time_s - 1:+.1%}"
        found = f"{r.objective_s / store_all.time_s - 1:+.1%}" if r.feasible else r.status.value
        own = f"{r.bound_s / store_all.time_s - 1:+.1%}" if r.bound_s is not None else "-"
        higher = max(b for b in (bound, r.bound_s, 0.0) if b is not None)
        gap = f"{r.objective_s / higher - 1:.1%}" if r.feasible and higher else "-"
        print(f"| {mib(budget)} MiB ({share:.0%}) | {over} | {found} | {own} | {gap} "
              f"| {spent:.0f} s |", file=out, flush=True)


def bench_model(name: str, time_limit_s: float, out, names=SOLVERS,
                size: dict | None = None) -> None:
    problem, floor, act, store_all = lowered(name, out, size)
    print("| limit (activations left) | solver | status | predicted step | overhead | bound "
          "| gap | solve time | least peak (MiB) | note |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    for frac in FRACTIONS:
        budget = floor + int(frac * act)
        for s in names:
            r = solvers.solve(problem, budget, s, time_limit_s=time_limit_s)
            ok = r.feasible
            step = f"{r.objective_s * 1e3:.0f} ms" if ok else "-"
            over = f"{r.objective_s / store_all.time_s - 1:+.1%}" if ok else "-"
            bound = f"{r.bound_s * 1e3:.0f} ms" if r.bound_s is not None else "-"
            gap = f"{r.gap:.1%}" if r.gap is not None else "-"
            print(f"| {mib(budget)} MiB ({frac:.0%}) | {s} | {r.status.value} | {step} | {over} "
                  f"| {bound} | {gap} | {r.solve_time_s:.1f} s | {mib(r.min_feasible_bytes)} "
                  f"| {r.note} |", file=out, flush=True)


def begin(title: str, module: str, args) -> None:
    """Set the process up for measuring (every thread; freed memory kept, NOTE [CPU
    allocator], so profiled times are steady) and print the report's header."""
    torch.set_num_threads(max(1, torch.get_num_threads()))
    allocator = keep_freed_memory()
    machine = platform.processor() or platform.machine()
    least = getattr(args, "least_only", False)
    chosen = "".join(f" --{k} {getattr(args, k)}" for k in ("solvers", "solver", "size")
                     if getattr(args, k, None) and not (least and k == "solvers"))
    chosen += " --gpu-sizes" if getattr(args, "gpu_sizes", False) else ""
    chosen += " --least-only" if least else ""
    chosen += " --bounds" if getattr(args, "bounds", False) else ""
    repeats = getattr(args, "near_floor", 0)
    chosen += f" --near-floor {repeats}" if repeats else ""
    chosen += f" --above {args.above}" if getattr(args, "above", None) else ""
    chosen += " --lossy" if getattr(args, "lossy", False) else ""
    chosen += f" --device {args.device}" if getattr(args, "device", "cpu") != "cpu" else ""
    chosen += f" --problems {args.problems}" if getattr(args, "problems", None) else ""
    print(f"# {title}\n\nCommand: `python -m {module} --time-limit "
          f"{args.time_limit:g} --models {args.models}{chosen}`. Solved on: {machine}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, {allocator}; each "
          f"model says where it was profiled. Limits include parameters, inputs and "
          f"gradients; the percentage is the share of store-all activation memory left. "
          f"Overhead is predicted step time vs store-all (profiled op times; on CPU the "
          f"simulator's peak equals the executor's measured peak to the byte in "
          f"tests/test_executor.py).", flush=True)


def add_lowering_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where models are lowered and profiled")
    ap.add_argument("--problems", help="a .json.gz file of lowered problems: those in it are "
                                       "read instead of lowered, new ones are added to it")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--models", default=",".join(zoo.MODELS))
    ap.add_argument("--solvers", help=f"default: {','.join(SOLVERS)} (--near-floor: auto)")
    ap.add_argument("--size", default="", help="factory arguments, e.g. batch=64,size=160")
    ap.add_argument("--least-only", action="store_true")
    ap.add_argument("--bounds", action="store_true",
                    help="the least overhead any schedule can have at 50/33/25 %% of the "
                         "activations (NOTE [The boundary bound]), beside auto's")
    ap.add_argument("--near-floor", type=int, metavar="REPEATS", default=0,
                    help="solve at the least peak and a little above it, REPEATS times each "
                         "(--solvers: default auto)")
    ap.add_argument("--above", help="with --near-floor: the budgets as shares above the least "
                                    f"peak (default {','.join(f'{e:g}' for e in NEAR_FLOOR)})")
    add_lowering_arguments(ap)
    args = ap.parse_args(argv)
    if args.near_floor < 0:
        ap.error(f"--near-floor: the solves per budget must be at least 1, got {args.near_floor}")
    try:
        above = tuple(float(e) for e in args.above.split(",")) if args.above else NEAR_FLOOR
    except ValueError:
        ap.error(f"--above: shares above the least peak, e.g. 0,0.02,0.05; got {args.above!r}")
    if any(e < 0 for e in above):
        ap.error(f"--above: the budgets must be at or above the least peak, got {args.above}")
    size = zoo.size_argument(ap, args.size, tuple(args.models.split(",")))
    chosen = args.solvers.split(",") if args.solvers else None
    LOWERINGS.use(args.device, args.problems)
    begin("Solver benchmark", "monet_opt.bench_solvers", args)
    for name in args.models.split(","):
        if args.least_only:
            least_only(name, args.time_limit, sys.stdout, size)
        elif args.bounds:
            bounds(name, args.time_limit, sys.stdout, size)
        elif args.near_floor:
            near_floor(name, args.time_limit, sys.stdout, chosen or ("auto",), size,
                       args.near_floor, above)
        else:
            bench_model(name, args.time_limit, sys.stdout, chosen or SOLVERS, size)


if __name__ == "__main__":
    main()
