"""NOTE [Dropout's gradient in place] (monet_opt/grad_in_place.py): a dropout's backward
writes dx into a dy that dies there, its mask kept as is or as bits, and the step measures its
prediction and trains bitwise as eager (the same masks drawn)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt
import solvers
from tests.test_grad_in_place import _every_variant


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 256),
                         nn.Tanh(), nn.Dropout(0.3), nn.Linear(256, 4))


def _in_place(problem) -> int:
    return sum(1 for op in problem.ops
               if op.name.startswith("native_dropout_backward") and op.inplace_bytes)


def _steps(module, owner, x) -> list[list[torch.Tensor]]:
    """Two steps' gradients, each from the same generator state."""
    grads = []
    for k in range(2):
        owner.zero_grad(set_to_none=True)
        torch.manual_seed(k)
        module(x).square().sum().backward()
        grads.append([p.grad for p in owner.parameters()])
    owner.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("family", [None, "dropout.bit_mask"])
def test_a_dropout_writes_its_gradient_into_dy(monkeypatch, family):
    model, x = _mlp(), torch.randn(64, 32)
    eager = copy.deepcopy(model)
    chosen = [family] if family else False
    problem = monet_opt.lower_problem(copy.deepcopy(model), x, profile_repeats=1,
                                      variants=chosen)
    assert _in_place(problem) == 2
    if family:
        monkeypatch.setattr(solvers, "solve", _every_variant)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1,
                             variants=chosen)
    assert len(opt.plan.variants) == (2 if family else 0)
    ours, theirs = _steps(opt, model, x), _steps(eager, eager, x)
    assert all(torch.equal(a, b) for step, other in zip(ours, theirs) for a, b in zip(step, other))
    measured = monet_opt.measure_peak(lambda: opt(x).square().sum().backward(),
                                      monet_opt.resident_tensors(model, x))
    assert measured == opt.plan.predicted_peak_bytes


class _DropsAll(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.every, self.some, self.out = nn.Linear(8, 8), nn.Dropout(1.0), \
            nn.Dropout(0.5), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        return self.out(self.some(h)).square().mean() + self.every(h).sum()


@pytest.mark.parametrize("least", [False, True])
def test_dropout_of_everything_draws_nothing(least):
    """NOTE [Dropout of everything]: traced, Dropout(1.0) drew a mask eager does not draw, so
    the Dropout(0.5) after it drew other masks (gradients 0.12 apart)."""
    torch.manual_seed(0)
    model, x = _DropsAll(), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    limit = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                               profile_repeats=1).plan.min_feasible_bytes if least else 1 << 40
    opt = monet_opt.optimize(model, x, limit, profile_dir=None, profile_repeats=1)
    states = []
    for module in (opt, eager):
        torch.manual_seed(5)
        module(x).backward()
        states.append(torch.get_rng_state())
    assert torch.equal(*states)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad)
