"""A second backward through a step: a retained graph run again (NOTE [Retained graphs]) and a
backward of a backward (NOTE [Double backward] in monet_opt/output_grad.py)."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import monet_opt
from tests import models

HUGE = 1 << 40


@pytest.mark.parametrize("make", [models.mlp, models.small_cnn])
@pytest.mark.parametrize("tight", [False, True])
def test_retain_graph_backwards_twice_like_eager(make, tight):
    """NOTE [Retained graphs]: after a plain step, backward(retain_graph=True), then backward
    again, gives eager's gradients bitwise each time, on the store-all plan and at the least
    peak (recomputation, variants, dropout replayed). Before, the retained backward raised a
    RuntimeError about donated buffers. The retained backward warns that it can pass the limit
    (it said nothing)."""
    torch.manual_seed(0)
    model, x, loss_fn = make()
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    if tight:
        opt = monet_opt.optimize(model, x, opt.plan.min_feasible_bytes, profile_repeats=1,
                                 profile_dir=None)
        assert opt.plan.recomputed_ops > 0
    grads = []
    for module, owner in ((eager, eager), (opt, model)):
        torch.manual_seed(1)
        loss_fn(module(x)).backward()
        seen = [p.grad.clone() for p in owner.parameters()]
        owner.zero_grad(set_to_none=True)
        loss = loss_fn(module(x))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss.backward(retain_graph=True)
            seen += [p.grad.clone() for p in owner.parameters()]
            loss.backward()
        # NOTE [Retained graphs, said]: the retained backward (not the last) passes the plan
        said = [w for w in caught if w.category is monet_opt.RetainedGraphWarning]
        assert len(said) == (module is opt)
        grads.append(seen + [p.grad.clone() for p in owner.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.filterwarnings("ignore::monet_opt.ReplanWarning")  # the penalty's input needs grad
def test_double_backward_says_what_to_do():
    """NOTE [Double backward]: a gradient penalty (WGAN-GP) through the optimized critic raises
    DoubleBackwardError saying to compute it with the model itself (it raised torch's "torch.
    compile with aot_autograd does not currently support double backward"); done so, beside a
    first-order loss through the plan, the critic's gradients are eager's, bitwise."""
    torch.manual_seed(0)
    critic = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.LeakyReLU(0.2),
                                 torch.nn.Linear(64, 1))
    real, mixed = torch.randn(8, 16), torch.randn(8, 16, requires_grad=True)
    eager = copy.deepcopy(critic)
    opt = monet_opt.optimize(critic, real, HUGE, profile_repeats=1, profile_dir=None)

    def penalty(module):
        slope, = torch.autograd.grad(module(mixed).sum(), mixed, create_graph=True)
        return (slope.norm(2, dim=1) - 1).square().mean()

    with pytest.raises(monet_opt.DoubleBackwardError, match=r"create_graph=True.*inside the "
                       r"optimized module's forward.*opt\.model"):
        penalty(opt)
    (-opt(real).mean() + 10 * penalty(opt.model)).backward()
    (-eager(real).mean() + 10 * penalty(eager)).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(critic.parameters(),
                                                             eager.parameters()))


@pytest.mark.filterwarnings("ignore::monet_opt.ReplanWarning")  # the penalty's input needs grad
def test_penalty_before_the_step_on_batchnorm_like_eager():
    """NOTE [The statistics' versions]: a penalty through `opt.model` computed before a step
    (its graph saves the BatchNorms' running statistics) and a loss of the model and the
    optimized module in one backward ran in eager and failed after the step ("modified by an
    inplace operation"): the step counted a write in the statistics' version counters, which
    eager's BatchNorm does not. Now both run, their gradients and statistics eager's."""
    torch.manual_seed(0)
    model, real, _ = models.small_cnn()
    mixed = torch.randn_like(real, requires_grad=True)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, real, HUGE, profile_repeats=1, profile_dir=None)
    states = []
    for module, critic in ((eager, eager), (opt, model)):
        torch.manual_seed(1)
        versions = [b._version for b in critic.buffers()]
        module(real).sum().backward()
        assert [b._version for b in critic.buffers()][:2] == versions[:2]  # running mean, var
        critic.zero_grad(set_to_none=True)  # else added in place, in another order (docs)
        slope, = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
        (10 * (slope.flatten(1).norm(dim=1) - 1).square().mean() - module(real).mean()
         ).backward()
        states.append([p.grad for p in critic.parameters()])
        critic.zero_grad(set_to_none=True)
        (critic(real).sum() + module(real).sum()).backward()
        states.append([p.grad for p in critic.parameters()] + list(critic.buffers()))
    assert all(torch.equal(a, b) for a, b in zip(states[0] + states[1], states[2] + states[3]))


def test_a_retained_graph_holding_the_output_is_not_the_caller():
    """A loss that saves the step's output (`square()`), its graph retained: the output is
    alive at the retained backward's end whatever the caller holds; OutputsHeldWarning said
    that the caller held it (advising `del out`) and planned the next steps holding outputs.
    The RetainedGraphWarning alone now; an output the caller does hold is still warned of."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    x = torch.randn(32, 16)
    opt = monet_opt.optimize(model, x, "100% of peak", profile_dir=None, profile_repeats=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = opt(x).square().mean()
        loss.backward(retain_graph=True)
        loss.backward()
    kinds = {w.category for w in caught}
    assert monet_opt.RetainedGraphWarning in kinds and monet_opt.OutputsHeldWarning not in kinds
    model.zero_grad(set_to_none=True)
    with pytest.warns(monet_opt.OutputsHeldWarning, match="the caller held"):
        out = opt(x)
        out.square().mean().backward()
