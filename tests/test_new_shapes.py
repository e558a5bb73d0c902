"""Inputs of other shapes than the sample's (NOTE [New input shapes]): an epoch that ends on a
smaller batch trains bitwise like the same loop on the store-all plan and within 1e-5 of eager,
within the limit, planning each new shape once; other mismatches and new_shapes="error" refuse;
a shape the limit cannot hold raises and leaves the model's state alone."""
from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch

import monet_opt
from monet_opt.units import format_bytes
from tests import models
from tests.records import assert_same

HUGE = 1 << 40


def epoch(module, owner, batches, loss_fn, seed=99):
    """One SGD step per batch, dropout on; each step's loss, gradients and generator state,
    and the state after the last."""
    opt = torch.optim.SGD(owner.parameters(), lr=0.05, momentum=0.9)
    record = []
    for k, x in enumerate(batches):
        torch.manual_seed(seed + k)
        loss = loss_fn(module(x))
        loss.backward()
        record.append({"loss": loss.detach().clone(), "rng": torch.get_rng_state(),
                       **{n: p.grad.clone() for n, p in owner.named_parameters()
                          if p.grad is not None}})
        opt.step()
        opt.zero_grad(set_to_none=True)
    return record, {k: v.clone() for k, v in owner.state_dict().items()}


def test_smaller_last_batch_trains_exactly_within_the_limit():
    torch.manual_seed(0)
    base, x, loss_fn = models.small_cnn()
    # full, full, short (new), short, full; a loader's short batch is a tensor of its own (a
    # slice of x views x's storage: NOTE [Inputs viewing more])
    batches = [x, x.flip(0), x[:3].clone(), x.flip(0)[:3].clone(), x]
    store_all = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1)
    limit = store_all.plan.min_feasible_bytes
    tight = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1, time_limit_s=5)
    assert tight.plan.recomputed_ops > 0

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = epoch(tight, tight.model, batches, loss_fn)
    new_shape = [w for w in seen if issubclass(w.category, monet_opt.ReplanWarning)]
    assert len(new_shape) == 1, "the short batch is planned once, the first time it is met"
    assert "float32[3x3x16x16]" in str(new_shape[0].message)
    assert list(tight.plans) == ["float32[4x3x16x16]", "float32[3x3x16x16]"]
    assert tight.plan is tight.plans["float32[4x3x16x16]"]

    eager = copy.deepcopy(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        assert_same(run, epoch(store_all, store_all.model, batches, loss_fn), exact=True)
    assert_same(run, epoch(eager, eager, batches, loss_fn), exact=False)

    short = x[:3].clone()
    plan = tight.plans["float32[3x3x16x16]"]
    _check_peak(tight, short, loss_fn, plan, limit)
    # met first inside a dispatch mode (the live-bytes counter): planned outside it, and the
    # plan measured on the next step (a step that plans has the planning's memory in its
    # allocation events: NOTE [Allocation events] in monet_opt/alloc_events.py)
    fresh = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1, time_limit_s=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        monet_opt.measure_peak(lambda: loss_fn(fresh(short)).backward(),
                               monet_opt.resident_tensors(fresh.model, short))
        fresh.model.zero_grad(set_to_none=True)
        _check_peak(fresh, short, loss_fn, None, limit)


def _check_peak(opt, short, loss_fn, plan, limit):
    """The measured peak of a step on `short` within `limit` and, once planned, at the plan's
    prediction (8 B under where it peaks in the forward: NOTE [The loss scalar])."""
    resident = monet_opt.resident_tensors(opt.model, short)
    measured = monet_opt.measure_peak(lambda: loss_fn(opt(short)).backward(), resident)
    opt.model.zero_grad(set_to_none=True)
    plan = plan or opt.plans["float32[3x3x16x16]"]
    assert plan.memory_limit_bytes == limit and plan.predicted_peak_bytes <= limit
    assert measured <= limit
    assert 0 <= plan.predicted_peak_bytes - measured <= 8, (plan.predicted_peak_bytes, measured)


def test_new_shapes_error_and_other_mismatches_refuse():
    model, x, _ = models.small_cnn()
    with pytest.raises(ValueError, match="new_shapes must be 'plan' or 'error'"):
        monet_opt.optimize(model, x, HUGE, new_shapes="replan")
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, new_shapes="error")
    with pytest.raises(monet_opt.PlanMismatchError, match=r"expected .*\[4, 3, 16, 16\].*"
                                                          r"received .*\[2, 3, 16, 16\]"):
        opt(x[:2])
    with pytest.raises(monet_opt.PlanMismatchError,
                       match="requires_grad.*shapes, dtypes, layouts and requires"):
        opt(x.clone().requires_grad_(True))
    assert len(opt.plans) == 1
    planning = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    with pytest.raises(monet_opt.PlanMismatchError, match="torch.float64.*shapes, dtypes"):
        opt(x.double())
    # NOTE [Inputs of other dtypes]: planned, and refused as eager refuses it
    with pytest.raises(monet_opt.CaptureError, match="fails on these inputs run eagerly too"):
        planning(x.double())
    with pytest.raises(TypeError, match=r"argument of a training step .*\['object'\]"):
        planning(x, object())
    # a number is traced as a constant (NOTE [Constant arguments]); this forward takes none
    with pytest.raises(monet_opt.CaptureError, match="takes 2 positional arguments but 3"):
        planning(x, 3)
    assert len(planning.plans) == 1


