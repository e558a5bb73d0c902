"""NOTE [Gradients of parameters updated in place] (monet_opt/mutation_tangents.py): a
parameter the forward updates in place (Embedding's max_norm) costs its step no zero gradient
and no addition of it in the backward, and outputs handed no gradient still train as eager."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40


class Renormed(nn.Module):
    """An Embedding(max_norm) and two heads; `both` False: the loss reads the first only."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(200, 32, max_norm=1.0)
        self.head, self.aux = nn.Linear(32, 8), nn.Linear(32, 4)

    def forward(self, idx):
        h = self.emb(idx)
        return self.head(h), self.aux(h)


def _step(module, owner, idx, both: bool):
    owner.zero_grad(set_to_none=True)
    out, aux = module(idx)
    (out.square().sum() + (aux.sum() if both else 0)).backward()
    return [p.grad for p in owner.parameters()], [p.detach().clone() for p in owner.parameters()]


def test_an_updated_parameter_costs_no_zero_gradient():
    """The step held a zero tensor of the table and its sum with the gradient: 25,600 B over
    eager's peak at store-all."""
    torch.manual_seed(0)
    model, idx = Renormed(), torch.randint(0, 200, (8, 12))
    eager = copy.deepcopy(model)
    table = model.emb.weight.numel() * model.emb.weight.element_size()
    opt = monet_opt.optimize(model, idx, HUGE, profile_dir=None, profile_repeats=1)
    for both in (True, False):  # the second: the unread head's tangent is made as it was
        for _ in range(2):
            ours, theirs = _step(opt, model, idx, both), _step(eager, eager, idx, both)
            for a, b in zip(ours[0] + ours[1], theirs[0] + theirs[1]):
                assert (a is None and b is None) or torch.equal(a, b)
    assert model.aux.weight.grad is None  # the loss read the first head only
    measured = []
    for m in (eager, opt):
        m.zero_grad(set_to_none=True)
        measured.append(monet_opt.measure_peak(lambda: sum(o.square().sum() for o in m(idx))
                                               .backward(), monet_opt.resident_tensors(m, idx)))
    assert measured[1] <= opt.plan.predicted_peak_bytes
    assert measured[1] < measured[0] + table // 2, measured


def test_a_limit_only_the_tables_copy_misses_says_why():
    """An EmbeddingBag with max_norm renorms a copy of its table in the traced step, where
    eager renorms it in place: at eager's own peak the error said no schedule could fit, with
    no word of why; it names the max_norm copy now."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.EmbeddingBag(300, 32, max_norm=1.0, mode="mean"), nn.Linear(32, 1))
    with torch.no_grad():
        model[0].weight.mul_(3.0)  # rows over the norm
    idx = torch.randint(0, 300, (32, 10))
    least = monet_opt.optimize(copy.deepcopy(model), idx, HUGE, profile_dir=None,
                               profile_repeats=1).plan.min_feasible_bytes
    table = model[0].weight.numel() * model[0].weight.element_size()
    with pytest.raises(monet_opt.InfeasibleBudgetError, match="what embedding_renorm holds "
                       "while it runs: an Embedding or EmbeddingBag with max_norm renorms a copy"):
        monet_opt.optimize(model, idx, least - table // 2, profile_dir=None, profile_repeats=1)


class _Tied(nn.Module):
    """An Embedding(max_norm) whose table an output projection also reads."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 16, max_norm=1.0)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))

    def forward(self, idx):
        return (self.mlp(self.emb(idx)) @ self.emb.weight.t()).logsumexp(-1).sum()


def test_the_update_s_gradient_is_counted_as_never_made():
    """The update's tangent, read by nothing once its addition is dropped, was counted from the
    backward's start: with the step peaking in the backward, one table over its measured peak
    (886,156 B predicted, 834,956 measured on a recommender; 74,760 and 68,544 here). Now the
    prediction is the measurement, and the step trains as eager."""
    torch.manual_seed(0)
    model, idx = _Tied(), torch.randint(0, 100, (8, 6))
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, idx, HUGE, profile_dir=None, profile_repeats=1)
    measured = monet_opt.measure_peak(lambda: opt(idx).backward(),
                                      monet_opt.resident_tensors(model, idx))
    assert 0 <= opt.plan.predicted_peak_bytes - measured <= 8  # the loss scalar, where counted
    eager(idx).backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad) and torch.equal(p, q)
