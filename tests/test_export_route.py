"""NOTE [What the export route leaves out] (monet_opt/export_route.py): torch.export is not
taken where its step would leave out backward hooks or hooks the forward registers on tensors,
and a model goes straight to it only where that model itself went there."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt import capture

HUGE = 1 << 40
LOG: list[float] = []


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4))


def _halve(module, grad_input, grad_output):
    return tuple(None if g is None else g * 0.5 for g in grad_input)


def test_backward_hooks_are_not_left_out_by_the_export_route():
    """A hook logging .item() fails the other routes; torch.export would have traced the model
    without its backward hooks, the halving one too (gradients twice eager's, silently)."""
    model = _mlp()
    model[2].register_full_backward_hook(_halve)
    model[4].register_full_backward_hook(
        lambda m, gin, gout: LOG.append(gout[0].norm().item()))
    with pytest.raises(monet_opt.CaptureError) as caught:
        monet_opt.optimize(model, torch.randn(8, 16), HUGE, profile_dir=None)
    message = str(caught.value)
    assert "would leave out the backward hooks at 2 (backward hooks), 4 (backward hooks)" \
        in message
    assert "test_export_route.py" in message and ".item()" in message


class _HookedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if h.requires_grad:
            h.register_hook(lambda g: (LOG.append(g.norm().item()), g * 0.5)[1])
        return self.b(h)


def test_a_tensor_hook_the_forward_registers_is_not_left_out():
    with pytest.raises(monet_opt.CaptureError) as caught:
        monet_opt.optimize(_HookedForward(), torch.randn(8, 16), HUGE, profile_dir=None)
    assert "would leave out the hook the forward registers on a tensor at " \
        f"{__file__}" in str(caught.value)


def test_the_export_route_is_remembered_for_the_model_not_its_class(monkeypatch):
    """After one nn.Sequential went through torch.export, another took it first too, and lost
    its backward hooks; now only the same model goes straight there."""
    routes = []
    compile_step = capture.compile_step

    def counting(model, spec, partition_fn, export_example=None, *more):
        routes.append("export" if export_example is not None else "other")
        return compile_step(model, spec, partition_fn, export_example, *more)

    monkeypatch.setattr(capture, "compile_step", counting)
    monkeypatch.setattr(capture, "_ROUTE", {})
    first, x = _mlp(), torch.randn(8, 16)
    with monkeypatch.context() as only:
        only.setattr(capture, "ROUTES", ("export",))
        monet_opt.optimize(first, x, HUGE, profile_dir=None, profile_repeats=1)
    assert routes == ["export"]
    routes.clear()
    monet_opt.optimize(first, x, HUGE, profile_dir=None, profile_repeats=1)
    assert routes == ["export"]
    routes.clear()
    second = _mlp()
    second[2].register_full_backward_hook(_halve)
    eager = copy.deepcopy(second)
    opt = monet_opt.optimize(second, x, HUGE, profile_dir=None, profile_repeats=1)
    assert routes == ["other"]
    opt(x).sum().backward()
    eager(x).sum().backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(second.parameters(),
                                                           eager.parameters()))


class _Detached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(8, 8)

    def forward(self, x):
        return self.f(x).detach()


def test_a_later_route_that_loses_the_backward_is_a_failed_route(monkeypatch):
    """NOTE [A route that loses the backward]: the first routes failed, the export route traced
    with no output requiring grad, and optimize() said the model had no backward (a
    reversible network's, whose eager step trains every parameter), the errors dropped."""
    x = torch.randn(4, 8)
    with pytest.raises(monet_opt.NoBackwardError):  # the first route says so: it has none
        monet_opt.optimize(_Detached(), x, HUGE, profile_dir=None)
    compile_step = capture.compile_step

    def failing(model, spec, partition_fn, export_example, leaves):
        if export_example is None:
            raise TypeError("expected a torch.ByteTensor, but got NoneType")
        return compile_step(model, spec, partition_fn, export_example, leaves)

    monkeypatch.setattr(capture, "compile_step", failing)
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)AOTAutograd: TypeError: expected a "
                       r"torch\.ByteTensor.*then AOTAutograd: traced, but with no output "
                       r"requiring grad"):
        monet_opt.optimize(_Detached(), x, HUGE, profile_dir=None)
