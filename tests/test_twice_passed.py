"""NOTE [One tensor passed twice, differentiated] (monet_opt/twice_passed.py): one tensor that
requires a gradient passed twice is two inputs of the step; where the forward differentiates
with respect to one (a physics-informed loss as WithLoss(net, loss)(x, x)) the derivative was
zeros, silently, or the trace failed with advice that did not fit. Refused now, saying what to
do; passed twice and only trained through, it trains bitwise like eager."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))


def _residual(u, x, **kwargs):
    du = torch.autograd.grad(u.sum(), x, create_graph=True, **kwargs)[0]
    return ((du - 1) ** 2).mean()


class _Reference(nn.Module):
    """forward(x, xr): the output at x, differentiated at xr (the same points)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def forward(self, x, xr):
        u = self.net(x)
        return _residual(u, xr, allow_unused=True, materialize_grads=True) + u.mean()


MODELS = {"WithLoss": lambda: monet_opt.WithLoss(_net(), _residual),
          "materialized": _Reference}


@pytest.mark.parametrize("name", list(MODELS))
def test_one_tensor_passed_twice_and_differentiated_is_refused(name):
    x = torch.rand(8, 2).requires_grad_()
    model = MODELS[name]()
    model(x, x).backward()  # eager runs it
    with pytest.raises(monet_opt.CaptureError, match="passed as the step's input tensors #0 "
                       "and #1.*takes a derivative.*inside the model's forward"):
        monet_opt.optimize(model, (x, x), 1 << 30, profile_dir=None, profile_repeats=1)


class _TwoArms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, y):
        return (torch.tanh(self.a(x)) * self.b(y)).sum()


def test_one_tensor_passed_twice_and_trained_through_trains_like_eager():
    torch.manual_seed(0)
    model, x0 = _TwoArms(), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    sample = x0.clone().requires_grad_()
    opt = monet_opt.optimize(model, (sample, sample), 1 << 30, profile_dir=None,
                             profile_repeats=1)
    for _ in range(2):
        xe, xo = x0.clone().requires_grad_(), x0.clone().requires_grad_()
        expected, out = eager(xe, xe), opt(xo, xo)
        expected.backward()
        out.backward()
        assert torch.equal(expected, out)
        assert torch.equal(xe.grad, xo.grad)
        for p, q in zip(model.parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad)


class _InnerStep(nn.Module):
    """forward(q, k) takes a MAML-style inner step: a derivative with respect to its weight."""

    def __init__(self) -> None:
        super().__init__()
        self.w, self.out = nn.Parameter(torch.randn(8, 8) * 0.1), nn.Linear(8, 4)

    def forward(self, q, k):
        inner = (torch.tanh(q @ self.w) * torch.sigmoid(k @ self.w)).square().mean()
        step, = torch.autograd.grad(inner, self.w, create_graph=True)
        w = self.w - 0.1 * step
        return self.out(torch.tanh(q @ w) * torch.sigmoid(k @ w))


def test_a_derivative_with_respect_to_parameters_alone_is_not_refused():
    """It cannot see the inputs as one or two, and was refused (false-positive probe)."""
    torch.manual_seed(0)
    model, x = _InnerStep(), torch.randn(16, 8, requires_grad=True)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, (x, x), 1 << 30, profile_dir=None, profile_repeats=1)
    out, expected = opt(x, x), eager(x, x)
    assert torch.equal(out, expected)
    out.square().mean().backward()
    expected.square().mean().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad)
