"""Custom ops (torch.library): NOTE [Ops torch cannot vouch for] (monet_opt/recompute.py), one
that draws random numbers, untagged as every library's op is, is replayed from its forward's
generator state where a plan recomputes it; one without a fake implementation is refused
saying to register one."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt


@torch.library.custom_op("monet_tests::noisy", mutates_args=())
def noisy(x: torch.Tensor) -> torch.Tensor:
    return x + 0.01 * torch.randn_like(x)


@noisy.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


noisy.register_autograd(lambda ctx, grad: grad, setup_context=lambda ctx, inputs, output: None)


class NoisyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(32, 64)
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))
        self.last = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        for layer in self.layers:
            h = torch.tanh(noisy(layer(h)))
        return self.last(h)


def test_a_custom_op_recomputed_draws_what_its_forward_drew():
    torch.manual_seed(0)
    model, x = NoisyMLP(), torch.randn(256, 32)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, "75% of activations", profile_repeats=1,
                             profile_dir=None, time_limit_s=10)
    assert any(row.recomputed for row in opt.plan.rows if "noisy" in row.name)
    torch.manual_seed(1)
    opt(x).square().mean().backward()
    ours = torch.get_rng_state()
    torch.manual_seed(1)
    eager(x).square().mean().backward()
    assert torch.equal(ours, torch.get_rng_state())
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                             eager.parameters()))


@torch.library.custom_op("monet_tests::square_unfaked", mutates_args=())
def square_unfaked(x: torch.Tensor) -> torch.Tensor:
    return x * x


def test_a_custom_op_without_a_fake_says_to_register_one():
    """The error had said to avoid .item() at the line named."""
    model = nn.Sequential(nn.Linear(8, 8), _Applied(square_unfaked))
    with pytest.raises(monet_opt.CaptureError,
                       match=r"(?s)custom op monet_tests::square_unfaked has no fake.*"
                             r"register_fake"):
        monet_opt.optimize(model, torch.randn(4, 8), "100% of peak", profile_dir=None)


class _Applied(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)
