"""Mask variants written into dy: their workspace made anew and written into, and plans of an
RNN with dropout whose peak is at such a backward, predicted against measured
(docs/benchmarks/workspace_written_into.md; NOTE [Workspace written into])."""
from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[2]))  # PYTHONPATH first: a worktree

import monet_opt  # noqa: E402
from monet_opt import memory, variants, variants_bits  # noqa: E402
from tests.test_eager_kernels import CASES  # noqa: E402


def workspaces() -> None:
    torch.manual_seed(0)
    out = torch.relu(torch.randn(16, 64, 56, 56))  # ResNet-18's stem ReLU at b16, 112²
    grad = torch.randn_like(out)
    order = variants_bits.memory_order(out)
    cases = {"relu.bit_mask": (variants_bits.relu_bit_encode(out, 0, order), (0, order)),
             "relu.bool_mask": (out.le(0), ()),
             "dropout.bit_mask": (variants_bits.pack_bits(out.gt(0)), ())}
    print(f"ReLU output 16x64x56x56 ({out.numel():,} elements): workspace, B")
    for name, (enc, params) in cases.items():
        extra = (0,) if name.startswith("relu") else (1.4,)
        args = (grad, enc, *extra)
        anew = memory.counted(functools.partial(variants.run, (name,), (params,), *args),
                              False, (args, {}))[1]
        into = (grad.clone(), enc, *extra)
        written = memory.counted(functools.partial(variants.run_into, (name,), (params,), *into),
                                 False, (into, {}))[1]
        print(f"  {name:18} made anew {anew:>11,}   written into dy {written:>11,}")


def rnn_plans() -> None:
    torch.manual_seed(0)
    model, shape = CASES["rnn_tanh_dropout"]()
    x = torch.randn(shape)
    limit = 22872  # tests/test_eager_kernels.py's limit for it: its least peak then
    print(f"\nrnn_tanh_dropout (tests/test_eager_kernels.py) at {limit:,} B, auto:")
    for seconds in (0.2, 0.3, 0.5, 1.0, 4.0):
        opt = monet_opt.optimize(copy.deepcopy(model), x, limit, profile_repeats=1,
                                 time_limit_s=seconds, profile_dir=None)
        resident = monet_opt.resident_tensors(opt.model, x)
        measured = monet_opt.measure_peak(lambda: opt(x).sum().backward(), resident)
        plan = opt.plan
        print(f"  {seconds:>4} s  {plan.solver:22} predicted {plan.predicted_peak_bytes:>7,} B  "
              f"measured {measured:>7,} B ({measured - plan.predicted_peak_bytes:+,})  "
              f"at {plan.peak_op.split(',')[0]}")


if __name__ == "__main__":
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads")
    workspaces()
    rnn_plans()
