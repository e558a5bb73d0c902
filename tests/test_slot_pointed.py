"""NOTE [A slot pointed at another module] (monet_opt/walk.py): a slot pointed at another of the
model's modules (`model.head = model.heads[task]`, a Sequential's slot, a ModuleList of a
subset of the layers made anew) walks alike, and the step traced for the first layout trained
the first head where eager trains the one pointed at, silently. Each layout is planned anew,
with a ReplanWarning naming the slot, and trains bitwise like eager."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import monet_opt


class _Heads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Dropout(0.1))
        self.heads = nn.ModuleList(nn.Linear(16, 4) for _ in range(3))
        self.acts = nn.ModuleList([nn.Tanh(), nn.Sigmoid()])
        self.head, self.act = self.heads[0], self.acts[0]
        self.active = nn.ModuleList([self.heads[0]])

    def forward(self, x):
        h = self.act(self.head(self.body(x)))
        return h + sum(layer(self.body[0](x)) for layer in self.active)


def _point(model: nn.Module, head: int, act: int, active: list[int]) -> None:
    model.head, model.act = model.heads[head], model.acts[act]
    model.active = nn.ModuleList(model.heads[k] for k in active)  # a new list each time


CHANGES = [(1, 0, [0]), (1, 1, [0]), (1, 1, [2, 1]), (0, 0, [0]), (2, 0, [1])]


def test_a_slot_pointed_at_another_module_trains_like_eager():
    torch.manual_seed(0)
    model, x = _Heads(), torch.randn(8, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, 1 << 30, profile_dir=None, profile_repeats=1)
    messages = []
    for step, change in enumerate(CHANGES):
        for m in (eager, model):
            _point(m, *change)
            m.zero_grad(set_to_none=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", monet_opt.ReplanWarning)
            torch.manual_seed(step)
            out = opt(x)
            out.square().sum().backward()
        messages += [str(w.message) for w in caught
                     if issubclass(w.category, monet_opt.ReplanWarning)]
        torch.manual_seed(step)
        expected = eager(x)
        expected.square().sum().backward()
        assert torch.equal(out, expected), change
        for (what, p), q in zip(model.named_parameters(), eager.parameters()):
            assert (p.grad is None) == (q.grad is None), (change, what)
            assert p.grad is None or torch.equal(p.grad, q.grad), (change, what)
    assert "module 'head' heads.0 -> heads.1" in messages[0]
    assert "module 'act' acts.0 -> acts.1" in messages[1]
    assert "module 'active' holds 2 modules, not 1" in messages[2]
    assert "module 'active.0' heads.0 -> heads.1" in messages[3]
    assert len(messages) == 4  # the layout of optimize() met again runs its first step


@pytest.mark.parametrize("slot", ["head", "act"])
def test_a_layout_met_again_runs_its_step_without_planning(slot):
    torch.manual_seed(0)
    model, x = _Heads(), torch.randn(8, 16)
    opt = monet_opt.optimize(model, x, 1 << 30, profile_dir=None, profile_repeats=1)
    replans = []
    for k in (1, 0, 1, 0):
        setattr(model, slot, getattr(model, slot + "s")[k])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", monet_opt.ReplanWarning)
            opt(x).sum().backward()
        model.zero_grad(set_to_none=True)
        replans.append(sum(issubclass(w.category, monet_opt.ReplanWarning) for w in caught))
    assert replans == [1, 0, 0, 0]
    assert len(opt.plans) == 2
