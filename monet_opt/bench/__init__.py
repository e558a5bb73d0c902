"""`monet-opt bench`: our memory/overhead frontier beside torch.utils.checkpoint, torch.compile's
activation memory budget and Checkmate, on the same models, in one run.

    monet-opt bench [--models resnet50,gpt2] [--quick] [--out docs/benchmarks]

models.py (which model, what size, which checkpointing), peers.py (the peers' wrappers),
measure.py (peak, time, gradients), methods.py (each method on one model), run.py (the run),
results.py (bench.json), report.py (bench.md), plots.py (PNGs), timeline.py (predicted vs
measured memory over one step).
"""
from monet_opt.bench.run import main

__all__ = ["main"]
