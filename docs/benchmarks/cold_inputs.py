"""One op's time with its input warm in the cache (as the profiler times it, right after the
op that made it) against the same call after the caches were flushed (as a recomputation in
the backward reads a tensor kept since the forward).

    PYTHONPATH=. python docs/benchmarks/cold_inputs.py
"""
from __future__ import annotations

import statistics
import time

import torch

from monet_opt.bench.allocator import keep_freed_memory

SHAPES = [(16, 128, 32, 32), (16, 256, 32, 32), (16, 512, 16, 16), (16, 128, 8, 8)]
FLUSH_BYTES = 256 * 2**20  # well over this machine's caches


def _median_s(f, before, n: int = 7) -> float:
    out = []
    for _ in range(n):
        before()
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    torch.set_num_threads(2)
    allocator = keep_freed_memory()  # as the bench: results reuse freed memory, no page faults
    flush = torch.empty(FLUSH_BYTES // 4)
    print(f"torch {torch.__version__}, 2 threads, median of 7 calls each; cold: "
          f"{FLUSH_BYTES >> 20} MiB written before each call; {allocator}\n")
    print("| input shape | MiB | op | warm ms | cold ms | cold / warm |\n|---|---|---|---|---|---|")
    for shape in SHAPES:
        x, c = torch.randn(shape), shape[1]
        stats = torch.zeros(c), torch.ones(c)
        ops = {"relu": lambda: torch.relu(x),
               "BatchNorm (statistics given)": lambda: torch.ops.aten.
               _native_batch_norm_legit_no_training(x, stats[1], stats[0], *stats, 0.1, 1e-5),
               "1x1 convolution to 32": lambda w=torch.randn(32, c, 1, 1): torch.conv2d(x, w)}
        for name, f in ops.items():
            for _ in range(3):
                f()
            warm = _median_s(f, lambda: None)
            cold = _median_s(f, lambda: flush.add_(1.0))
            print(f"| {tuple(shape)} | {x.numel() * 4 / 2**20:.1f} | {name} | {warm * 1e3:.2f} | "
                  f"{cold * 1e3:.2f} | {cold / warm:.2f} |", flush=True)


if __name__ == "__main__":
    main()
