"""optimize()'s own peak, and a new batch size's first step (which plans), against a byte limit
(docs/benchmarks/planning_memory.md). Run: PYTHONPATH=. python docs/benchmarks/planning_memory.py"""
from __future__ import annotations

import copy
import subprocess
import warnings

import torch
from torch import nn

import monet_opt


class Projected(nn.Module):
    """Two Linears behind a 256 KiB buffer (NOTE [Buffers the pass reads])."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 10)
        self.register_buffer("proj", torch.randn(256, 256) / 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x @ self.proj)))


class LoRA(nn.Module):
    """Frozen Linears with trainable rank-4 adapters, tanh between."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.ModuleList(nn.Linear(64, 64) for _ in range(5))
        for layer in self.base:
            layer.requires_grad_(False)
        self.a = nn.ParameterList(nn.Parameter(torch.randn(4, 64) * 0.1) for _ in range(5))
        self.b = nn.ParameterList(nn.Parameter(torch.randn(64, 4) * 0.1) for _ in range(5))

    def forward(self, h):
        for base, a, b in zip(self.base, self.a, self.b):
            h = torch.tanh(base(h) + (h @ a.t()) @ b.t())
        return h


class TwoConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        h = nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        return self.fc(torch.tanh(self.c2(h)).mean((2, 3)))


def row(name, model, x, limit_of, other=None) -> str:
    torch.manual_seed(0)
    plan = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                              time_limit_s=10).plan
    limit, what = limit_of(plan)
    made = []
    own = monet_opt.measure_peak(lambda: made.append(monet_opt.optimize(
        model, x, limit, profile_dir=None, time_limit_s=10)), monet_opt.resident_tensors(model, x))
    opt = made.pop()
    step = monet_opt.measure_peak(lambda: opt(x).sum().backward(),
                                  monet_opt.resident_tensors(model, x))
    model.zero_grad(set_to_none=True)
    cells = [name, f"{limit:,} ({what})", f"{opt.plan.predicted_peak_bytes:,}", f"{step:,}",
             f"{own:,} ({100 * (own - limit) / limit:+.1f} %)"]
    if other is not None:
        first = monet_opt.measure_peak(lambda: opt(other).sum().backward(),
                                       monet_opt.resident_tensors(model, other))
        cells.append(f"{first:,} ({100 * (first - limit) / limit:+.1f} %)")
    else:
        cells.append("-")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, commit {commit}; "
          "peaks by the allocation events (monet_opt.measure_peak), bytes\n")
    print("| model | limit | plan predicted | its step | optimize() itself | a new batch "
          "size's first step |")
    print("|---|---|---|---|---|---|")
    torch.manual_seed(0)
    print(row("two Linears behind a 256 KiB buffer, batch 64", Projected(), torch.randn(64, 256),
              lambda p: (p.min_feasible_bytes + 65536, "least + 64 KiB"),
              torch.randn(60, 256)))
    torch.manual_seed(0)
    print(row("LoRA MLP, 5 frozen 64-wide layers, batch 128", LoRA(), torch.randn(128, 64),
              lambda p: (p.min_feasible_bytes + p.min_feasible_bytes // 2000, "least + 0.05 %")))
    torch.manual_seed(0)
    print(row("two convolutions, 8x3x64x64", TwoConvs(), torch.randn(8, 3, 64, 64),
              lambda p: (p.store_all_peak_bytes, "store-all's peak")))


if __name__ == "__main__":
    main()
