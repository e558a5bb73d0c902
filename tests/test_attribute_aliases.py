"""NOTE [Attributes that are parameters or buffers] (monet_opt/attribute_tensors.py): a plain
attribute holding a buffer the forward updates in place is read as the traced buffer."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt


class _Average(nn.Module):
    """Keeps a running mean of its input (under no_grad) and passes the input on."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(16))

    def forward(self, x):
        with torch.no_grad():
            self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return x


class _Aliased(nn.Module):
    def __init__(self, scale: bool) -> None:
        super().__init__()
        self.lin, self.average, self.head = nn.Linear(16, 16), _Average(), nn.Linear(16, 4)
        self.alias, self.scale = self.average.mean, scale  # the buffer itself, by another name

    def forward(self, x):
        h = self.average(torch.relu(self.lin(x)))
        return self.head(h * self.alias if self.scale else h + self.alias).square().mean()


@pytest.mark.parametrize("scale", [True, False])
def test_an_attribute_holding_an_updated_buffer_trains_like_eager(scale):
    """Read as a constant, the real buffer: scaled by it, the first backward failed autograd's
    version check; added, every step was off eager's (loss 1.3e-3 off), silently."""
    torch.manual_seed(0)
    model, x = _Aliased(scale), torch.randn(8, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None)
    for _ in range(3):
        losses = [module(x) for module in (opt, eager)]
        for loss in losses:
            loss.backward()
        assert torch.equal(*losses)
        assert torch.equal(model.average.mean, eager.average.mean)
        assert model.alias is model.average.mean
        for p, q in zip(model.parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad)
            with torch.no_grad():
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad
            p.grad = q.grad = None
