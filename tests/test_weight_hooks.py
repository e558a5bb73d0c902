"""Weights a forward pre-hook computes from other parameters at every call (torch.nn.utils'
spectral_norm and weight_norm, and their parametrizations; NOTE [Attributes set before read]
in monet_opt/attribute_tensors.py) and buffers the step updates in place that recomputation
reads (spectral_norm's power iteration, quantization-aware training's observers; NOTE [Buffers
the step updates] in monet_opt/updated_buffers.py): trained like eager at the least plan."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

import monet_opt
import solvers
from tests import models
from tests.records import assert_same, at_least_peak

HUGE = 1 << 40
WRAPS = {"spectral_norm": nn.utils.spectral_norm, "weight_norm": nn.utils.weight_norm,
         "parametrized spectral_norm": parametrizations.spectral_norm,
         "parametrized weight_norm": parametrizations.weight_norm}


def _net(wrap: str) -> nn.Module:
    """tests/models.py's SmallCNN with every convolution and the linear layer wrapped."""
    torch.manual_seed(0)
    net = models.SmallCNN()
    for name, module in list(net.named_modules()):
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            owner, _, attribute = name.rpartition(".")
            setattr(net.get_submodule(owner), attribute, WRAPS[wrap](module))
    return net


def _train(module, net, xs):
    """SGD steps with zero_grad between them (the gradients freed, as most loops do): each
    step's loss and gradients, and the final state (the power iterations' vectors too)."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    record = []
    for k, x in enumerate(xs):
        torch.manual_seed(k)
        loss = module(x).square().mean()
        loss.backward()
        record.append({"loss": loss.detach(),
                       **{n: p.grad.clone() for n, p in net.named_parameters()}})
        opt.step()
        opt.zero_grad(set_to_none=True)
    return record, {k: v.clone() for k, v in net.state_dict().items()}


@pytest.mark.parametrize("wrap", list(WRAPS))
def test_weights_set_by_a_pre_hook_train_like_eager(wrap):
    """Four steps at the least plan, bitwise eager's, with no HookWarning. spectral_norm's hook
    leaves the weight a tensor without a gradient until the first call, so the second step
    handed autograd an edge into the first step's freed graph ("Trying to backward through the
    graph a second time"); and both spectral_norms' plans recomputed the power iteration from
    the vectors the step had updated ("modified by an inplace operation")."""
    net, eager = _net(wrap), _net(wrap)
    xs = [torch.randn(4, 3, 16, 16) for _ in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.HookWarning)  # the hooks compute on tensors
        opt, least = at_least_peak(net, xs[0], probe=_net(wrap))
    assert opt.plan.recomputed_ops > 0
    assert_same(_train(opt, net, xs), _train(eager, eager, xs), exact=True)
    step = lambda: opt(xs[0]).sum().backward()  # noqa: E731
    measured = monet_opt.measure_peak(step, monet_opt.resident_tensors(net, xs[0]))
    assert opt.plan.predicted_peak_bytes <= least
    assert measured <= opt.plan.predicted_peak_bytes


def _recomputes_a_held_weight(plan) -> bool:
    return any(r.name.startswith("_weight_norm_interface") and r.decision.startswith("recomputed")
               for r in plan.rows)


def test_quantization_aware_training_at_its_least_plan():
    """Observers update their ranges and scales in place, and the fake quantization reads
    them: recomputed from the updated ones, the first backward failed autograd's version check.
    Three steps bitwise eager's (outputs, gradients, observers), within the prediction."""
    quant = pytest.importorskip("torch.ao.quantization")
    torch.manual_seed(0)
    model = nn.Sequential(quant.QuantStub(), nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64),
                          nn.ReLU(), nn.Linear(64, 4), quant.DeQuantStub())
    model.qconfig = quant.get_default_qat_qconfig("fbgemm")
    quant.prepare_qat(model.train(), inplace=True)
    x = torch.randn(32, 16)
    model(x)  # sizes the observers (NOTE [Buffers assigned in forward])
    eager = copy.deepcopy(model)
    opt, least = at_least_peak(model, x)
    assert opt.plan.recomputed_ops > 0
    xs = [torch.randn(32, 16) * (k + 1) for k in range(3)]
    assert_same(_train(opt, model, xs), _train(eager, eager, xs), exact=True)
    step = lambda: opt(x).sum().backward()  # noqa: E731
    measured = monet_opt.measure_peak(step, monet_opt.resident_tensors(model, x))
    assert measured <= opt.plan.predicted_peak_bytes <= least


