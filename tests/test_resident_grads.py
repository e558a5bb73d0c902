"""Steps that begin with gradients in place (NOTE [Gradients resident at the start]):
accumulating over micro-batches, or zero_grad(set_to_none=False), stays within the limit
(unplanned, such a step measured one set of gradients over it), trains bitwise like the same
loop on the store-all plan and within 1e-5 of eager; a limit too small to hold them raises
and changes nothing."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import monet_opt
from monet_opt import recompute
from tests import models
from tests.records import assert_same

HUGE = 1 << 40
MICRO = 2  # micro-batches per optimizer step


def call(module, x, flip: bool = False):
    """module on x (a tensor, or a dict of keyword arguments), its batch reversed if flip."""
    turn = (lambda t: t.flip(0)) if flip else (lambda t: t)  # noqa: E731
    return module(**{k: turn(v) for k, v in x.items()}) if isinstance(x, dict) \
        else module(turn(x))


def accumulate(module, owner, x, loss_fn, set_to_none=True, steps=2, seed=7):
    """`steps` optimizer steps, each over MICRO micro-batches (x, then x reversed); each
    optimizer step's gradients and generator state, and the state after the last."""
    opt = torch.optim.SGD(owner.parameters(), lr=0.05, momentum=0.9)
    record = []
    for step in range(steps):
        for k in range(MICRO):
            torch.manual_seed(seed + step * MICRO + k)
            (loss_fn(call(module, x, flip=k % 2 == 1)) / MICRO).backward()
        record.append({"rng": torch.get_rng_state(),
                       **{n: p.grad.clone() for n, p in owner.named_parameters()}})
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    return record, {k: v.clone() for k, v in owner.state_dict().items()}


def peak_with_gradients_in_place(opt, x, loss_fn) -> int:
    model = opt.model
    model.zero_grad(set_to_none=True)
    loss_fn(call(opt, x)).backward()
    resident = monet_opt.resident_tensors(model, x)
    peak = monet_opt.measure_peak(lambda: loss_fn(call(opt, x)).backward(), resident)
    model.zero_grad(set_to_none=True)
    return peak


@pytest.mark.parametrize("factory,set_to_none", [
    (models.small_cnn, True), (models.small_cnn, False), (models.gpt2_tiny, True)],
    ids=["cnn", "cnn_zero_grad_kept", "gpt2_tied"])
def test_accumulation_stays_within_the_limit_and_trains_exactly(factory, set_to_none):
    torch.manual_seed(0)
    base, x, loss_fn = factory()
    store_all = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1)
    grads = store_all.plan.gradient_bytes
    limit = store_all.plan.min_feasible_bytes + grads  # room for the resident gradients
    tight = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1, time_limit_s=5)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = accumulate(tight, tight.model, x, loss_fn, set_to_none)
    replans = [w for w in seen if issubclass(w.category, monet_opt.ReplanWarning)]
    assert len(replans) == 1 and "gradients resident" in str(replans[0].message)
    assert len(tight.plans) == 2
    resident = next(p for label, p in tight.plans.items() if "resident" in label)
    scalar = torch.tensor(-0.0).untyped_storage().nbytes()  # NOTE [Accumulating in place]
    # and the generator states each plan keeps (NOTE [States kept only where used])
    states = resident.fixed_bytes - (tight.plan.fixed_bytes + grads + scalar)
    assert states % recompute.rng_state_nbytes("cpu") == 0
    assert resident.predicted_peak_bytes <= limit
    assert resident.recomputed_ops >= tight.plan.recomputed_ops

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        assert_same(run, accumulate(store_all, store_all.model, x, loss_fn, set_to_none),
                    exact=True)
    eager = copy.deepcopy(base)
    assert_same(run, accumulate(eager, eager, x, loss_fn, set_to_none), exact=False)

    measured = peak_with_gradients_in_place(tight, x, loss_fn)
    assert measured <= limit, f"measured {measured} B over the limit {limit} B"
    # the loss scalars and the -0.0 scalar count from the step's start (a forward peak is
    # before them): at most 16 B over the measurement here, never under it
    assert measured <= resident.predicted_peak_bytes <= measured + 16


