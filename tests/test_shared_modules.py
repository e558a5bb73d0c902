"""A module registered under several names (NOTE [A module under two names] in
monet_opt/attribute_tensors.py)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40


class TwoNames(nn.Module):
    """One Linear as `lin` and inside `seq`; one block three times in a ModuleList (ALBERT's
    layer reuse written as [layer] * 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.seq = nn.Sequential(self.lin, nn.Tanh())
        block = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
        self.layers = nn.ModuleList([block] * 3)

    def forward(self, x):
        x = self.lin(self.seq(x))
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("least", [False, True])
def test_a_module_under_two_names_keeps_its_parameters(least):
    """optimize() left the trace's FunctionalTensors as the model's parameters, and every step
    raised "Attempting to use FunctionalTensor on its own"."""
    torch.manual_seed(0)
    model, x = TwoNames(), torch.randn(256, 32)
    eager = copy.deepcopy(model)
    before = [id(p) for p in model.parameters()]
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    if least:
        opt = monet_opt.optimize(model, x, opt.plan.min_feasible_bytes, profile_dir=None,
                                 profile_repeats=1, time_limit_s=5)
        assert opt.plan.recomputed_ops > 0
    assert [id(p) for p in model.parameters()] == before
    assert all(type(p) is nn.Parameter for p in model.parameters())
    peak = monet_opt.measure_peak(lambda: opt(x).sum().backward(),
                                  monet_opt.resident_tensors(model, x))
    assert peak <= opt.plan.memory_limit_bytes
    eager(x).sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad)
