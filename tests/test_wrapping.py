"""The optimized module inside torch.compile, pickle and deepcopy (NOTE [Compiled around] in
monet_opt/module_state.py)."""
from __future__ import annotations

import contextlib
import copy
import io
import pickle
import warnings

import pytest
import torch

import monet_opt
from monet_opt.module import ReplanWarning
from tests.models import small_cnn

HUGE = 1 << 40


def _least(base, x) -> monet_opt.OptimizedModule:
    full = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_dir=None, profile_repeats=1)
    return monet_opt.optimize(copy.deepcopy(base), x, full.plan.min_feasible_bytes,
                              profile_dir=None, profile_repeats=1, time_limit_s=5,
                              new_shapes="plan")


def _at_prediction(peak: int, plan) -> bool:
    """The measured peak is the plan's prediction; a peak in the forward measures under it by
    the loss and its seed (two 4 B scalars the plan counts for the whole step: NOTE [The loss
    scalar] in monet_opt/api.py). Which phase peaks is the solver's choice, which a loaded
    machine's time-limited MILP makes otherwise."""
    below = 8 if ", forward," in plan.peak_op else 0
    return peak == plan.predicted_peak_bytes - below


def _step(module, params, x, loss_fn):
    """(measured peak, gradients) of one step; gradients cleared after."""
    peak = monet_opt.measure_peak(lambda: loss_fn(module(x)).backward(),
                                  monet_opt.resident_tensors(params, x))
    grads = [p.grad.clone() for p in params.parameters()]
    params.zero_grad(set_to_none=True)
    return peak, grads


def test_torch_compile_around_runs_the_plan():
    """torch.compile(opt) runs the least plan at its prediction with eager's gradients, and a
    batch of a new shape is planned under it (before: CaptureError, traced inside Dynamo), its
    ReplanWarning naming the caller's line (not torch's). Each batch is measured on its second
    step: the allocation events of one that plans (or compiles) hold the planning's memory
    (NOTE [Allocation events] in monet_opt/alloc_events.py)."""
    torch.manual_seed(0)
    base, x, loss_fn = small_cnn()
    opt = _least(base, x)
    assert opt.plan.recomputed_ops > 0
    compiled = torch.compile(opt)
    for batch in (x, x[:3].clone()):  # a batch of its own (NOTE [Inputs viewing more])
        eager = copy.deepcopy(base)
        torch.manual_seed(1)
        _, want = _step(eager, eager, batch, loss_fn)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(2):
                torch.manual_seed(1)
                peak, grads = _step(compiled, opt.model, batch, loss_fn)
        replans = [w for w in seen if w.category is ReplanWarning]
        assert len(replans) == (batch is not x)
        assert all(w.filename == __file__ for w in replans)  # the line that called the module
        plan = opt.plans[f"float32[{'x'.join(map(str, batch.shape))}]"]
        assert _at_prediction(peak, plan), (batch.shape, peak, plan.predicted_peak_bytes)
        assert all(torch.equal(g, w) for g, w in zip(grads, want)), batch.shape
    assert len(opt.plans) == 2


def test_pickling_says_what_to_save():
    base, x, loss_fn = small_cnn()
    opt = monet_opt.optimize(base, x, HUGE, profile_dir=None, profile_repeats=1)
    for save in (lambda: torch.save(opt, io.BytesIO()), lambda: pickle.dumps(opt)):
        with pytest.raises(TypeError, match=r"cannot be pickled.*opt\.state_dict\(\)"):
            save()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)  # what it says to save instead
    buffer.seek(0)
    assert torch.load(buffer).keys() == base.state_dict().keys()
    # a WithLoss's keys are its network's under "model.": it said to save those all the same
    wrapped = monet_opt.optimize(monet_opt.WithLoss(base, lambda out, y: loss_fn(out)),
                                 (x, x), HUGE, profile_dir=None, profile_repeats=1)
    with pytest.raises(TypeError, match=r"opt\.model\.model\.state_dict\(\), path\) \(the network"):
        pickle.dumps(wrapped)
    assert wrapped.model.model.state_dict().keys() == base.state_dict().keys()


def test_shallow_copy_shares_the_model():
    base, x, loss_fn = small_cnn()
    opt = monet_opt.optimize(base, x, HUGE, profile_dir=None, profile_repeats=1)
    twin = copy.copy(opt)
    assert type(twin) is type(opt) and twin.model is opt.model
    loss_fn(twin(x)).backward()
    assert all(p.grad is not None for p in opt.model.parameters())


def test_deep_copy_trains_its_own_parameters():
    base, x, loss_fn = small_cnn()
    opt = monet_opt.optimize(base, x, HUGE, profile_dir=None, profile_repeats=1)
    twin = copy.deepcopy(opt)
    assert type(twin) is type(opt) and twin.model is not opt.model
    loss_fn(twin(x)).backward()
    assert all(p.grad is not None for p in twin.model.parameters())
    assert all(p.grad is None for p in opt.model.parameters())


