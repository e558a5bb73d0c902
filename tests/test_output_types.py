"""What a forward may return, and what the error says where a traced step cannot return it."""
from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40


@dataclasses.dataclass
class _Heads:
    logits: torch.Tensor
    hidden: torch.Tensor


class _ReturnsDataclass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        y = self.lin(x)
        return _Heads(y, y.relu())


def test_a_dataclass_output_says_to_register_it_and_so_registered_trains_like_eager():
    """A forward returning a plain dataclass: the error's advice was about .item() and
    use_cache; it says to register the class (or return a tuple, dict or NamedTuple), and,
    registered, the step is bitwise eager's."""
    torch.manual_seed(0)
    model, x = _ReturnsDataclass(), torch.randn(3, 8)
    with pytest.raises(monet_opt.CaptureError, match=re.escape(
            "torch.export.register_dataclass(_Heads)")):
        monet_opt.optimize(model, x, HUGE, profile_dir=None)
    torch.export.register_dataclass(_Heads)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    for module in (opt, eager):
        out = module(x)
        (out.logits.sum() * 1.3 + out.hidden.sum()).backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad)


class _ReturnsItsDtype(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        y = self.lin(x)
        return y, y.dtype


def test_a_dtype_output_says_to_leave_it_out_not_to_register_it():
    """It said to register torch.dtype as a dataclass, which fails (outputs probe,
    2026-12-06)."""
    with pytest.raises(monet_opt.CaptureError, match="returns a torch.dtype.*leave it out") as e:
        monet_opt.optimize(_ReturnsItsDtype(), torch.randn(3, 8), HUGE, profile_dir=None)
    assert "register_dataclass" not in str(e.value)