def _recompute_all(problem, budget, *args, **kwargs):
    """A solver that keeps nothing for the backward: every forward op it reads is recomputed."""
    schedule = solvers.schedule_from_kept(problem, set())
    sim = solvers.simulate(problem, schedule)
    return solvers.SolveResult(solver="test", status=solvers.Status.FEASIBLE, schedule=schedule,
                               objective_s=sim.time_s, peak_bytes=sim.peak_bytes, bound_s=None,
                               gap=None, solve_time_s=0.0, min_feasible_bytes=sim.peak_bytes)


def test_a_recomputed_weight_norm_weight_is_counted(monkeypatch):
    """A schedule that recomputes weight_norm's op (for its norms) made the weight again, a
    copy its plan counted as 0 B (measured 5,472 B over; NOTE [Held tensors made again])."""
    monkeypatch.setattr(solvers, "solve", _recompute_all)
    net, eager = _net("weight_norm"), _net("weight_norm")
    xs = [torch.randn(4, 3, 16, 16) for _ in range(3)]
    opt = monet_opt.optimize(net, xs[0], HUGE, profile_repeats=1, profile_dir=None)
    assert _recomputes_a_held_weight(opt.plan)
    assert_same(_train(opt, net, xs), _train(eager, eager, xs), exact=True)
    measured = monet_opt.measure_peak(lambda: opt(xs[0]).sum().backward(),
                                      monet_opt.resident_tensors(net, xs[0]))
    assert measured <= opt.plan.predicted_peak_bytes


class _Decay(nn.Module):
    """A forward that changes two weights in place under no_grad before using them."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8 * 64, 4)

    def forward(self, x):
        with torch.no_grad():
            self.c1.weight.mul_(0.99)
            self.c2.weight.add_(0.01)
        return self.head(torch.tanh(self.c2(nn.functional.elu(self.c1(x)))).flatten(1))


@pytest.mark.parametrize("recompute_all", [False, True])
def test_copies_of_updated_weights_counted_where_made(monkeypatch, recompute_all):
    """NOTE [Copies nothing reads]: store-all reads no copy of the weights' old values, so the
    step makes none, and its plan now predicts the measured peak to the byte (it was 2,304 B
    over: c2's weight counted as a copy); a plan recomputing every read op makes them, and
    counts them. Three steps bitwise eager's either way."""
    if recompute_all:
        monkeypatch.setattr(solvers, "solve", _recompute_all)
    torch.manual_seed(0)
    net = _Decay()
    eager = copy.deepcopy(net)
    xs = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    opt = monet_opt.optimize(net, xs[0], HUGE, profile_repeats=1, profile_dir=None)
    copies = sum(p.numel() * p.element_size() for p in (net.c1.weight, net.c2.weight))
    measured = monet_opt.measure_peak(lambda: opt(xs[0]).sum().backward(),
                                      monet_opt.resident_tensors(net, xs[0]))
    if recompute_all:
        assert opt.plan.recomputed_ops > 0
        assert 0 <= opt.plan.predicted_peak_bytes - measured <= copies
    else:
        assert measured == opt.plan.predicted_peak_bytes
    net.load_state_dict(eager.state_dict())  # the measured step changed the weights
    net.zero_grad(set_to_none=True)
    assert_same(_train(opt, net, xs), _train(eager, eager, xs), exact=True)


class _MaxNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(200, 16, max_norm=1.0), nn.Linear(16, 3)

    def forward(self, ids):
        return self.out(self.emb(ids)).square().mean()


def test_a_limit_store_all_fits_without_the_copies_is_met():
    """NOTE [Copies counted as made]: Embedding(max_norm) renorms its table in place, and the
    solver counts a copy of it that store-all never makes: the least peak said was over
    store-all's by the table's bytes, and a limit between was refused. Both now at store-all's
    measured peak; the step there trains like eager."""
    torch.manual_seed(0)
    model, ids = _MaxNorm(), torch.randint(0, 200, (4, 5))
    eager = copy.deepcopy(model)
    plan = monet_opt.optimize(copy.deepcopy(model), ids, 1 << 40, profile_dir=None,
                              profile_repeats=1).plan
    assert plan.min_feasible_bytes <= plan.store_all_peak_bytes
    limit = plan.store_all_peak_bytes  # below it with the table's copy counted
    opt = monet_opt.optimize(model, ids, limit, profile_dir=None, profile_repeats=1)
    step = lambda: opt(ids).backward()  # noqa: E731
    assert monet_opt.measure_peak(step, monet_opt.resident_tensors(model, ids)) <= limit
    eager(ids).backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad) and torch.equal(p, q)


