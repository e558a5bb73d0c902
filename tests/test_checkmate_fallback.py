"""NOTE [Checkmate where nothing fits] (solvers/last_tries.py): where nothing of auto's fits, it
runs Checkmate's program, which may drop a held tensor at any backward op and recompute it
later, and reaches lower peaks than auto's programs: a tanh MLP was refused at 700,000 B ("a
longer one would find none") that Checkmate planned at 641,296 B. Now auto plans it, measured
within the limit at the prediction and bitwise eager's."""
from __future__ import annotations

import copy

import torch
from torch import nn

import monet_opt


def test_auto_plans_with_checkmate_below_its_own_least_peak():
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.Tanh())],
                          nn.Linear(64, 1))
    x = torch.randn(256, 64)
    eager = copy.deepcopy(model)
    kept_order = monet_opt.optimize(copy.deepcopy(model), x, 1 << 30, profile_dir=None,
                                    profile_repeats=1).plan.min_feasible_bytes
    limit = kept_order * 9 // 10
    opt = monet_opt.optimize(model, x, limit, profile_dir=None, profile_repeats=1,
                             time_limit_s=10)
    assert opt.plan.solver == "auto:checkmate"
    measured = monet_opt.measure_peak(lambda: opt(x).square().mean().backward(),
                                      monet_opt.resident_tensors(model, x))
    assert measured <= opt.plan.predicted_peak_bytes <= limit
    model.zero_grad(set_to_none=True)
    opt(x).square().mean().backward()
    eager(x).square().mean().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad)
