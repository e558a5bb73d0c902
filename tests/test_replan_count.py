"""ReplanWarning's count of the plans made (NOTE [New input shapes] in monet_opt/module.py)."""
from __future__ import annotations

import pickle

import pytest
import torch

import monet_opt

HUGE = 1 << 40


class _Counting(torch.nn.Module):
    """Its forward counts its calls in a Python attribute, so each trace changes it: the step
    is kept under the values before and after."""

    def __init__(self) -> None:
        super().__init__()
        self.f, self.calls = torch.nn.Linear(8, 8), 0

    def forward(self, x):
        self.calls += 1
        return self.f(x)


def test_the_replan_warning_counts_each_plan_once():
    """A step kept under two keys was counted twice ('3 plans so far' with two made: RL
    probe, 2026-12-07)."""
    with pytest.warns(monet_opt.SideEffectWarning):
        opt = monet_opt.optimize(_Counting(), torch.randn(4, 8), HUGE, profile_repeats=1,
                                 profile_dir=None)
    for batch in (8, 16):
        with pytest.warns(monet_opt.ReplanWarning) as seen:
            opt(torch.randn(batch, 8)).sum().backward()
        opt.zero_grad(set_to_none=True)
        said = [str(w.message) for w in seen if w.category is monet_opt.ReplanWarning][0]
        assert f"{len(opt.plans)} plans so far" in said, (said, list(opt.plans))
    assert list(pickle.loads(pickle.dumps(opt.plans))) == list(opt.plans)  # it was a proxy
