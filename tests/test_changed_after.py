"""What a traced step fixes and the model or torch may change after optimize(): the parameters'
layout (NOTE [Parameters changed] in monet_opt/module.py) and torch's default dtype (NOTE
[Attention kernels are traced] in monet_opt/kernels.py) each plan a step of their own, which
trains as eager."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import monet_opt

HUGE = 1 << 40


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        scale = torch.arange(10) / 3.0  # in the default dtype
        return (self.fc(h.flatten(1)) * scale).square().sum()


def _alike(opt, model, eager, x) -> None:
    model.zero_grad(set_to_none=True)
    eager.zero_grad(set_to_none=True)
    ours, theirs = opt(x), eager(x)
    ours.backward()
    theirs.backward()
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           eager.parameters()))


def test_a_model_made_channels_last_after_optimize_plans_its_step():
    """The step traced for contiguous weights ran on channels-last ones: gradients 7e-6 from
    eager's, or (a flatten eager copies) a view the new layout does not allow."""
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(4, 3, 8, 8)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    model.to(memory_format=torch.channels_last)
    eager = copy.deepcopy(model)
    with pytest.warns(monet_opt.ReplanWarning, match="layout"):
        _alike(opt, model, eager, x)
    assert len(opt.plans) == 2


def test_another_default_dtype_plans_its_step():
    """torch.arange(n) / 3.0 in the forward is made in the default dtype: after
    set_default_dtype(float64) eager's loss was float64, the step's float32."""
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(4, 3, 8, 8)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    eager = copy.deepcopy(model)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.warns(monet_opt.ReplanWarning, match="default dtype torch.float64"):
            _alike(opt, model, eager, x)
    finally:
        torch.set_default_dtype(before)
    _alike(opt, model, eager, x)  # the first plan again
    assert len(opt.plans) == 2
