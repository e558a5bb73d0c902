"""The training loop beyond one step (`make bench-replan`): ResNet-50 optimized for batch 16 at
half its activations, then an epoch's smaller last batch and a step that accumulates into
gradients already in place. Prints markdown: each step's measured peak against the limit and
the plan's prediction, and how long planning it took. Public API only, so the same script
measures an older checkout (as docs/benchmarks/replan.md's "before" did)."""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch

import monet_opt
from monet_opt.bench.allocator import keep_freed_memory
from monet_opt.units import format_bytes


def _measure(opt, model, x, loss_fn, accumulate: bool) -> tuple[int, float, float]:
    """(measured peak, seconds of the first call, median seconds of three more) of a step on
    x: the first call plans the situation if it is new, the second is measured."""
    times = []
    peak = 0
    for k in range(5):
        model.zero_grad(set_to_none=True)
        if accumulate:  # gradients in place, as after a micro-batch
            loss_fn(opt(x)).backward()
        start = time.perf_counter()
        if k == 1:
            peak = monet_opt.measure_peak(lambda: loss_fn(opt(x)).backward(),
                                          monet_opt.resident_tensors(model, x))
        else:
            loss_fn(opt(x)).backward()
        times.append(time.perf_counter() - start)
    return peak, times[0], statistics.median(times[2:])


def main(argv: list[str] | None = None) -> None:
    import torchvision

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--short", type=int, default=10, help="the smaller last batch")
    ap.add_argument("--size", type=int, default=128)
    args = ap.parse_args(argv)
    keep_freed_memory()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = torchvision.models.resnet50().train()
    x = torch.randn(args.batch, 3, args.size, args.size)
    short = torch.randn(args.short, 3, args.size, args.size)
    loss_fn = lambda out: out.float().mean()  # noqa: E731
    folder = tempfile.mkdtemp(prefix="monet-replan-")
    store_all = monet_opt.optimize(model, x, 1 << 40, profile_dir=folder).plan
    limit = store_all.fixed_bytes + store_all.gradient_bytes + \
        store_all.store_all_activation_bytes // 2
    start = time.perf_counter()
    opt = monet_opt.optimize(model, x, limit, profile_dir=folder)
    first_s = time.perf_counter() - start
    print(f"ResNet-50, batch {args.batch}x3x{args.size}x{args.size}, limit "
          f"{format_bytes(limit)} (half the store-all activations), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; optimize() took {first_s:.1f} s, predicted peak "
          f"{format_bytes(opt.plan.predicted_peak_bytes)}.\n")
    roomy = monet_opt.optimize(model, x, limit + store_all.gradient_bytes, profile_dir=folder)
    print("| step | limit | measured peak | over the limit | planned peak | "
          "first call, planning included (s) | step (s, median of 3) |")
    print("|---|---|---|---|---|---|---|")
    cases = [("eager, batch 16", model, x, False),
             ("eager, batch 16, gradients in place", model, x, True),
             ("batch 16", opt, x, False),
             (f"batch {args.short} (smaller last batch)", opt, short, False),
             ("batch 16, gradients in place (accumulating)", opt, x, True),
             ("batch 16, gradients in place, the limit raised by their bytes", roomy, x, True)]
    for name, module, batch, accumulate in cases:
        cap = module.plan.memory_limit_bytes if module is not model else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                peak, first, step = _measure(module, model, batch, loss_fn, accumulate)
            except monet_opt.MonetError as err:
                least = getattr(err, "min_feasible_bytes", None)
                print(f"| {name} | {format_bytes(cap)} | refused: {type(err).__name__}"
                      + (f" (least peak {format_bytes(least)})" if least else "")
                      + " | - | - | - | - |")
                continue
        if cap is None:
            print(f"| {name} | - | {format_bytes(peak)} | - | - | {first:.1f} | {step:.3f} |")
            continue
        # the plan of the step just run: the latest made (an older checkout has one plan)
        plan = list(getattr(module, "plans", {"": module.plan}).values())[-1]
        print(f"| {name} | {format_bytes(cap)} | {format_bytes(peak)} | "
              f"{format_bytes(max(0, peak - cap))} | {format_bytes(plan.predicted_peak_bytes)} "
              f"| {first:.1f} | {step:.3f} |")
        model.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
