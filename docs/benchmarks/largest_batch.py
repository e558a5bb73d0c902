"""The largest batch that trains under one memory limit: eager PyTorch, checkpoint_sequential
(round(√n) segments; on a transformer of monet_opt.zoo, the checkpointing `monet-opt bench`
runs beside it: Hugging Face's per block) and monet_opt.largest_batch (NOTE [The largest batch]
in monet_opt/batch_size.py), each batch's step measured (the live-bytes counter: everything the
step holds, parameters and gradients included), and the samples per second each trains at its
largest batch. Checkmate's headline: VGG-19 at 289 against eager's 167 (1.73x).

    PYTHONPATH=. python docs/benchmarks/largest_batch.py [--model vgg19] [--size 64]
        [--limit 2GiB]
    PYTHONPATH=. python docs/benchmarks/largest_batch.py --model gpt2_narrow --size 256
        --limit 400MiB   (--size: tokens per sample)
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings
from typing import Callable

import torch
import torchvision

import monet_opt
from monet_opt import zoo
from monet_opt.bench import peers
from monet_opt.bench.models import SPECS, _layers_vgg

MIB = 2**20


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="vgg19", help="a torchvision model or a transformer of "
                   "monet_opt.zoo (gpt2_narrow, gpt2, bert_base)")
    p.add_argument("--size", type=int, default=64, help="image side, or tokens per sample")
    p.add_argument("--limit", default="2GiB")
    p.add_argument("--rounds", type=int, default=3, help="timed steps at each largest batch "
                                                         "(0: none, memory only)")
    p.add_argument("--max-tries", type=int, default=12)
    args = p.parse_args()
    warnings.simplefilter("ignore")
    logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)
    limit = monet_opt.parse_memory_limit(args.limit)
    torch.manual_seed(0)
    if args.model in zoo.ALL_MODELS:
        model, sample = zoo.ALL_MODELS[args.model](seq=args.size)
        ids = sample["input_ids"]
        low, high = int(ids.min()), int(ids.max()) + 1

        def inputs(batch: int) -> dict[str, torch.Tensor]:
            return {"input_ids": torch.randint(low, high, (batch, args.size),
                                               generator=torch.Generator().manual_seed(batch))}
        checkpointed = SPECS[args.model].checkpoint[0].build(model).module
        what = f"monet_opt.zoo.{args.model}(), {args.size} tokens per sample"
        peer = "checkpoint per block"
    else:
        model = getattr(torchvision.models, args.model)().train()

        def inputs(batch: int) -> torch.Tensor:
            return torch.randn(batch, 3, args.size, args.size,
                               generator=torch.Generator().manual_seed(batch))
        checkpointed = peers.sequential(_layers_vgg).build(model).module
        what = f"torchvision.models.{args.model}(), {args.size}x{args.size} images"
        peer = "checkpoint_sequential"
    print(f"{what}, limit {monet_opt.format_bytes(limit)}; torch {torch.__version__}, CPU, "
          f"{torch.get_num_threads()} threads; step = forward, `.sum().backward()`, median of "
          f"{args.rounds}.\n")
    print("| method | largest batch | x eager's | measured peak MiB | batches tried | search s "
          "| step s | samples/s | x eager's |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    eager: list[float] = []  # its batch and samples/s, which the other rows are compared with

    def row(name: str, batch: int, peak: int, tries: int, search_s: float, step_s: float):
        eager.extend([] if eager else [batch, batch / step_s])
        print(f"| {name} | {batch} | {batch / eager[0]:.2f} | {peak / MIB:.1f} | {tries} | "
              f"{search_s:.0f} | {step_s:.2f} | {batch / step_s:.1f} | "
              f"{batch / step_s / eager[1]:.2f} |", flush=True)

    for name, module in (("eager", model), (peer, checkpointed)):
        start = time.perf_counter()
        batch, tries = _largest(lambda b, m=module: _peak(m, inputs(b)) <= limit)
        row(name, batch, _peak(module, inputs(batch)), tries, time.perf_counter() - start,
            _step_s(module, inputs(batch), args.rounds))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as profiles:  # each try profiled anew, as a user's first
        fit = monet_opt.largest_batch(model, inputs, limit, start=int(eager[0]),
                                      max_tries=args.max_tries, profile_dir=profiles)
    x = inputs(fit.batch)
    row(f"monet_opt ({fit.module.plan.solver}, predicted overhead "
        f"{fit.module.plan.predicted_overhead:+.1%})", fit.batch, _peak(fit.module, x, model),
        len(fit.tries), time.perf_counter() - start, _step_s(fit.module, x, args.rounds))
    print()
    print(fit.text())


def _largest(fits: Callable[[int], bool]) -> tuple[int, int]:
    """The largest batch `fits`, doubling then halving the step; and how many were tried."""
    lo, hi, tries = 0, None, 0
    batch = 8
    while hi is None or hi > lo + 1:
        tries += 1
        if fits(batch):
            lo = batch
        else:
            hi = batch
        batch = batch * 2 if hi is None else (lo + hi) // 2
    return lo, tries


def _peak(module, x, owner=None) -> int:
    owner = module if owner is None else owner
    owner.zero_grad(set_to_none=True)
    peak = monet_opt.measure_peak(lambda: _call(module, x).sum().backward(),
                                  monet_opt.resident_tensors(owner, x))
    owner.zero_grad(set_to_none=True)
    return peak


def _step_s(module, x, rounds: int) -> float:
    if rounds == 0:
        return float("nan")
    times = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        _call(module, x).sum().backward()
        times.append(time.perf_counter() - start)
        for p_ in module.parameters():
            p_.grad = None
    return statistics.median(times[1:])


def _call(module, x):
    return module(**x) if isinstance(x, dict) else module(x)


if __name__ == "__main__":
    main()