def test_a_shape_the_limit_cannot_hold_raises_and_changes_nothing():
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    store_all = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    opt = monet_opt.optimize(model, x, store_all.plan.min_feasible_bytes, profile_repeats=1,
                             time_limit_s=5)
    wide = torch.cat([x] * 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        opt(wide)
    assert any("new shapes" in note and "float32[4x3x16x16]" in note  # the first plan's
               and "(float32[16x3x16x16])" in note and "takes optimize() again" in note
               and format_bytes(opt.plan.memory_limit_bytes) + ", held in bytes" in note
               for note in info.value.__notes__), info.value.__notes__
    assert info.value.min_feasible_bytes > opt.plan.memory_limit_bytes
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert len(opt.plans) == 1
    loss_fn(opt(x)).backward()  # the sample's plan still trains
    assert all(p.grad is not None for p in model.parameters())


def test_a_shape_found_infeasible_is_not_planned_again(monkeypatch):
    """NOTE [Situations found infeasible]: a loop that skips the batches too wide to fit meets
    the same error at once, not after tracing, profiling and solving again, and the error it
    keeps does not hold the first call's inputs."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    store_all = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    opt = monet_opt.optimize(model, x, store_all.plan.min_feasible_bytes, profile_repeats=1,
                             time_limit_s=5)
    planned = []
    plan_step = opt._plan_step
    monkeypatch.setattr(opt, "_plan_step", lambda *a: planned.append(1) or plan_step(*a))
    errors = []
    for _ in range(3):
        wide = torch.cat([x] * 4)
        with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
            opt(wide)
        errors.append(info.value)
    assert planned == [1], "planned once, the first time the wide batch is met"
    first, again = errors[0], errors[2]
    assert str(again) == str(first) and again.min_feasible_bytes == first.min_feasible_bytes
    assert again.__notes__[:len(first.__notes__)] == first.__notes__
    assert "not planned again" in again.__notes__[-1]
    assert opt._refused._errors and all(e.__traceback__ is None
                                        for e in opt._refused._errors.values())
    loss_fn(opt(x)).backward()  # the sample's plan still trains
    assert len(opt.plans) == 1
    # a module remembering it is copied (an EMA's AveragedModel); the error pickles as it was
    copied = pickle.loads(pickle.dumps(first))
    assert type(copied) is type(first) and str(copied) == str(first)
    assert (copied.min_feasible_bytes, copied.__notes__) == (first.min_feasible_bytes,
                                                            first.__notes__)
    twin = copy.deepcopy(opt)
    with pytest.raises(monet_opt.InfeasibleBudgetError, match="not planned again"):
        twin(torch.cat([x] * 4))


def test_many_shapes_get_advice_to_pad():
    """Inputs of varying length make a plan each; past a few, the warning says to bucket."""
    model, x, loss_fn = models.small_cnn()
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    messages = []
    for batch in (3, 2, 1, 5):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            loss_fn(opt(torch.randn(batch, 3, 16, 16))).backward()
        messages += [str(w.message) for w in seen if w.category is monet_opt.ReplanWarning]
    assert len(messages) == 4 and len(opt.plans) == 5
    assert ["buckets" in m for m in messages] == [False, False, False, True]


def test_layers_unfrozen_after_optimize_get_their_gradients():
    """NOTE [Parameters changed]: a model optimized with its stem frozen, then unfrozen, then
    frozen again: the unfrozen stem gets eager's gradients, bitwise (before: none, silently),
    the step for it is planned once, and freezing again runs the first step again."""
    torch.manual_seed(0)
    base, x, loss_fn = models.small_cnn()
    base.stem.requires_grad_(False)
    eager = copy.deepcopy(base)
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1)
    runs = {}
    for module, owner in ((opt, opt.model), (eager, eager)):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            steps = []
            for frozen in (True, False, False, True):
                owner.stem.requires_grad_(not frozen)
                steps.append(epoch(module, owner, [x], loss_fn)[0][0])
        runs[module is opt] = steps, [w for w in seen
                                      if issubclass(w.category, monet_opt.ReplanWarning)]
    (ours, replans), (theirs, _) = runs[True], runs[False]
    assert len(replans) == 1 and "layers frozen or unfrozen" in str(replans[0].message)
    assert list(opt.plans) == ["float32[4x3x16x16], 4 parameters frozen", "float32[4x3x16x16]"]
    assert "stem.0.weight" in ours[1] and "stem.0.weight" not in ours[3]
    assert_same((ours, {}), (theirs, {}), exact=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing trains: the model runs, nothing is planned
        opt.model.requires_grad_(False)
        outs = []
        for module in (opt, opt.model):
            torch.manual_seed(5)
            outs.append(module(x))
        assert torch.equal(*outs) and len(opt.plans) == 2


def _input_grad_steps(module, owner, x, seeds):
    """Steps whose input requires a gradient (an adversarial or saliency step): each output,
    input gradient and parameter gradient, and the state after the last."""
    record = []
    for seed in seeds:
        owner.zero_grad(set_to_none=True)
        given = x.clone().requires_grad_(True)
        torch.manual_seed(seed)
        out = module(given)
        out.square().sum().backward()
        record.append({"out": out.detach(), "x.grad": given.grad,
                       **{n: p.grad for n, p in owner.named_parameters() if p.grad is not None}})
    return record, {k: v.clone() for k, v in owner.state_dict().items()}


@pytest.mark.parametrize("frozen", [False, True])
def test_an_input_that_requires_grad_plans_a_step(frozen):
    """A sample without requires_grad, then steps whose input requires it (it was refused):
    planned once, under the limit, bitwise eager's input and parameter gradients; with every
    parameter frozen (gradients of the input alone) the same."""
    torch.manual_seed(0)
    base, x, _ = models.small_cnn()
    base.requires_grad_(not frozen)
    if frozen:  # nothing trains: only a step whose input requires grad has a backward
        x = x.clone().requires_grad_(True)
    store_all = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1)
    # the least peak of either step: a convolution's backward that makes its input's gradient
    # takes more scratch (NOTE [Allocation events] in monet_opt/alloc_events.py)
    given = monet_opt.optimize(copy.deepcopy(base), x.detach().clone().requires_grad_(True),
                               HUGE, profile_repeats=1)
    limit = max(store_all.plan.min_feasible_bytes, given.plan.min_feasible_bytes) \
        if not frozen else HUGE
    opt = monet_opt.optimize(base, x.detach() if not frozen else x, limit, profile_repeats=1,
                             time_limit_s=5)
    eager = copy.deepcopy(base)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = _input_grad_steps(opt, base, x.detach(), [1, 2])
    replans = [str(w.message) for w in seen if issubclass(w.category, monet_opt.ReplanWarning)]
    if frozen:
        assert replans == []
    else:
        assert len(replans) == 1 and "input 0 requiring grad" in replans[0]
        assert "adversarial" in replans[0]
    assert_same(run, _input_grad_steps(eager, eager, x.detach(), [1, 2]), exact=True)
    [plan] = [p for label, p in opt.plans.items() if "input 0 requiring grad" in label]
    given = x.detach().clone().requires_grad_(True)
    base.zero_grad(set_to_none=True)
    resident = monet_opt.resident_tensors(base, given)
    measured = monet_opt.measure_peak(lambda: opt(given).square().sum().backward(), resident)
    assert measured <= limit and plan.predicted_peak_bytes <= limit
    if not frozen:  # 8 B under where the plan peaks in the forward: the loss scalar and its
        # seed gradient, counted for the whole step (NOTE [The loss scalar])
        assert 0 <= plan.predicted_peak_bytes - measured <= 8


def _gan_losses(generator, discriminator, g_params, d_params, steps=2):
    """A GAN's alternating steps: the discriminator on real and detached fake samples, then
    the generator through the discriminator (whose input then requires grad)."""
    og = torch.optim.Adam(g_params.parameters(), 1e-3)
    od = torch.optim.Adam(d_params.parameters(), 1e-3)
    bce, losses = torch.nn.BCEWithLogitsLoss(), []
    for s in range(steps):
        torch.manual_seed(100 + s)
        z, real = torch.randn(16, 8), torch.randn(16, 16)
        fake = generator(z)
        ld = bce(discriminator(real), torch.ones(16, 1)) + \
            bce(discriminator(fake.detach()), torch.zeros(16, 1))
        od.zero_grad()
        ld.backward()
        od.step()
        lg = bce(discriminator(fake), torch.ones(16, 1))
        og.zero_grad()
        lg.backward()
        og.step()
        losses.append({"ld": ld.detach(), "lg": lg.detach()})
    return losses, {**{f"g.{k}": v for k, v in g_params.state_dict().items()},
                    **{f"d.{k}": v for k, v in d_params.state_dict().items()}}


@pytest.mark.filterwarnings("ignore::monet_opt.ReplanWarning")
@pytest.mark.filterwarnings("ignore::monet_opt.StepsInFlightWarning")
@pytest.mark.filterwarnings("ignore::monet_opt.OutputGradientWarning")
def test_a_gan_trains_like_eager():
    """Generator and discriminator optimized apart: the generator's step backpropagates
    through the discriminator with its input requiring grad (planned when met); losses and
    every parameter and BatchNorm statistic bitwise eager's."""
    torch.manual_seed(0)
    g = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 16), torch.nn.Tanh())
    d = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LeakyReLU(0.2),
                            torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))
    g_eager, d_eager = copy.deepcopy(g), copy.deepcopy(d)
    g_opt = monet_opt.optimize(g, torch.randn(16, 8), HUGE, profile_dir=None, profile_repeats=1)
    d_opt = monet_opt.optimize(d, torch.randn(16, 16), HUGE, profile_dir=None, profile_repeats=1)
    assert_same(_gan_losses(g_opt, d_opt, g, d), _gan_losses(g_eager, d_eager, g_eager, d_eager),
                exact=True)
    assert any("input 0 requiring grad" in label for label in d_opt.plans)