def test_gradients_are_added_in_place_as_they_are_made():
    """NOTE [Accumulating in place]: with gradients in place, the store-all plan's step holds
    less than one more set of gradients than a step without them (it used to hold exactly
    one more set: all the new ones at the end, beside the old), and measures its prediction.
    The first step with gradients resident plans, and the allocation events would count the
    planning's memory (NOTE [Allocation events]): one such step is run before the measured."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        for _ in range(2):  # the second plans for the gradients the first left resident
            loss_fn(call(opt, x)).backward()
        measured = peak_with_gradients_in_place(opt, x, loss_fn)
    plan = next(p for label, p in opt.plans.items() if "resident" in label)
    # as in the test above: the loss scalars and the -0.0 scalar count from the step's start
    assert measured <= plan.predicted_peak_bytes <= measured + 16
    # kernels' scratch counted, the store-all step peaks early in the backward, where few
    # gradients are made yet: less than one set more, no longer less than half a set
    grads = opt.plan.gradient_bytes
    assert measured < opt.plan.predicted_peak_bytes + grads


def test_autograd_grad_and_tensor_hooks_see_the_new_gradient():
    """Where eager would not accumulate into the gradient in place (torch.autograd.grad, a
    tensor hook that must see the new gradient first), the backward does not either."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    ref = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    for m in (opt, ref):
        torch.manual_seed(5)
        loss_fn(m(x)).backward()
    before = {n: p.grad.clone() for n, p in model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        torch.manual_seed(6)
        ours = torch.autograd.grad(loss_fn(opt(x)), list(model.parameters()))
    torch.manual_seed(6)
    theirs = torch.autograd.grad(loss_fn(ref(x)), list(ref.parameters()))
    assert all(torch.equal(p.grad, before[n]) for n, p in model.named_parameters())
    for (name, _), a, b in zip(model.named_parameters(), ours, theirs):
        assert torch.equal(a, b), name
    seen = []
    handle = model.head[4].weight.register_hook(lambda g: seen.append(g.clone()))
    torch.manual_seed(7)
    loss_fn(opt(x)).backward()
    handle.remove()
    expected = torch.autograd.grad(loss_fn(_seeded(ref, x, 7)), [ref.head[4].weight])[0]
    assert torch.equal(seen[0], expected)
    assert torch.equal(model.head[4].weight.grad, before["head.4.weight"] + seen[0])


def _seeded(module, x, seed):
    torch.manual_seed(seed)
    return module(x)


def _at_least_with_gradients_in_place():
    """small_cnn optimized at its least peak, one step run (its gradients now in place); the
    store-all module of it too. The least peak is that plan's own: the one reported counts
    every generator state, which it need not keep (NOTE [States kept only where used])."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    store_all = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    least = monet_opt.optimize(model, x, store_all.plan.min_feasible_bytes, profile_repeats=1,
                               time_limit_s=5).plan.predicted_peak_bytes
    opt = monet_opt.optimize(model, x, least, profile_repeats=1, time_limit_s=5)
    loss_fn(opt(x)).backward()  # gradients now in place
    return model, x, loss_fn, store_all, opt


def test_a_limit_that_cannot_hold_the_gradients_raises_and_changes_nothing():
    model, x, loss_fn, store_all, opt = _at_least_with_gradients_in_place()
    least = opt.plan.memory_limit_bytes
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        opt(x)
    # the gradients in place cost memory, less than a whole set (NOTE [Accumulating in place])
    scalar = torch.tensor(-0.0).untyped_storage().nbytes()
    assert least < info.value.min_feasible_bytes <= least + store_all.plan.gradient_bytes + scalar
    assert any("gradients resident" in note and "set_to_none" in note
               for note in info.value.__notes__)
    assert str(info.value).startswith("monet_opt: memory_limit")  # not optimize(): opt(x)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())
    model.zero_grad(set_to_none=True)
    loss_fn(opt(x)).backward()  # the first plan still trains


def test_the_step_with_gradients_in_place_is_offered_the_schedules_found_without(monkeypatch):
    """NOTE [Schedules found for the step without gradients in place]: however far a clock
    cuts the search on the step with gradients in place (here it finds nothing at all), its
    least peak is no worse than the plan the module already ran, plus the gradients in place."""
    from solvers import Status, registry
    model, x, loss_fn, store_all, opt = _at_least_with_gradients_in_place()
    least = opt.plan.memory_limit_bytes
    found_nothing = {"solver": "auto", "status": Status.TIMEOUT, "schedule": None,
                     "objective_s": None, "peak_bytes": None, "bound_s": None, "gap": None,
                     "solve_time_s": 0.0, "min_feasible_bytes": None}
    monkeypatch.setattr(registry.portfolio, "best_of",
                        lambda search, limit: registry.SolveResult(**found_nothing))
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        opt(x)
    scalar = torch.tensor(-0.0).untyped_storage().nbytes()
    assert least < info.value.min_feasible_bytes <= least + store_all.plan.gradient_bytes + scalar


def _three_linears() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return (torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)),
            torch.randn(32, 16), torch.randn(32, 16))


def _grads(module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


def _eager_then_optimized(base, x, profile_dir):
    """(a copy of `base`, itself), then (another copy, that copy optimized on `x`)."""
    for optimized in (False, True):
        model = copy.deepcopy(base)
        yield model, monet_opt.optimize(model, x, HUGE, profile_dir=profile_dir) \
            if optimized else model


def test_two_calls_in_one_backward_add_into_their_own_parameters(tmp_path):
    """NOTE [The parameter a backward adds into]: functional_call with other weights, then the
    module, in one backward, gradients in place: each call's gradients went into the other's
    (0.35 from eager's, with only a StepsInFlightWarning)."""
    base, x1, x2 = _three_linears()
    out = []
    for model, module in _eager_then_optimized(base, x1, tmp_path):
        fast = {k: (v.detach() * 1.5).requires_grad_() for k, v in base.named_parameters()}
        prefix = "model." if module is not model else ""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", monet_opt.StepsInFlightWarning)
            for _ in range(3):
                loss = torch.func.functional_call(
                    module, {prefix + k: v for k, v in fast.items()}, (x1,)).square().mean()
                (loss + module(x2).square().mean()).backward()
        out.append(_grads(model) + [v.grad for v in fast.values()])
    for eager, ours in zip(*out):
        assert torch.equal(eager, ours)


def test_a_deep_copy_adds_into_its_own_parameters(tmp_path):
    """A deep copy made after the accumulating step was planned shares its compiled backward,
    which named the original's parameters: run with the original in one backward, both
    modules' gradients were wrong (up to 90 from eager's)."""
    base, x1, x2 = _three_linears()
    model = copy.deepcopy(base)
    opt = monet_opt.optimize(model, x1, HUGE, profile_dir=tmp_path)
    opt(x1).sum().backward()
    opt(x1).sum().backward()  # the step with gradients in place is planned
    opt.zero_grad()
    twin = copy.deepcopy(opt)
    eager, eager_twin = copy.deepcopy(base), copy.deepcopy(base)
    with torch.no_grad():
        for p in [*twin.parameters(), *eager_twin.parameters()]:
            p.mul_(1.5)
    for a, b in ((eager, eager_twin), (opt, twin)):
        for x in (x1, x2):
            (a(x).square().sum() + b(x).square().sum()).backward()
    for e, o in zip(_grads(eager) + _grads(eager_twin), _grads(opt) + _grads(twin)):
        assert torch.equal(e, o)


def test_a_parameter_frozen_before_the_backward_keeps_its_gradient(tmp_path):
    """Gradients in place, a parameter frozen between the forward and the backward: eager's
    AccumulateGrad leaves its gradient as it was; the step raised ("It is not possible to get
    the gradient edge for a Tensor that does not require gradients")."""
    base, x1, _ = _three_linears()
    done = []
    for model, module in _eager_then_optimized(base, x1, tmp_path):
        module(x1).sum().backward()
        frozen = next(model.parameters())
        out = module(x1)
        frozen.requires_grad_(False)
        out.sum().backward()
        done.append(_grads(model))
    for eager, ours in zip(*done):
        assert torch.equal(eager, ours)
