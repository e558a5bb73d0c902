"""What capping cuDNN's convolution workspace buys on the bench's U-Net (batch 11, 416x608, base
64) on CUDA: eager's peak and step time, the workspace of the convolution every plan peaks at,
the least peak our plans reach, and how far the gradients move from the uncapped run's.

Why (2026-11-27, gpu/README.md, fourth lease): on an H200 every U-Net plan peaked at the input
step of the last decoder convolution (128 -> 64 channels at full resolution), 1.99 GiB of cuDNN
workspace beside 2,038 MiB of inputs: under cudnn.benchmark the fastest algorithms of the largest
convolutions take about their input's size, and that workspace set the least peak (5,585 MiB,
48 % of eager's). PyTorch reads CUDNN_CONV_WSCAP_DBG (MiB) as a cap on that workspace, so
cuDNN then picks among the algorithms that fit; they are not bitwise the uncapped ones, so a
plan that used the cap would be a lossy choice (allow_lossy). Each cap runs in a child process of
its own (the variable is read by cuDNN's algorithm search, whose choices are cached per process).
Needs a GPU; run from the checkout's root (next_run.sh's second call).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

MiB = 2 ** 20
SIZE = dict(batch=11, height=416, width=608, base=64)


def _sync_peak_reset() -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _step(model, x) -> None:
    torch.manual_seed(0)
    model(x).float().square().mean().backward()


def _conv_workspace(model, x) -> dict[str, float]:
    """The last decoder's first convolution alone at the step's sizes: memory above its inputs
    and results while it runs forward and backward, and its time (ms)."""
    conv = model.merge[-1][0]
    base = SIZE["base"]
    inp = torch.randn(x.shape[0], 2 * base, *x.shape[2:], device="cuda", requires_grad=True)
    out = conv(inp)  # the algorithm search, outside the measurement
    out.backward(torch.ones_like(out))
    conv.zero_grad(set_to_none=True)
    inp.grad = None
    del out
    before = _sync_peak_reset()
    t0 = time.perf_counter()
    out = conv(inp)
    torch.cuda.synchronize()
    fwd_ms = (time.perf_counter() - t0) * 1e3
    fwd = torch.cuda.max_memory_allocated() - before - out.numel() * out.element_size()
    seed = torch.ones_like(out)
    before = _sync_peak_reset()
    t0 = time.perf_counter()
    out.backward(seed)
    torch.cuda.synchronize()
    bwd_ms = (time.perf_counter() - t0) * 1e3
    grads = inp.numel() * inp.element_size() + sum(
        p.numel() * p.element_size() for p in conv.parameters())
    bwd = torch.cuda.max_memory_allocated() - before - grads
    return {"fwd_extra_mib": fwd / MiB, "fwd_ms": fwd_ms,
            "bwd_extra_mib": bwd / MiB, "bwd_ms": bwd_ms}


def child(grads_path: str, least: bool, time_limit: float) -> None:
    from monet_opt import zoo
    torch.backends.cudnn.benchmark = True
    model, x = zoo.unet(**SIZE)
    model, x = model.cuda(), x.cuda()
    _step(model, x)  # cuDNN's algorithm search
    model.zero_grad(set_to_none=True)
    times, peak = [], 0
    for _ in range(3):
        before = _sync_peak_reset()
        t0 = time.perf_counter()
        _step(model, x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated()
        if len(times) < 3:
            model.zero_grad(set_to_none=True)
    torch.save([p.grad.cpu() for p in model.parameters()], grads_path)
    model.zero_grad(set_to_none=True)
    row = {"cap": os.environ.get("CUDNN_CONV_WSCAP_DBG", "none"),
           "eager_peak_mib": peak / MiB, "before_step_mib": before / MiB,
           "eager_step_s": statistics.median(times), **_conv_workspace(model, x)}
    if least:
        import monet_opt
        from monet_opt.errors import InfeasibleBudgetError
        t0 = time.perf_counter()
        try:
            monet_opt.optimize(model, x, "1MiB", time_limit_s=time_limit, profile_dir=None)
        except InfeasibleBudgetError as e:
            row["least_peak_mib"] = e.min_feasible_bytes / MiB
        row["least_s"] = time.perf_counter() - t0
    print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caps", default="none,1024,256,64", help="MiB; 'none': no cap")
    ap.add_argument("--least", action="store_true",
                    help="also our least peak under each cap (profiles and solves: minutes)")
    ap.add_argument("--time-limit", type=float, default=12.0, help="the least-peak solve's")
    ap.add_argument("--child", metavar="GRADS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.least, args.time_limit)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}; U-Net {SIZE}, float32, cudnn.benchmark")
    first = None
    for cap in args.caps.split(","):
        env = dict(os.environ)
        env.pop("CUDNN_CONV_WSCAP_DBG", None)
        if cap != "none":
            env["CUDNN_CONV_WSCAP_DBG"] = cap
        path = f"/tmp/wscap_{cap}.pt"
        cmd = [sys.executable, __file__, "--child", path, "--time-limit", str(args.time_limit)]
        done = subprocess.run(cmd + (["--least"] if args.least else []), env=env,
                              capture_output=True, text=True)
        rows = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if done.returncode or not rows:
            print(f"cap {cap}: failed ({done.returncode}): {done.stderr[-600:]}")
            continue
        row = json.loads(rows[-1])
        grads = torch.load(path)
        first = first or grads
        diff = max(((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item()
                   for a, b in zip(first, grads))
        same = all(torch.equal(a, b) for a, b in zip(first, grads))
        print(f"cap {cap:>5} MiB: eager peak {row['eager_peak_mib']:,.0f} MiB, step "
              f"{row['eager_step_s'] * 1e3:.1f} ms; last decoder conv: forward +"
              f"{row['fwd_extra_mib']:,.0f} MiB {row['fwd_ms']:.2f} ms, backward +"
              f"{row['bwd_extra_mib']:,.0f} MiB {row['bwd_ms']:.2f} ms; grads vs the first "
              f"cap: {'bitwise' if same else f'max rel {diff:.2e}'}"
              + (f"; our least peak {row.get('least_peak_mib', float('nan')):,.0f} MiB "
                 f"({row['least_s']:.0f} s)" if args.least else ""), flush=True)


if __name__ == "__main__":
    main()