def test_a_deep_copy_plans_its_own_model():
    """A deep copy planned its steps by tracing the original's model (the function that plans
    them held it): the copy's model put in eval mode trained as the original in train mode
    (loss 0.17 against eager's 0.013), and a hook registered on the copy did nothing. (Its
    BatchNorms and dropout put in eval mode, not the model: the model's mode is the wrapper's,
    NOTE [Optimized in eval mode], and in eval mode with other flags it runs the model.)"""
    torch.manual_seed(0)
    base, x, loss_fn = small_cnn()
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_dir=None, profile_repeats=1)
    twin, eager = copy.deepcopy(opt), copy.deepcopy(base)
    for model in (twin.model, eager):
        for module in model.modules():
            if isinstance(module, (torch.nn.BatchNorm2d, torch.nn.Dropout)):
                module.eval()
        model.stem[0].register_forward_hook(lambda module, args, out: out * 2.0)
    with pytest.warns(ReplanWarning):
        _, grads = _step(twin, twin.model, x, loss_fn)
    _, want = _step(eager, eager, x, loss_fn)
    assert all(torch.equal(g, w) for g, w in zip(grads, want))
    assert all(torch.equal(a, b) for a, b in zip(twin.model.buffers(), eager.buffers()))
    assert all(torch.equal(a, b) for a, b in zip(opt.model.buffers(), base.buffers()))


def test_a_state_dict_round_trip_through_a_larger_model():
    """An optimized backbone inside a larger model gives the parent's state_dict() the model's
    own keys; the parent's load_state_dict() loads them back (before: "Missing key(s)
    backbone.model.0.weight", and with strict=False nothing loaded into the backbone, silently).
    NOTE [The model's own keys] in monet_opt/module.py."""
    base, x, _ = small_cnn()
    big = torch.nn.Sequential(monet_opt.optimize(base, x, HUGE, profile_dir=None,
                                                 profile_repeats=1), torch.nn.Flatten())
    saved = big.state_dict()
    assert set(saved) == {f"0.{key}" for key in base.state_dict()}
    for strict in (True, False):
        changed = {key: value + 1 for key, value in saved.items()}
        result = big.load_state_dict(changed, strict=strict)
        assert not result.missing_keys and not result.unexpected_keys
        assert all(torch.equal(big.state_dict()[key], changed[key]) for key in saved)
        assert set(changed) == set(saved)  # the caller's dict as it was


def test_an_optimized_module_given_to_optimize_is_traced_as_its_model():
    """An optimized module inside a model given to optimize(), or given itself, is traced as its
    model (before: CaptureError, "invalid python storage", on every route): the outer least plan
    measures its prediction with eager's gradients (NOTE [Optimized inside optimized])."""
    torch.manual_seed(0)
    base, x, loss_fn = small_cnn()
    inner = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_dir=None,
                               profile_repeats=1)
    eager = copy.deepcopy(base)
    torch.manual_seed(1)
    _, want = _step(eager, eager, x, loss_fn)
    for given in (torch.nn.Sequential(inner), inner):
        opt = _least(given, x)
        assert opt.plan.recomputed_ops > 0
        assert not isinstance(opt.model, monet_opt.OptimizedModule)
        torch.manual_seed(1)
        peak, grads = _step(opt, opt.model, x, loss_fn)
        assert _at_prediction(peak, opt.plan), (type(given), peak, opt.plan.predicted_peak_bytes)
        assert all(torch.equal(g, w) for g, w in zip(grads, want)), type(given)


def test_the_inner_module_called_alone_plans_no_outer_step():
    """The inner module called alone between outer steps (an auxiliary loss on a backbone)
    sets its own bookkeeping; the outer step read it as its constants and planned again, with a
    ReplanWarning naming `_watched_list` (NOTE [An optimized module's own state])."""
    torch.manual_seed(0)
    base, x, loss_fn = small_cnn()
    inner = monet_opt.optimize(base, x, HUGE, profile_dir=None, profile_repeats=1)
    outer = monet_opt.optimize(torch.nn.Sequential(inner), x, HUGE, profile_dir=None,
                               profile_repeats=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplanWarning)
        for module in (outer, inner, outer, inner, outer):
            loss_fn(module(x)).backward()
            base.zero_grad(set_to_none=True)
    assert len(outer.plans) == len(inner.plans) == 1


