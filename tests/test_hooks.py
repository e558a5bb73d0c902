"""NOTE [Module hooks]: hooks in place when optimize() traces are in the step (what they compute
on tensors, bitwise eager's), with a HookWarning about their side effects; hooks added or removed
later make a training step refuse (PlanMismatchError) until they are restored."""
from __future__ import annotations

import copy

import pytest
import torch

import monet_opt
from tests import models

HUGE = 1 << 40


def _scale(module, inputs, output):
    return output * 0.5


def _step(module, owner, x, loss_fn):
    torch.manual_seed(1)
    loss_fn(module(x)).backward()
    grads = [p.grad.clone() for p in owner.parameters()]
    owner.zero_grad(set_to_none=True)
    return grads


def test_a_hook_in_place_when_traced_is_in_the_step_with_a_warning():
    torch.manual_seed(0)
    model, x, loss_fn = models.mlp()
    model.net[1].register_forward_hook(_scale)
    eager = copy.deepcopy(model)
    with pytest.warns(monet_opt.HookWarning, match=r"MLP has module hooks: net\.1 \(forward "
                                                    r"hooks\).*side effects"):
        least = monet_opt.optimize(model, x, HUGE, profile_repeats=1,
                                   profile_dir=None).plan.min_feasible_bytes
    with pytest.warns(monet_opt.HookWarning):
        opt = monet_opt.optimize(model, x, least, profile_repeats=1, profile_dir=None)
    assert opt.plan.recomputed_ops > 0
    plain = copy.deepcopy(eager)
    plain.net[1]._forward_hooks.clear()
    ours, theirs, unhooked = (_step(m, o, x, loss_fn) for m, o in
                              ((opt, model), (eager, eager), (plain, plain)))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert not all(torch.equal(a, b) for a, b in zip(ours, unhooked))  # the hook mattered


def test_hooks_changed_after_optimize_refuse_the_step_until_restored():
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    handle = model.stem[0].register_forward_pre_hook(lambda module, args: None)
    with pytest.raises(monet_opt.PlanMismatchError, match=r"added or removed.*stem\.0 \(forward "
                                                         r"pre hooks\).*optimize\(\) again"):
        opt(x)
    with torch.no_grad():  # the model itself runs: nothing to refuse
        opt(x)
    handle.remove()
    glob = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        with pytest.raises(monet_opt.PlanMismatchError, match=r"global \(forward hooks\)"):
            opt(x)
    finally:
        glob.remove()
    loss_fn(opt(x)).backward()  # restored: the step runs
    assert all(p.grad is not None for p in model.parameters())
