"""NOTE [Gradients made outside the step] in monet_opt/outside_grads.py: gradients autograd makes
outside the planned backward (a returned parameter's, one tensor passed twice) are counted, and a
returned parameter gathers no hooks."""
from __future__ import annotations

import copy

import torch
from torch import nn

import monet_opt
from tests.records import at_least_peak


class _ReturnsItsWeight(nn.Module):
    """Returns a view of a weight beside its output (a loss reading both)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(128, 64), nn.Linear(64, 8)
        self.log_var = nn.Parameter(torch.zeros(4, 16))

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))), self.a.weight.t(), self.log_var


class _TakesAWeight(nn.Module):
    """Given its own embedding's weight as an input too (weight tying done by the caller)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lin = nn.Embedding(512, 64), nn.Linear(64, 64)

    def forward(self, ids, weight):
        return torch.tanh(self.lin(self.emb(ids))) @ weight.t()


def _loss(outs):
    return sum(o.sum() for o in outs) if isinstance(outs, tuple) else outs.sum()


def _within_its_plan(model, sample, call) -> None:
    """At the least peak: the step measures at or under its prediction (its limit), and two
    steps' gradients are eager's bitwise."""
    eager = copy.deepcopy(model)
    opt, limit = at_least_peak(model, sample)
    measured = monet_opt.measure_peak(lambda: _loss(call(opt, model)).backward(),
                                      monet_opt.resident_tensors(model, sample))
    assert measured <= opt.plan.predicted_peak_bytes <= limit
    for _ in range(2):
        for module in (model, eager):
            module.zero_grad(set_to_none=True)
        _loss(call(opt, model)).backward()
        _loss(call(eager, eager)).backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad), name


def test_a_returned_weight_is_counted():
    """A 32 KiB weight returned as a view measured 30.7 KiB over the least plan's prediction."""
    torch.manual_seed(0)
    model, x = _ReturnsItsWeight(), torch.randn(8, 128)
    _within_its_plan(model, x, lambda module, owner: module(x))


def test_a_weight_passed_as_an_input_too_is_counted():
    """Embedding(512, 64) given as the input too measured a weight's bytes over the least plan."""
    torch.manual_seed(0)
    model, ids = _TakesAWeight(), torch.randint(0, 512, (4, 8))
    _within_its_plan(model, (ids, model.emb.weight),
                     lambda module, owner: module(ids, owner.emb.weight))


def test_a_returned_parameter_gathers_no_hooks():
    """Each step hooked the returned parameter again (3,001 hooks after 3,000 steps)."""
    torch.manual_seed(0)
    model, x = _ReturnsItsWeight(), torch.randn(8, 128)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None)
    for _ in range(3):
        y, w, log_var = opt(x)
        (y.sum() + w.sum() + log_var.sum()).backward()
    assert not model.log_var._backward_hooks



class _ReturnsItsWeightDetached(nn.Module):
    """Returns its weight detached beside its output (for logging): no gradient comes back.
    Or, `detached=False`, its output alone."""

    def __init__(self, detached: bool = True) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(128, 64), nn.Linear(64, 8)
        self.detached = detached

    def forward(self, x):
        y = self.b(torch.tanh(self.a(x)))
        return (y, self.a.weight.t().detach()) if self.detached else (y,)


def test_a_detached_weight_returned_is_not_counted():
    """It was counted as a gradient made outside the step: the plan 32 KiB high, and limits the
    step fits refused."""
    torch.manual_seed(0)
    x = torch.randn(8, 128)
    model = _ReturnsItsWeightDetached()
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None)
    alone = monet_opt.optimize(_ReturnsItsWeightDetached(detached=False), x, 1 << 40,
                               profile_dir=None)
    assert opt.plan.predicted_peak_bytes == alone.plan.predicted_peak_bytes
    measured = monet_opt.measure_peak(lambda: opt(x)[0].sum().backward(),
                                      monet_opt.resident_tensors(model, x))
    assert measured == opt.plan.predicted_peak_bytes