class _Flat(torch.nn.Module):
    """A convolution whose output is flattened: a view when traced on a contiguous input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(8 * 6 * 6, 4)

    def forward(self, x):
        return self.head(self.conv(x).relu().flatten(1))


@pytest.mark.parametrize("layout", ["channels_last", "permuted"])
def test_an_input_laid_out_otherwise_plans_a_step(layout):
    """A sample given contiguous, then a channels-last or permuted batch (it raised "view size
    is not compatible" from inside the step, where eager ran): planned once, bitwise eager's;
    new_shapes="error" refuses it, naming the strides."""
    torch.manual_seed(0)
    net, x = _Flat(), torch.randn(2, 3, 8, 8)
    odd = x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else \
        x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    eager = copy.deepcopy(net)
    opt = monet_opt.optimize(net, x, HUGE, profile_dir=None, profile_repeats=1)
    with pytest.warns(monet_opt.ReplanWarning, match=r"input 0 with strides \(192, 1, 24, 3\)"):
        out = opt(odd)
    out.sum().backward()
    expected = eager(odd)
    expected.sum().backward()
    assert torch.equal(out, expected)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(net.parameters(), eager.parameters()))
    strict = monet_opt.optimize(net, x, HUGE, profile_dir=None, profile_repeats=1,
                                new_shapes="error")
    with pytest.raises(monet_opt.PlanMismatchError, match=r"strides \(192, 1, 24, 3\)"):
        strict(odd)


def test_an_input_viewing_a_larger_storage_plans_a_step_counting_it(tmp_path):
    """NOTE [Inputs viewing more]: a step planned for a batch of its own ran batches sliced
    from a data set (158,400 B over its prediction), and a profile made on a sliced sample was
    served to a batch of its own (fixed memory 50 % over)."""
    from tests.models import small_cnn
    torch.manual_seed(0)
    model, x, _ = small_cnn()
    data = torch.randn(6 * len(x), *x.shape[1:])
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=tmp_path, profile_repeats=1)
    sliced = data[len(x):2 * len(x)]
    with pytest.warns(monet_opt.ReplanWarning, match="larger storage"):
        opt(sliced).sum().backward()
    model.zero_grad(set_to_none=True)
    measured = monet_opt.measure_peak(lambda: opt(sliced).sum().backward(),
                                      monet_opt.resident_tensors(model, sliced))
    assert data.nbytes < measured <= max(p.predicted_peak_bytes for p in opt.plans.values())
    again = monet_opt.optimize(small_cnn()[0], x.clone(), 1 << 40, profile_dir=tmp_path,
                               profile_repeats=1)
    viewed = monet_opt.optimize(small_cnn()[0], data[:len(x)], 1 << 40, profile_dir=tmp_path,
                                profile_repeats=1)
    assert viewed.plan.fixed_bytes - again.plan.fixed_bytes == data.nbytes - x.nbytes



def test_an_input_viewing_more_than_fits_says_so():
    """NOTE [Inputs viewing more]: refused for a sample sliced from a larger batch, the error
    said only to raise the limit or use a smaller batch; it notes the view and `.contiguous()`
    (a step planned anew for such a batch says so in its own note)."""
    torch.manual_seed(0)
    model, x, _ = models.small_cnn()
    least = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_repeats=1).plan
    wide = torch.randn(x.shape[0], 2 * x.shape[1], *x.shape[2:])[:, :x.shape[1]]
    with pytest.raises(monet_opt.InfeasibleBudgetError) as caught:
        monet_opt.optimize(model, wide, least.min_feasible_bytes, profile_repeats=1)
    assert f"{x.nbytes:,} B beyond their own elements" in "".join(caught.value.__notes__)

