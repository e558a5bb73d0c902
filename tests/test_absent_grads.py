"""NOTE [Outputs the loss does not read] in monet_opt/absent_grads.py: parameters only an unread
output depends on keep a gradient of None, as in eager, so AdamW leaves them alone."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt
from tests.records import at_least_peak

HUGE = 1 << 40


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.1))
        self.a, self.b = nn.Linear(64, 4), nn.Sequential(nn.Linear(64, 32), nn.Tanh(),
                                                         nn.Linear(32, 3))

    def forward(self, x):
        h = self.body(x)
        return self.a(h), self.b(h)


def _optimized(model, x, least: bool):
    if least:
        return at_least_peak(model, x)[0]
    return monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)


@pytest.mark.parametrize("least", [False, True])
def test_an_unread_head_keeps_no_gradient_and_adamw_leaves_it(least):
    """Its gradients came back as zeros: AdamW decayed the head (1.25e-4 after a step) and kept
    state for it. Four steps alternating which heads the loss reads (with nothing recomputed,
    the second adds into the first's gradients; at the least peak, where gradients in place do
    not fit, each starts from none): every parameter and gradient as eager's, bitwise."""
    torch.manual_seed(0)
    model, x = _TwoHeads(), torch.randn(32, 8)
    eager = copy.deepcopy(model)
    opt = _optimized(model, x, least)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in (model, eager)]
    for step, heads in enumerate(((0,), (0,), (0, 1), (1,))):
        for module, owner, adam in zip((opt, eager), (model, eager), optimizers):
            torch.manual_seed(step)
            outs = module(x)
            sum(outs[k].square().sum() for k in heads).backward()
            if 1 not in heads:
                assert all(p.grad is None for p in owner.b.parameters())
            if step != 0 or least:  # the first's gradients stay for the second to add into
                adam.step()
                adam.zero_grad(set_to_none=True)
        for p, q in zip(model.parameters(), eager.parameters()):
            assert torch.equal(p, q)
            assert (p.grad is None) == (q.grad is None)
    assert [len(s) for s in optimizers[0].state.values()] == \
        [len(s) for s in optimizers[1].state.values()]


def test_autograd_grad_of_one_output_gives_none_for_the_other_heads():
    torch.manual_seed(0)
    model, x = _TwoHeads(), torch.randn(32, 8)
    eager = copy.deepcopy(model)
    opt = _optimized(model, x, False)
    got = []
    for module, owner in ((opt, model), (eager, eager)):
        torch.manual_seed(1)
        got.append(torch.autograd.grad(module(x)[0].sum(), list(owner.parameters()),
                                       allow_unused=True))
    for ours, theirs in zip(*got):
        assert (ours is None and theirs is None) or torch.equal(ours, theirs)
    assert got[0][-1] is None


def test_an_optimizer_in_the_backward_steps_only_what_eager_steps():
    """NOTE [Hooks of a parameter handed nothing]: the unread head was handed zeros, so an
    optimizer stepped in a post-accumulate-grad hook (PyTorch's recipe) moved it by its
    momentum; eager never runs its hooks. Its hooks are held back for that backward only."""
    torch.manual_seed(0)
    model, x = _TwoHeads(), torch.randn(32, 8)
    eager = copy.deepcopy(model)
    opt = _optimized(model, x, False)
    ran = {id(m): [] for m in (model, eager)}
    for owner in (model, eager):
        steps = {p: torch.optim.SGD([p], lr=0.1, momentum=0.9) for p in owner.parameters()}
        for name, p in owner.named_parameters():
            def step(p, name=name, owner=owner, steps=steps):
                ran[id(owner)].append(name)
                steps[p].step()
                steps[p].zero_grad()
            p.register_post_accumulate_grad_hook(step)
    for head in (0, 1, 0):  # the second reads head b: its hooks are back and run
        for module in (opt, eager):
            torch.manual_seed(1)
            module(x)[head].sum().backward()
    assert sorted(ran[id(model)]) == sorted(ran[id(eager)])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), eager.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_hooks_held_back_by_a_backward_that_raised_come_back():
    """The hooks are put back by the engine's final callback, which a backward that raises
    never runs: they were lost for good. The next step puts them back."""
    torch.manual_seed(0)
    model, x = _TwoHeads(), torch.randn(32, 8)
    opt = _optimized(model, x, False)
    ran = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: ran.append(name))
    out = opt(x)
    out[0].register_hook(lambda g: g)  # the step's node runs, handing head b nothing

    def fail(g):
        raise RuntimeError("stop")
    h = model.body[0].weight.register_hook(fail)  # raises after the step's node ran
    with pytest.raises(RuntimeError, match="stop"):
        out[0].sum().backward()
    h.remove()
    model.zero_grad(set_to_none=True)
    ran.clear()
    opt(x)[1].sum().backward()  # head b read: its hooks run
    assert {"b.0.weight", "b.2.bias"} <= set(ran)
