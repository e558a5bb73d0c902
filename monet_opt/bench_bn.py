"""ATen's BatchNorm kernels against cuDNN's on ResNet-50's BatchNorms (CUDA only): what NOTE
[cuDNN's BatchNorm] in cudnn_bn.py buys, and whether its functions give eager's results bitwise.

    python -m monet_opt.bench_bn [--batch 184] [--size 224] [--repeats 20]

Prints a markdown table: each distinct BatchNorm input shape, how many of ResNet-50's
BatchNorms have it, and the median forward and backward time of each kernel pair (CUDA events).
"""
from __future__ import annotations

import argparse
import statistics
from collections import Counter

import torch
import torch.nn.functional as F

from monet_opt import cudnn_bn
from monet_opt.variant_probe import timed_call as _call

aten = torch.ops.aten


def median_ms(fn, repeats: int, cuda: bool = True) -> float:
    """fn's median time in ms, timed as the profiler times an op (CUDA events, or a monotonic
    clock on CPU), after a warm-up call."""
    fn()
    return statistics.median(_call(fn, (), {}, cuda)[1] for _ in range(repeats)) * 1e3


def bn_shapes(batch: int, size: int) -> Counter:
    import torchvision
    model = torchvision.models.resnet50().cuda()
    shapes: Counter = Counter()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.register_forward_hook(lambda mod, inp, out: shapes.update([tuple(inp[0].shape)]))
    with torch.no_grad():
        model(torch.randn(batch, 3, size, size, device="cuda"))
    return shapes


def time_shape(shape: tuple, repeats: int) -> tuple[float, float, float, float]:
    c = shape[1]
    x, grad = torch.randn(shape, device="cuda"), torch.randn(shape, device="cuda")
    w, b = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    mask = [True, True, True]
    _, mean, rstd, _, _ = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1,
                                                                   1e-5)
    native_f = median_ms(lambda: aten._native_batch_norm_legit_functional(
        x, w, b, rm, rv, True, 0.1, 1e-5), repeats)
    native_b = median_ms(lambda: aten.native_batch_norm_backward(
        grad, x, w, None, None, mean, rstd, True, 1e-5, mask), repeats)
    _, mean, invstd, _, _ = cudnn_bn.forward(x, w, b, rm, rv, True, 0.1, 1e-5)
    cudnn_f = median_ms(lambda: cudnn_bn.forward(x, w, b, rm, rv, True, 0.1, 1e-5), repeats)
    cudnn_b = median_ms(lambda: cudnn_bn.backward(grad, x, w, None, None, mean, invstd, True,
                                                  1e-5, mask), repeats)
    return native_f, native_b, cudnn_f, cudnn_b


def bitwise_like_eager(shape: tuple) -> dict[str, bool]:
    """cudnn_bn's forward, rerun and backward against eager autograd's F.batch_norm."""
    c = shape[1]
    x, grad = torch.randn(shape, device="cuda"), torch.randn(shape, device="cuda")
    w = (torch.rand(c, device="cuda") + 0.5).requires_grad_()
    b = torch.randn(c, device="cuda").requires_grad_()
    rm, rv = torch.randn(c, device="cuda"), torch.rand(c, device="cuda") + 0.5
    rm_e, rv_e = rm.clone(), rv.clone()
    xe = x.clone().requires_grad_()
    out_e = F.batch_norm(xe, rm_e, rv_e, w, b, training=True, momentum=0.1, eps=1e-5)
    out_e.backward(grad)
    out, mean, invstd, new_rm, new_rv = cudnn_bn.forward(x, w.detach(), b.detach(), rm, rv, True,
                                                         0.1, 1e-5)
    again = cudnn_bn.recompute(x, w.detach(), b.detach(), True, 0.1, 1e-5)
    gx, gw, gb = cudnn_bn.backward(grad, x, w.detach(), None, None, mean, invstd, True, 1e-5,
                                   [True, True, True])
    return {"out": torch.equal(out, out_e), "running mean": torch.equal(new_rm, rm_e),
            "running var": torch.equal(new_rv, rv_e),
            "rerun": all(torch.equal(u, v) for u, v in zip(again, (out, mean, invstd))),
            "grad input": torch.equal(gx, xe.grad), "grad weight": torch.equal(gw, w.grad),
            "grad bias": torch.equal(gb, b.grad)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=184)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("monet_opt.bench_bn: needs a CUDA device (cuDNN's kernels)")
    shapes = bn_shapes(args.batch, args.size)
    print(f"ResNet-50 batch {args.batch} at {args.size}x{args.size}, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}; median of {args.repeats} (ms)\n")
    print("| BatchNorm input | count | ATen fwd | ATen bwd | cuDNN fwd | cuDNN bwd |")
    print("|---|---:|---:|---:|---:|---:|")
    totals = [0.0] * 4
    for shape, n in shapes.items():
        t = time_shape(shape, args.repeats)
        totals = [a + n * b for a, b in zip(totals, t)]
        print(f"| {'x'.join(map(str, shape))} | {n} | " + " | ".join(f"{v:.3f}" for v in t) + " |")
    print("| **all, count-weighted** | " + str(sum(shapes.values())) + " | " +
          " | ".join(f"**{v:.2f}**" for v in totals) + " |")
    first = next(iter(shapes))
    print(f"\nBitwise against eager's F.batch_norm at {first}: {bitwise_like_eager(first)}")


if __name__ == "__main__":
    main()
