"""The time an optimized module spends on a training step's call outside the step itself (the
checks that pick the step: mode, autocast, hooks, parameters, inputs, watched attributes), on
the demo's GPT-2 (12 layers, 164 modules, 148 parameters): the step's compiled graphs are
swapped for a function that returns at once, so what is timed is the wrapper alone.

    .venv/bin/python docs/benchmarks/step_overhead.py
"""
import statistics
import tempfile
import time
import warnings

import torch

import monet_opt
from monet_opt import demo

warnings.simplefilter("ignore")
torch.set_num_threads(2)
model, x = demo.build_gpt2()
opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=tempfile.mkdtemp(), time_limit_s=5)
object.__setattr__(opt._first, "run", lambda *flat: None)  # the wrapper alone
call = (lambda: opt(**x)) if isinstance(x, dict) else (lambda: opt(x))
for _ in range(50):
    call()
runs = []
for _ in range(7):
    start = time.perf_counter()
    for _ in range(200):
        call()
    runs.append((time.perf_counter() - start) / 200 * 1e6)
print(f"wrapper per call: median {statistics.median(runs):.0f} us "
      f"(7 runs of 200: {min(runs):.0f}-{max(runs):.0f} us)")
