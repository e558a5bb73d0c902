"""What the operating system sees: the resident-memory high-water mark (VmHWM) above the
process's size once the model is built, during the training steps (reset after optimize())
and during optimize() itself, for eager and for plans at 100 % of eager's peak and at the
least peak, each configuration in a fresh process, beside the plan's counted peak
(`measure_peak`). Run from the checkout's root: `python docs/benchmarks/rss.py [--models
resnet18,unet] [--steps 5]`, under each allocator setting to compare (MALLOC_ARENA_MAX=1
MALLOC_TRIM_THRESHOLD_=0, or LD_PRELOAD of jemalloc); it prints markdown rows."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

MiB = 2 ** 20


def build(name: str):
    """(model with its loss inside, input): ResNet-18 b32 112², or the zoo's U-Net b4 128²."""
    import torch
    torch.manual_seed(0)
    if name == "resnet18":
        import torchvision
        model, x = torchvision.models.resnet18(), torch.randn(32, 3, 112, 112)
    else:
        from monet_opt import zoo
        model, x = zoo.unet(batch=4, height=128, width=128, base=16)

    class WithMean(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(x).float().square().mean()
    return WithMean().train(), x


def status() -> dict[str, int]:
    with open("/proc/self/status") as f:
        rows = (line.split(":", 1) for line in f)
        return {k: int(v.split()[0]) * 1024 for k, v in rows if k in ("VmRSS", "VmHWM")}


def one(name: str, mode: str, steps: int, profile_dir: str) -> dict:
    """In this process: build, optimize (mode 'least': at the least peak), reset the
    high-water mark, run `steps` steps; what was held."""
    import monet_opt
    model, x = build(name)
    built = status()["VmRSS"]
    step, plan = model, None
    if mode != "eager":
        full = monet_opt.optimize(model, x, "100% of peak", profile_dir=profile_dir)
        step = full if mode == "full" else monet_opt.optimize(
            model, x, full.plan.min_feasible_bytes, profile_dir=profile_dir, time_limit_s=20)
        plan = step.plan
    planning = status()["VmHWM"] - built  # optimize()'s own: tracing, profiling
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here
    for _ in range(steps):
        step(x).backward()
        model.zero_grad(set_to_none=True)
    grown = status()["VmHWM"] - built
    counted = monet_opt.measure_peak(lambda: step(x).backward(),
                                     monet_opt.resident_tensors(model, x))
    return dict(model=name, mode=mode, optimize_rss=planning, step_rss=grown,
                counted=counted, predicted=plan and plan.predicted_peak_bytes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,unet")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # model mode profile_dir
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.steps, args.one[2])))
        return
    env = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_") or k == "LD_PRELOAD"}
    print(f"Allocator settings: {env or 'glibc defaults'}; torch threads "
          f"{os.environ.get('OMP_NUM_THREADS', 'default')}\n")
    print("| model | method | counted peak MiB | predicted MiB | RSS peak in the steps MiB "
          "| RSS peak in optimize() MiB |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as profiles:
        for name in args.models.split(","):
            for mode in ("eager", "full", "least"):
                out = subprocess.run([sys.executable, __file__, "--steps", str(args.steps),
                                      "--one", name, mode, profiles], capture_output=True,
                                     text=True, check=True).stdout.strip().splitlines()[-1]
                r = json.loads(out)
                predicted = f"{r['predicted'] / MiB:.1f}" if r["predicted"] else "-"
                print(f"| {name} | {mode} | {r['counted'] / MiB:.1f} | {predicted} | "
                      f"{r['step_rss'] / MiB:.1f} | {r['optimize_rss'] / MiB:.1f} |", flush=True)


if __name__ == "__main__":
    main()