def test_functional_call_with_fast_weights():
    """torch.func.functional_call(opt, weights) as a first-order MAML inner loop makes them:
    non-leaf tensors computed from the parameters. The step takes them as they are (no warning
    about a non-leaf's .grad), and the outer gradients are eager's, bitwise."""
    torch.manual_seed(0)
    base, x, loss_fn = small_cnn()
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_dir=None, profile_repeats=1)
    eager = copy.deepcopy(base)
    grads = []
    for module, owner in ((opt, opt.model), (eager, eager)):
        names = [n for n, _ in module.named_parameters()]
        torch.manual_seed(1)
        inner = loss_fn(torch.func.functional_call(module, dict(module.named_parameters()), x))
        steps = torch.autograd.grad(inner, list(module.parameters()))
        fast = {n: p - 0.1 * g for n, p, g in zip(names, module.parameters(), steps)}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.manual_seed(2)
            loss_fn(torch.func.functional_call(module, fast, x)).backward()
        grads.append([p.grad for p in owner.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_the_models_own_names_reach_through():
    """functional_call(opt, opt.state_dict(), x) (the model's own keys) raised a bare
    AttributeError ("OptimizedModule has no attribute 'conv1'"); the model's attributes are
    reached through the module, as through torch.compile's."""
    torch.manual_seed(0)
    base, x, loss_fn = small_cnn()
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_dir=None, profile_repeats=1)
    eager = copy.deepcopy(base)
    first = next(iter(dict(base.named_children())))
    assert getattr(opt, first) is getattr(opt.model, first)
    grads = []
    for module in (opt, eager):
        weights = {k: (v * 1.5).detach().requires_grad_() for k, v in base.named_parameters()}
        torch.manual_seed(1)
        loss_fn(torch.func.functional_call(module, weights, x)).backward()
        grads.append([w.grad for w in weights.values()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        opt.nothing_here


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.act = torch.nn.Linear(8, 32), torch.nn.Linear(32, 4), torch.nn.ReLU()
        self.scale, self._hooks = 1.0, ["the model's own"]

    def forward(self, x):
        return self.b(self.act(self.a(x)) * self.scale)


def test_attributes_set_on_the_module_are_the_models():
    """NOTE [The model's attributes through the optimized module]: `opt.scale = 2.0; opt.act =
    nn.Tanh()` stayed on the wrapper (read back 2.0) while the step ran the model's 1.0 and ReLU,
    1.17 from eager's, and the Tanh became the wrapper's child. Now they are set
    on the model, planned for, and the step is eager's; the wrapper's own state stays its own
    though the model has an attribute of that name."""
    torch.manual_seed(0)
    model, x = _Scaled(), torch.randn(16, 8)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    assert model._hooks == ["the model's own"] and opt._hooks != model._hooks
    for module in (opt, eager):
        module.scale, module.act = 2.0, torch.nn.Tanh()
        module.extra = 3
    assert model.scale == 2.0 and isinstance(model.act, torch.nn.Tanh) and model.extra == 3
    assert [n for n, _ in opt.named_children()] == ["model"]
    with pytest.warns(ReplanWarning):
        out = opt(x)
    assert torch.equal(out, eager(x))
    del opt.extra
    assert not hasattr(model, "extra")


def test_what_is_registered_on_the_module_is_the_models():
    """NOTE [Registered through it]: a parameter, buffer or submodule registered on the wrapper
    trained but was left out of its state_dict (a strict load matched all keys and lost it)."""
    opt = monet_opt.optimize(_Scaled(), torch.randn(16, 8), HUGE, profile_dir=None,
                             profile_repeats=1)
    opt.register_parameter("logit_scale", torch.nn.Parameter(torch.tensor(2.0)))
    opt.register_buffer("seen", torch.zeros(3))
    opt.add_module("extra", torch.nn.Linear(2, 2))
    assert {"logit_scale", "seen", "extra.weight"} <= set(opt.state_dict())
    assert [n for n, _ in opt.named_children()] == ["model"]
    fresh = _Scaled()
    fresh.register_parameter("logit_scale", torch.nn.Parameter(torch.tensor(1.0)))
    fresh.register_buffer("seen", torch.ones(3))
    fresh.add_module("extra", torch.nn.Linear(2, 2))
    fresh.load_state_dict(opt.state_dict())
    assert fresh.logit_scale.item() == 2.0 and fresh.seen.sum().item() == 0


def test_planned_inside_parametrize_cached():
    """NOTE [Parametrizations cached around a trace]: optimize() and a new batch shape planned
    inside parametrize.cached() (both raised CaptureError, 'Unexpected fake buffer'); a
    weight_norm'd layer read twice trains with eager's gradients, in the block and out."""
    from torch.nn.utils import parametrize
    from torch.nn.utils.parametrizations import weight_norm

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = weight_norm(torch.nn.Linear(8, 8))

        def forward(self, x):
            return self.lin(torch.tanh(self.lin(x)))

    torch.manual_seed(0)
    model, x = Twice(), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    with parametrize.cached():
        opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1,
                                 new_shapes="plan")
    for batch, cached in ((x, True), (x[:3].clone(), True), (x, False)):
        with parametrize.cached() if cached else contextlib.nullcontext(), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", ReplanWarning)
            opt(batch).sum().backward()
            eager(batch).sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad)
    assert len(opt.plans) == 3  # the block open or not is part of a step's key