def test_the_bound_and_shares_are_of_the_step_without_the_copies():
    """NOTE [Copies counted as made]: with the table's copy counted, the bound from sizes the
    error gives ("the step's sizes alone need") was above the least peak it named, and "100% of
    activations" above the store-all step's peak."""
    torch.manual_seed(0)
    model, ids = _MaxNorm(), torch.randint(0, 200, (4, 5))
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        monet_opt.optimize(copy.deepcopy(model), ids, 1, profile_dir=None, profile_repeats=1)
    assert info.value.lower_bound_bytes <= info.value.min_feasible_bytes
    plan = monet_opt.optimize(model, ids, "100% of activations", profile_dir=None,
                              profile_repeats=1).plan
    assert plan.memory_limit_bytes == plan.store_all_peak_bytes


class _DroppedInput(nn.Module):
    """Its input dropped out in place: a copy of it is counted for a recomputation to read."""

    def __init__(self) -> None:
        super().__init__()
        self.drop, self.pool = nn.Dropout(0.1, inplace=True), nn.MaxPool2d(2)
        self.bn, self.head = nn.BatchNorm2d(8), nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.bn(self.pool(self.drop(x))).mean((2, 3)))


def test_the_least_peak_said_is_met_where_the_copies_are_not_made():
    """NOTE [Copies counted as made]: below every plan the least peak said counted the input's
    copy (70,940 B) where a plan at a larger limit measured 54,520 B (fuzz); the least said is
    met now."""
    torch.manual_seed(0)
    model, x = _DroppedInput(), torch.randn(2, 8, 16, 16)
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        monet_opt.optimize(copy.deepcopy(model), x.clone(), 1, profile_dir=None,
                           profile_repeats=1, time_limit_s=5)
    least = info.value.min_feasible_bytes
    store_all = monet_opt.optimize(copy.deepcopy(model), x.clone(), HUGE, profile_dir=None,
                                   profile_repeats=1).plan.predicted_peak_bytes
    assert least <= store_all
    opt = monet_opt.optimize(model, x.clone(), least, profile_dir=None, profile_repeats=1,
                             time_limit_s=5)
    batch = x.clone()
    assert monet_opt.measure_peak(lambda: opt(batch).square().sum().backward(),
                                  monet_opt.resident_tensors(model, batch)) <= least


def test_a_tracked_instance_norm_at_its_least_plan():
    """InstanceNorm's BatchNorm reads `repeat`s of its running statistics; the solver, seeing
    it read them, recomputed those from the buffers the forward had updated, and the first
    backward failed autograd's version check. Three steps bitwise eager's (running statistics
    too), within the prediction."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True, track_running_stats=True),
        nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.SiLU(), nn.Dropout2d(0.2),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.AdaptiveMaxPool2d(1), nn.Flatten(),
        nn.Linear(8, 3))
    x = torch.randn(4, 3, 16, 16)
    eager = copy.deepcopy(model)
    opt, least = at_least_peak(model, x)
    assert opt.plan.recomputed_ops > 0
    xs = [torch.randn(4, 3, 16, 16) for _ in range(3)]
    assert_same(_train(opt, model, xs), _train(eager, eager, xs), exact=True)
    step = lambda: opt(x).sum().backward()  # noqa: E731
    measured = monet_opt.measure_peak(step, monet_opt.resident_tensors(model, x))
    assert measured <= opt.plan.predicted_peak_bytes <= least


class _ClampedWeight(nn.Module):
    """Its forward clamps a weight in place under no_grad: the copy a recomputation of the
    first layer would read is counted."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 32)
        self.register_buffer("w", self.b.weight.detach().clone())

    def forward(self, x):
        with torch.no_grad():
            self.a.weight.clamp_(-0.2, 0.2)
        h = torch.tanh(self.a(x))
        return (self.b(h) + nn.functional.linear(h, self.w)).sin().sum()


