"""NOTE [Inputs of other dtypes] (monet_opt/input_spec.py): an input of another dtype plans a
step of its own, as a shape does."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt.module import ReplanWarning
from tests import models

HUGE = 1 << 40


def test_inputs_of_another_dtype_plan_a_step():
    """NOTE [Inputs of other dtypes]: after model.double() the float64 batch eager takes was
    refused (PlanMismatchError); a forward that casts its input took no float64 batch either."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    model.double(), eager.double()
    for seed in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = _grads_after(opt, model, x.double(), loss_fn, seed)
        expected = _grads_after(eager, eager, x.double(), loss_fn, seed)
        assert all(torch.equal(a, b) for a, b in zip(ours, expected, strict=True))
        assert len([w for w in caught if w.category is ReplanWarning]) == (seed == 0)
    assert all(p.dtype == torch.float64 for p in model.parameters())

    cast = nn.Sequential(Cast(), nn.Linear(16, 4))
    opt = monet_opt.optimize(cast, torch.randn(2, 16), HUGE, profile_repeats=1)
    with pytest.warns(ReplanWarning, match=r"float64\[2x16\] \(the first plan: "
                                           r"float32\[2x16\]\).*inputs. dtypes"):
        out = opt(torch.randn(2, 16, dtype=torch.float64))
    assert out.dtype == torch.float32


class Cast(nn.Module):
    def forward(self, x):
        return x.float()


def _grads_after(module, owner, x, loss_fn, seed):
    owner.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss_fn(module(x)).backward()
    return [p.grad for p in owner.parameters()] + list(owner.buffers())
