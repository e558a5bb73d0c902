"""What optimize()'s profiling pass holds, with and without the limit in bytes (NOTE [Profiling
within the limit] in monet_opt/profile_memory.py): for each limit, the profiling pass's peak
(measure_peak over the whole profile: the untimed pass, the timed one, variants; on the CPU the
allocator's events, kernels' scratch included, NOTE [Allocation events]),
how many values it made again, how long it took, and the plan the solver then made.

    PYTHONPATH=. python docs/benchmarks/profile_memory.py [--model resnet50] [--batch 16]
    PYTHONPATH=. python docs/benchmarks/profile_memory.py --model gpt2_narrow --batch 12
        --size 256   (--size: tokens per sample)
"""
from __future__ import annotations

import argparse
import copy
import inspect
import time
import warnings

import torch

import monet_opt
from monet_opt import api, profiler, zoo

MIB = 2**20


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=128, help="image side, or tokens per sample")
    p.add_argument("--shares", default="0.5,0.33,0.2")
    args = p.parse_args()
    # the CPU cache flush before a recomputation's timed calls: one 64 MiB buffer, whatever the
    # limit (NOTE [Recomputation reads a cold input]); left out so the pass's own memory shows
    profiler.FLUSH_BYTES = 4096
    seen: list[tuple[int, int, float]] = []
    profile = api.profile

    def counted(joint, lowered, primals, *rest):
        start = time.perf_counter()
        got = []
        peak = monet_opt.measure_peak(lambda: got.append(profile(joint, lowered, primals, *rest)),
                                      primals)
        seen.append((peak, got[0].made_again, time.perf_counter() - start))
        return got[0]

    api.profile = counted
    factory = zoo.ALL_MODELS[args.model]
    side = "seq" if "seq" in inspect.signature(factory).parameters else "size"
    model, x = factory(batch=args.batch, **{side: args.size})
    warnings.simplefilter("ignore")
    base = monet_opt.optimize(copy.deepcopy(model), x, "100% of activations",
                              profile_dir=None).plan
    floor = base.fixed_bytes + base.gradient_bytes
    shape = f"{args.size} tokens" if side == "seq" else f"{args.size}x{args.size}"
    print(f"{args.model}, batch {args.batch}, {shape}, torch "
          f"{torch.__version__}, CPU, {torch.get_num_threads()} threads. Store-all peak "
          f"{base.store_all_peak_bytes / MIB:.1f} MiB (parameters, buffers, input and gradients "
          f"{floor / MIB:.1f} MiB), least reachable {base.min_feasible_bytes / MIB:.1f} MiB.\n")
    print("| limit | profiling peak MiB | made again | profiling s | plan | predicted overhead |")
    print("|---|---|---|---|---|---|")
    peak, made, secs = seen[-1]
    print(f"| a share (no bound) | {peak / MIB:.1f} | {made} | {secs:.1f} | store-all | "
          f"{base.predicted_overhead:+.1%} |")
    for share in (float(s) for s in args.shares.split(",")):
        limit = max(floor + int(share * base.store_all_activation_bytes),
                    base.min_feasible_bytes)
        try:
            plan = monet_opt.optimize(copy.deepcopy(model), x, limit, profile_dir=None).plan
            outcome = f"{plan.predicted_peak_bytes / MIB:.1f} MiB | {plan.predicted_overhead:+.1%}"
        except monet_opt.InfeasibleBudgetError as exc:
            outcome = f"infeasible (least {exc.min_feasible_bytes / MIB:.1f} MiB) | -"
        peak, made, secs = seen[-1]
        print(f"| {limit / MIB:.1f} MiB ({share:.0%} of activations) | {peak / MIB:.1f} | "
              f"{made} | {secs:.1f} | {outcome} |")


if __name__ == "__main__":
    main()
