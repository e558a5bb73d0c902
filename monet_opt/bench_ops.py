"""Where our executor's step time goes against eager's (`make bench-ops`): eager, our store-all
plan and a plan at a share of the activations, timed in interleaved rounds (seeded order), then
one torch.profiler pass each over three steps, summed per top-level ATen op (on CUDA, the
device time of the kernels each launched; eager with cudnn.benchmark on, as `monet-opt bench`
runs it). Prints markdown. This is how NOTE [Writing into a dying input] was found: our ReLUs
ran out of place."""
from __future__ import annotations

import argparse
import collections
import random
import re
import statistics
import tempfile
import time

import torch

import monet_opt
from monet_opt import zoo
from monet_opt.bench.allocator import keep_freed_memory
from monet_opt.bench.run import device_name, to_device
from monet_opt.bench.settings import git_commit


def _profiled(step, cuda: bool) -> tuple[dict[str, float], dict[str, int]]:
    """ATen op -> seconds per step and calls per step, over three profiled steps."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            step()
        if cuda:
            torch.cuda.synchronize()
    seconds: dict[str, float] = collections.Counter()
    calls: dict[str, int] = collections.Counter()
    for e in prof.events():
        parent = e.cpu_parent
        if e.name.startswith("aten::") and (parent is None or not parent.name.startswith("aten::")):
            seconds[e.name] += (e.device_time_total if cuda else e.cpu_time_total) / 1e6 / 3
            calls[e.name] += 1
    return seconds, {k: v // 3 for k, v in calls.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet50", choices=sorted(zoo.ALL_MODELS))
    ap.add_argument("--size", default="batch=32,size=160", help="the factory's arguments")
    ap.add_argument("--share", type=float, default=1 / 3, help="of the store-all activations")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--profile-dir", default=None,
                    help="where profiles and schedules are cached (default: a fresh folder)")
    args = ap.parse_args(argv)
    commit = git_commit()  # at the start: the code that ran, whatever is committed meanwhile
    cuda = args.device == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
        allocator = "CUDA's caching allocator"
    else:
        allocator = keep_freed_memory()
        torch.set_num_threads(2)
    torch.manual_seed(0)
    size = zoo.size_argument(ap, args.size, (args.model,))
    model, x = zoo.ALL_MODELS[args.model](**(size or {}))
    model, x = model.to(args.device).train(), to_device(x, args.device)
    folder = args.profile_dir or tempfile.mkdtemp(prefix="monet-ops-")
    full = monet_opt.optimize(model, x, 1 << 40, profile_dir=folder)
    p = full.plan
    limit = p.fixed_bytes + p.gradient_bytes + int(args.share * p.store_all_activation_bytes)
    part = monet_opt.optimize(model, x, limit, profile_dir=folder, time_limit_s=args.time_limit)
    call = (lambda m: m(**x)) if isinstance(x, dict) else (lambda m: m(x))
    methods = {"eager": model, "store-all": full, f"{args.share:.0%} of activations": part}

    def step(m):
        model.zero_grad(set_to_none=True)
        call(m).sum().backward()

    for m in methods.values():
        step(m)
        step(m)
    times = collections.defaultdict(list)
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(methods)
        rng.shuffle(order)
        for name in order:
            _sync(cuda)
            start = time.perf_counter()
            step(methods[name])
            _sync(cuda)
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(v) for name, v in times.items()}
    print(f"# {args.model} ({args.size}): our executor's time against eager's, op by op\n")
    print(f"`python -m monet_opt.bench_ops --model {args.model} --size {args.size} --share "
          f"{args.share:.3g} --rounds {args.rounds} --device {args.device}`; "
          f"{device_name(torch.device(args.device))}, torch {torch.__version__}, commit "
          f"{commit}, {allocator}.\n")
    print("| method | step s (median) | vs eager | predicted vs store-all | steps (s) |")
    print("|---|---|---|---|---|")
    for name, m in methods.items():
        plan = getattr(m, "plan", None)
        predicted = "-" if plan is None else \
            f"{plan.predicted_step_time_s / p.predicted_step_time_s - 1:+.1%}"
        print(f"| {name} | {median[name]:.3f} | {median[name] / median['eager'] - 1:+.1%} | "
              f"{predicted} | {' '.join(f'{t:.2f}' for t in times[name])} |")
    profiles = {name: _profiled(lambda m=m: step(m), cuda) for name, m in methods.items()}
    ops = collections.Counter()
    for seconds, _ in profiles.values():
        ops.update(seconds)
    shown = [op for op, _ in ops.most_common(args.top)]
    print(f"\nPer step under torch.profiler (one pass of three steps each; "
          f"{'device' if cuda else 'CPU'} ms, calls):\n")
    print("| ATen op | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    for op in shown:
        cells = [f"{profiles[n][0].get(op, 0) * 1e3:.1f} ({profiles[n][1].get(op, 0)})"
                 for n in methods]
        print(f"| {op[6:]} | " + " | ".join(cells) + " |")
    _predicted_against_measured({n: m for n, m in methods.items() if n != "eager"}, profiles,
                                args.top)


def _kind(name: str) -> str:
    """An op's kind from a graph node's name (`mm_3`) or a profiler event's (`aten::relu_`)."""
    return re.sub(r"_\d+$", "", name.removeprefix("aten::")).rstrip("_")


def _predicted_against_measured(methods: dict, profiles: dict, top: int) -> None:
    """Per kind of op, each plan's predicted time per step (its runs at their profiled
    times; recomputed runs apart) beside the time torch.profiler measured, so a kind the
    profile misprices shows. Kinds are matched by name: an op the executor runs under another
    ATen name than the graph's node (a split BatchNorm's rerun) shows on two rows."""
    predicted: dict[str, dict] = {}
    for name, m in methods.items():
        first, again = collections.Counter(), collections.Counter()
        for r in m.plan.rows:
            first[_kind(r.name)] += r.time_s
            again[_kind(r.name)] += r.recomputed * r.rerun_s
        predicted[name] = (first, again)
    measured = {name: collections.Counter() for name in methods}
    for name in methods:
        for op, seconds in profiles[name][0].items():
            measured[name][_kind(op)] += seconds
    kinds = collections.Counter()
    for name in methods:
        kinds.update(measured[name])
        kinds.update(predicted[name][0])
    print("\nPredicted (the plan's runs at their profiled times; of which recomputed) against "
          "measured (as above), per kind of op, ms per step:\n")
    print("| op kind | " + " | ".join(f"{n}: predicted (recomputed) | measured"
                                      for n in methods) + " |")
    print("|---|" + "---|---|" * len(methods))
    for kind, _ in kinds.most_common(top):
        cells = [f"{predicted[n][0][kind] * 1e3 + predicted[n][1][kind] * 1e3:.1f} "
                 f"({predicted[n][1][kind] * 1e3:.1f}) | {measured[n][kind] * 1e3:.1f}"
                 for n in methods]
        print(f"| {kind} | " + " | ".join(cells) + " |")


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
