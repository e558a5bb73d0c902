"""Gradients in place that a step's backward cannot add into as its plan has it (NOTE [Gradients
the engine does not take] in monet_opt/accumulate.py), and an input's gradient in place (NOTE
[Inputs' gradients in place] in monet_opt/step.py): each step measures within its plan, or
says it cannot."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import monet_opt
from tests import models

HUGE = 1 << 40


def _tight(model, x):
    """model optimized a fifth of the way from its least peak to store-all."""
    store_all = monet_opt.optimize(model, x, HUGE, profile_repeats=1).plan
    limit = store_all.min_feasible_bytes + \
        (store_all.store_all_peak_bytes - store_all.min_feasible_bytes) // 5
    return monet_opt.optimize(model, x, limit, profile_repeats=1, time_limit_s=5)


def _resident_plan(opt):
    return next(p for label, p in opt.plans.items() if "resident" in label)


def _measured(opt, step, x) -> int:
    """The peak of step() with every gradient in place (zeros), after one such step planned."""
    model = opt.model
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", monet_opt.ReplanWarning)
            warnings.simplefilter("ignore", monet_opt.AccumulationWarning)
            peak = monet_opt.measure_peak(step, monet_opt.resident_tensors(model, x))
    return peak


def test_a_backward_leaving_parameters_out_measures_its_plan():
    """backward(inputs=[one weight]) with gradients in place: the gradients it leaves out were
    held to the backward's end, 18,596 B over the plan on the probe's CNN."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    opt = _tight(model, x)
    first = next(iter(model.parameters()))
    measured = _measured(opt, lambda: loss_fn(opt(x)).backward(inputs=[first]), x)
    plan = _resident_plan(opt)
    assert measured <= plan.predicted_peak_bytes <= plan.memory_limit_bytes
    eager = copy.deepcopy(model)
    for m in (model, eager):
        for p in m.parameters():
            p.grad = torch.ones_like(p)
    torch.manual_seed(3)
    loss_fn(opt(x)).backward(inputs=[first])
    torch.manual_seed(3)
    loss_fn(eager(x)).backward(inputs=[next(iter(eager.parameters()))])
    for a, b in zip(model.parameters(), eager.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_autograd_grad_over_gradients_in_place_says_it_holds_them():
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    opt = _tight(model, x)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.autograd.grad(loss_fn(opt(x)), list(model.parameters()))
    said = [w for w in seen if issubclass(w.category, monet_opt.AccumulationWarning)]
    assert len(said) == 2, [str(w.message) for w in seen]  # once per backward
    assert "torch.autograd.grad" in str(said[0].message)
    assert said[0].filename == __file__
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loss_fn(opt(x)).backward()  # added in place, as planned: nothing to say
    assert not [w for w in seen if issubclass(w.category, monet_opt.AccumulationWarning)]


def test_a_parameter_hooked_before_planning_is_planned_holding_its_gradient():
    """A tensor hook must see the new gradient, so the step does not add it in place: planned
    so, the step measures its prediction (it held 640 B over); hooked since, it says so."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    opt = _tight(model, x)
    hooked = list(model.parameters())[-2]
    seen = []
    handle = hooked.register_hook(lambda g: seen.append(g.clone()))
    measured = _measured(opt, lambda: loss_fn(opt(x)).backward(), x)
    assert measured <= _resident_plan(opt).predicted_peak_bytes <= measured + 16
    assert seen and torch.equal(hooked.grad, seen[-1])  # the hook saw the new gradient
    handle.remove()

    opt = _tight(copy.deepcopy(model), x)
    _measured(opt, lambda: loss_fn(opt(x)).backward(), x)  # planned with no hook
    hooked = list(opt.model.parameters())[-2]
    hooked.register_hook(lambda g: None)
    with pytest.warns(monet_opt.AccumulationWarning, match="tensor hook"):
        loss_fn(opt(x)).backward()


def _pgd(module, model, x, steps=3):
    """Three steps of a PGD-like loop: x.grad zeroed in place, so in place at each start."""
    losses = []
    for k in range(steps):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(k)
        loss = module(x).square().mean()
        loss.backward()
        with torch.no_grad():
            x.add_(0.01 * x.grad.sign())
        x.grad.zero_()
        losses.append(loss.detach())
    return losses


def test_an_inputs_gradient_in_place_is_planned_for():
    """x.grad kept between steps (PGD) was not counted: 12,288 B over the plan."""
    torch.manual_seed(0)
    model, x, _ = models.small_cnn()
    eager = copy.deepcopy(model)
    opt = _tight(model, x.clone().requires_grad_())
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    with pytest.warns(monet_opt.ReplanWarning, match="gradients resident"):
        losses = _pgd(opt, model, ours)
    assert all(map(torch.equal, losses, _pgd(eager, eager, theirs)))
    assert torch.equal(ours, theirs)
    plan = _resident_plan(opt)
    assert plan.fixed_bytes >= opt.plan.fixed_bytes + x.numel() * x.element_size()
    model.zero_grad(set_to_none=True)
    resident = monet_opt.resident_tensors(model, ours)
    assert any(t is ours.grad for t in resident)
    measured = monet_opt.measure_peak(lambda: opt(ours).square().mean().backward(), resident)
    assert measured <= plan.predicted_peak_bytes <= plan.memory_limit_bytes