def test_the_least_peak_said_is_never_above_store_alls():
    """NOTE [Copies counted as made]: where every schedule that recomputes makes the copy, the
    least peak said was the least of those (55,560 B), above store-all's (53,640 B), and a
    limit between was refused."""
    torch.manual_seed(0)
    model, x = _ClampedWeight(), torch.randn(64, 16)
    store_all = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_dir=None,
                                   profile_repeats=1).plan.store_all_peak_bytes
    for limit in (1, store_all - 1):
        with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
            monet_opt.optimize(copy.deepcopy(model), x, limit, profile_dir=None,
                               profile_repeats=1, time_limit_s=5)
        assert info.value.min_feasible_bytes <= store_all
    least = info.value.min_feasible_bytes
    opt = monet_opt.optimize(model, x, least, profile_dir=None, profile_repeats=1,
                             time_limit_s=5)
    assert monet_opt.measure_peak(lambda: opt(x).backward(),
                                  monet_opt.resident_tensors(model, x)) <= least


def test_a_fused_qat_network_is_planned_at_the_least_peak_its_error_names():
    """NOTE [Copies counted as made]: the least a retry without the observers' copies found was
    named, and a call at it refused with the same number as its least ("697.00 KiB is below
    ... 697.00 KiB"): the retry returned its least schedule only as the least, not as a plan."""
    quant = pytest.importorskip("torch.ao.quantization")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).train()
    model.qconfig = quant.get_default_qat_qconfig("fbgemm")
    model = quant.prepare_qat(quant.fuse_modules_qat(model, [["0", "1", "2"], ["3", "4", "5"]]))
    x = torch.randn(8, 3, 16, 16)
    model(x)  # sizes the observers (NOTE [Buffers assigned in forward])
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        monet_opt.optimize(copy.deepcopy(model), x, 1, profile_dir=None, time_limit_s=15)
    least = info.value.min_feasible_bytes
    opt = monet_opt.optimize(model, x, least, profile_dir=None, time_limit_s=15)
    step = lambda: opt(x).square().sum().backward()  # noqa: E731
    assert monet_opt.measure_peak(step, monet_opt.resident_tensors(model, x)) <= least
    model.zero_grad(set_to_none=True)
    eager = copy.deepcopy(model)  # the step updated the observers and statistics
    xs = [torch.randn(8, 3, 16, 16) for _ in range(2)]
    assert_same(_train(opt, model, xs), _train(eager, eager, xs), exact=True)


class _Averaged(nn.Module):
    """A running mean (a buffer updated in place) added to its input and returned."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(64))

    def forward(self, x):
        with torch.no_grad():
            self.mean.mul_(0.9).add_(0.1 * x.mean(0).detach())
        return x + self.mean


class _Smoothed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l0, self.average = nn.Linear(64, 64), _Averaged()
        self.register_buffer("scale", torch.rand(64) + 0.5)
        self.sn = nn.utils.spectral_norm(nn.Linear(64, 64))
        self.l1, self.head = nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x):
        x = torch.relu(self.l0(x)) * self.scale
        x = torch.tanh(self.sn(self.average(x)))
        return self.head(torch.relu(self.l1(x)))


def test_the_least_an_error_names_is_met_where_a_tie_makes_more_copies():
    """NOTE [Copies counted as made]: at the least an error named (169,004 B), the retry's
    search ended at a schedule as low without the copies that makes one more, and the call was
    refused naming 169,260 B; the least schedule the first call found (recalled) is weighed
    with the copies it makes too (buffers fuzz)."""
    torch.manual_seed(0)
    model = monet_opt.WithLoss(_Smoothed(), lambda o, y: ((o - y) ** 2).mean())
    batch = (torch.randn(32, 64), torch.randn(32, 4))
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        monet_opt.optimize(model, batch, 1, profile_dir=None, time_limit_s=20)
    least = info.value.min_feasible_bytes
    opt = monet_opt.optimize(model, batch, least, profile_dir=None, time_limit_s=20)
    assert opt.plan.predicted_peak_bytes <= least
