"""NOTE [Statistics updated in place]: a training BatchNorm's forward updates its running
statistics and its batch count in place, as eager does, where nothing else reads them; the
buffers end each step bitwise eager's, and the peak is the predicted one to the byte."""
from __future__ import annotations

import collections
import copy

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import monet_opt
from tests.test_executor import HUGE
from tests.records import measured_peak_of

aten = torch.ops.aten
FUNCTIONAL = aten._native_batch_norm_legit_functional.default
IN_PLACE = aten._native_batch_norm_legit.default


class Counted(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func] += 1
        return func(*args, **(kwargs or {}))


class Blocks(nn.Module):
    """Conv-BN-ReLU blocks; `shared`: one BatchNorm called twice; `reads_stats`: the forward
    reads a running mean after its BatchNorm has updated it."""

    def __init__(self, shared: bool = False, reads_stats: bool = False):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(c, 8, 3, padding=1) for c in (3, 8, 8))
        self.bns = nn.ModuleList(nn.BatchNorm2d(8) for _ in range(3))
        self.shared, self.reads_stats = shared, reads_stats

    def forward(self, x):
        for k, conv in enumerate(self.convs):
            bn = self.bns[0] if self.shared and k == 2 else self.bns[k]
            x = torch.relu(bn(conv(x)))
        if self.reads_stats:
            x = x + self.bns[1].running_mean.view(1, -1, 1, 1)
        return x.mean((2, 3))


def _steps(module, x, steps: int = 3):
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for _ in range(steps):
        module(x).sum().backward()
        grads.append([p.grad.clone() for p in module.parameters() if p.grad is not None])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return grads, {k: v.clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("shared,reads_stats,in_place", [
    (False, False, 3), (True, False, 1), (False, True, 2)],
    ids=["separate", "shared", "stats_read"])
def test_statistics_update_in_place_and_train_like_eager(shared, reads_stats, in_place):
    torch.manual_seed(0)
    base = Blocks(shared, reads_stats).train()
    x = torch.randn(4, 3, 12, 12)
    store_all = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1)
    plan = store_all.plan
    least = monet_opt.optimize(copy.deepcopy(base), x, plan.min_feasible_bytes,
                               profile_repeats=1, time_limit_s=3)
    want = _steps(copy.deepcopy(base), x)
    for opt in (store_all, least):
        with Counted() as counted:
            opt(x).sum().backward()
        opt.model.zero_grad(set_to_none=True)
        # a BatchNorm whose statistics something else reads runs functionally, as traced
        assert counted.calls[IN_PLACE] == in_place, dict(counted.calls)
        assert counted.calls[FUNCTIONAL] == 3 - in_place
    for opt in (store_all, least):
        fresh = monet_opt.optimize(copy.deepcopy(base), x, opt.plan.predicted_peak_bytes,
                                   profile_repeats=1, time_limit_s=3)
        got = _steps(fresh, x)
        assert all(torch.equal(a, b) for ga, gb in zip(got[0], want[0]) for a, b in zip(ga, gb))
        assert got[1].keys() == want[1].keys()
        for name, value in want[1].items():  # running statistics and batch counts included
            assert torch.equal(got[1][name], value), name
        resident = monet_opt.resident_tensors(fresh.model, x)
        peak = monet_opt.measure_peak(lambda: fresh(x).sum().backward(), resident)
        # NOTE [The loss scalar]: counted for the whole step, not yet made at a forward peak
        assert peak == measured_peak_of(fresh.plan)
