"""The time an optimized module spends on a training step's call outside the step itself (the
checks that pick the step: mode, autocast, hooks, parameters, inputs, watched attributes): the
step's compiled graphs are swapped for a function that returns at once, so what is timed is the
wrapper alone. "demo": the demo's GPT-2 (12 layers, 164 modules, 148 parameters); the others
are monet_opt.zoo's models at tiny inputs (the wrapper's work does not depend on them).

    .venv/bin/python docs/benchmarks/step_overhead.py [--models demo,densenet121,resnet50,gpt2]

One thread, process time, the least and the median of 9 runs of 100 calls.
"""
import argparse
import statistics
import time
import warnings

import torch

import monet_opt
from monet_opt import demo, zoo

SIZES = {"densenet121": (2, 32), "resnet50": (2, 32), "gpt2": (1, 32)}


def wrapper_us(name: str) -> list[float]:
    model, x = demo.build_gpt2() if name == "demo" else getattr(zoo, name)(*SIZES[name])
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, time_limit_s=5)
    object.__setattr__(opt._first, "run", lambda *flat: None)  # the wrapper alone
    call = (lambda: opt(**x)) if isinstance(x, dict) else (lambda: opt(x))
    for _ in range(30):
        call()
    runs = []
    for _ in range(9):
        start = time.process_time()
        for _ in range(100):
            call()
        runs.append((time.process_time() - start) / 100 * 1e6)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="demo,densenet121,resnet50,gpt2")
    names = parser.parse_args().models.split(",")
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    for name in names:
        runs = wrapper_us(name)
        print(f"{name}: wrapper per call least {min(runs):.0f} us, "
              f"median {statistics.median(runs):.0f} us")


if __name__ == "__main__":
    main()
