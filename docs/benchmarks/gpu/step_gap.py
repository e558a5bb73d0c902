"""Where our store-all step loses time against eager: step time, the host's time to issue a
step, and the kernels' time, for eager and for our plan at eager's peak in five builds (as
shipped; convolution backwards not split, NOTE [Conv backward split]; no variants; BatchNorm
statistics updated functionally, as before NOTE [Statistics updated in place]; ops called
through OpOverload and detaches kept, as before NOTE [Direct calls]).

Why (2026-11-28, gpu/README.md, fifth lease): on an H200, DenseNet-121 (batch 128, 224x224)
took 0.103 s a step under our store-all plan where eager took 0.084 s (+23.6 %), while the other
seven bench models were within -0.5 to +2.9 % of eager. Suspects: the split convolution
backwards (on an H100 the halves took 35.4 ms where ResNet-50's combined calls took 31.5 ms),
the host falling behind the GPU on DenseNet's many small kernels (1,575 ops; the wrapper alone
takes 2.6 ms a call on the 2-core CPU machine), the clones and copies around cuDNN's BatchNorm
(NOTE [cuDNN's BatchNorm], now updated in place: NOTE [Statistics updated in place]). Kernels'
time beside host time tells which.

    python docs/benchmarks/gpu/step_gap.py                        # on a GPU: DenseNet-121 b128
    python docs/benchmarks/gpu/step_gap.py --model resnet50 --batch 184
    python docs/benchmarks/gpu/step_gap.py --device cpu --batch 2 --size 64 --rounds 2  # a dry run
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings

import torch

import monet_opt
from monet_opt import conv_split, direct_calls, stats_in_place, zoo

BUILDS = ("as shipped", "no conv split", "no variants", "stats functional", "no direct calls")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _step(model, x) -> None:
    model(x).float().sum().backward()
    for p in model.parameters():
        p.grad = None


@contextlib.contextmanager
def _split_on(devices: frozenset[str]):
    saved = conv_split.SPLIT_DEVICES
    conv_split.SPLIT_DEVICES = devices
    try:
        yield
    finally:
        conv_split.SPLIT_DEVICES = saved


def _build(name: str, model, x, time_limit: float):
    saved = stats_in_place.mark, direct_calls.DirectCodeGen, direct_calls.drop_detaches
    if name == "stats functional":
        stats_in_place.mark = lambda joint: 0
    if name == "no direct calls":
        direct_calls.DirectCodeGen = torch.fx.graph._BoxedCodeGen  # FX's own codegen
        direct_calls.drop_detaches = lambda gm: 0
    try:
        with _split_on(frozenset() if name == "no conv split" else conv_split.SPLIT_DEVICES):
            return monet_opt.optimize(model, x, 1 << 45, time_limit_s=time_limit,
                                      profile_dir=None, variants=name != "no variants")
    finally:
        stats_in_place.mark, direct_calls.DirectCodeGen, direct_calls.drop_detaches = saved


def _grads(model, x) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model(x).float().sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return grads


def _kernels(step, device: torch.device, steps: int = 3) -> dict[str, tuple[float, int]]:
    """Kernel name -> (microseconds a step, launches a step) on the GPU."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    out = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.key] = (e.self_device_time_total / steps, e.count / steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="densenet121")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5, help="steps per round")
    ap.add_argument("--time-limit", type=float, default=5.0)
    ap.add_argument("--builds", default=",".join(BUILDS), help="of: " + ", ".join(BUILDS))
    args = ap.parse_args()
    builds = args.builds.split(",")
    if not set(builds) <= set(BUILDS):
        ap.error(f"--builds: {sorted(set(builds) - set(BUILDS))} not among {BUILDS}")
    warnings.simplefilter("ignore")
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    model, x = getattr(zoo, args.model)(args.batch, args.size)
    model, x = model.to(device), x.to(device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{args.model} b{args.batch} {args.size}x{args.size} on {name}, torch "
          f"{torch.__version__}, cudnn.benchmark", flush=True)
    want = _grads(model, x)
    methods = {"eager": model}
    for build in builds:
        t0 = time.perf_counter()
        methods[build] = _build(build, model, x, args.time_limit)
        got = _grads(methods[build], x)
        diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                   for a, b in zip(got, want))
        print(f"  built {build}: {time.perf_counter() - t0:.1f} s, grads vs eager max rel "
              f"{diff:.1e}", flush=True)
    for m in methods.values():
        for _ in range(3):
            _step(m, x)
    wall = {k: [] for k in methods}
    host = {k: [] for k in methods}
    for _ in range(args.rounds):
        for k, m in methods.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                _step(m, x)
            issued = time.perf_counter()
            _sync(device)
            done = time.perf_counter()
            wall[k].append((done - t0) / args.steps)
            host[k].append((issued - t0) / args.steps)
    base = statistics.median(wall["eager"])
    kernels = {k: _kernels(lambda m=m: _step(m, x), device) for k, m in methods.items()} \
        if device.type == "cuda" else {}
    print(f"{'method':15s} {'step ms':>8s} {'vs eager':>9s} {'host ms':>8s} {'kernels ms':>11s} "
          f"{'launches':>9s}")
    for k in methods:
        w, h = statistics.median(wall[k]), statistics.median(host[k])
        ks = kernels.get(k, {})
        kt = sum(t for t, _ in ks.values()) / 1e3
        kn = sum(n for _, n in ks.values())
        print(f"{k:15s} {w * 1e3:8.2f} {(w / base - 1) * 100:+8.1f}% {h * 1e3:8.2f} "
              f"{kt:11.2f} {kn:9.0f}")
    if kernels:
        for k in builds:
            diffs = {n: kernels[k].get(n, (0, 0))[0] - kernels["eager"].get(n, (0, 0))[0]
                     for n in set(kernels[k]) | set(kernels["eager"])}
            print(f"kernels, {k} minus eager (us a step; launches ours/eager):")
            for n in sorted(diffs, key=lambda n: -abs(diffs[n]))[:10]:
                print(f"  {diffs[n]:+9.1f}  {kernels[k].get(n, (0, 0))[1]:4.0f}/"
                      f"{kernels['eager'].get(n, (0, 0))[1]:4.0f}  {n[:90]}")


if __name__ == "__main__":
    main()
