"""The host's time for one training step: eager against our store-all step with ops called
directly (NOTE [Direct calls] in monet_opt/direct_calls.py) and through OpOverload as before.

Inputs are tiny, so that what is timed is mostly the calls: on a GPU that is what a step of
many small kernels waits for. One thread and process time (not wall time), so that this
2-core VM's other load and OpenMP's waits count less; the three run in a fresh random order
each round.

    PYTHONPATH=. python docs/benchmarks/host_time.py --rounds 60
    PYTHONPATH=. python docs/benchmarks/host_time.py --epilogue   # AOTAutograd's per buffer
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
import timeit
import warnings

import torch

import monet_opt
from monet_opt import direct_calls, zoo

MODELS = {"densenet121": (2, 32), "resnet50": (2, 32), "mobilenet_v2": (2, 32),
          "gpt2": (1, 32), "bert_base": (1, 32)}


def _call(m, x):
    return m(**x) if isinstance(x, dict) else m(x)


def _step(m, x) -> float:
    t0 = time.process_time()
    _call(m, x).float().sum().backward()
    for p in m.parameters():
        p.grad = None
    return time.process_time() - t0


def _overload(model, x):
    """Our step as before NOTE [Direct calls]: FX's own code, detaches kept."""
    saved = direct_calls.DirectCodeGen, direct_calls.drop_detaches
    direct_calls.DirectCodeGen = torch.fx.graph._BoxedCodeGen
    direct_calls.drop_detaches = lambda gm: 0
    try:
        return monet_opt.optimize(model, x, 1 << 45, time_limit_s=5, profile_dir=None)
    finally:
        direct_calls.DirectCodeGen, direct_calls.drop_detaches = saved


def measure(name: str, rounds: int) -> dict[str, list[float]]:
    model, x = getattr(zoo, name)(*MODELS[name])
    methods = {"eager": model,
               "ours": monet_opt.optimize(model, x, 1 << 45, time_limit_s=5, profile_dir=None),
               "ours, via OpOverload": _overload(model, x)}
    for m in methods.values():
        for _ in range(3):
            _step(m, x)
    times = {k: [] for k in methods}
    order = list(methods)
    for _ in range(rounds):
        random.shuffle(order)
        for k in order:
            times[k].append(_step(methods[k], x))
    return times


def epilogue(name: str) -> str:
    """What AOTAutograd's epilogue does per updated buffer once its new value is the buffer
    itself (NOTE [Statistics updated in place]): copy it into itself, and (its autograd
    Function) make a view of it; here from a Python loop, least of 7 x 200."""
    bufs = list(getattr(zoo, name)(*MODELS[name])[0].buffers())

    def copies():
        for b in bufs:
            b.copy_(b)

    def views():
        for b in bufs:
            b.view_as(b)
    c, v = (min(timeit.repeat(f, number=200, repeat=7)) / 200 for f in (copies, views))
    return f"| {name} | {len(bufs)} | {c * 1e6:.0f} | {v * 1e6:.0f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--epilogue", action="store_true", help="time AOTAutograd's epilogue's calls")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if args.epilogue:
        print("| model | buffers | copy_ into itself, us a step | view_as, us a step |\n"
              "|---|---|---|---|")
        for name in args.models.split(","):
            print(epilogue(name), flush=True)
        return
    random.seed(0)
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds, process time a step\n")
    print("| model (batch, size) | method | least ms | median ms | vs eager (least) "
          "| vs eager (median) |\n|---|---|---|---|---|---|")
    for name in args.models.split(","):
        t = measure(name, args.rounds)
        lo, mid = min(t["eager"]), statistics.median(t["eager"])
        for k, v in t.items():
            print(f"| {name} {MODELS[name]} | {k} | {min(v) * 1e3:.1f} | "
                  f"{statistics.median(v) * 1e3:.1f} | {min(v) / lo - 1:+.1%} | "
                  f"{statistics.median(v) / mid - 1:+.1%} |", flush=True)


if __name__ == "__main__":
    main()
