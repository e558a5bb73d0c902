"""The wrapper's train/eval mode and the plans made for the modules' flags (NOTE [Optimized in
eval mode] in monet_opt/module.py)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import monet_opt
from tests import models

HUGE = 1 << 40


def test_a_plan_made_in_eval_mode_runs_in_eval_mode():
    """NOTE [Optimized in eval mode]: a model optimized and trained in eval mode (BatchNorm on
    its running statistics, dropout off) runs its plan: the least plan's measured peak is its
    prediction, under eager's, and the gradients are eager's bitwise. Switched to train mode,
    it refuses, saying why."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    model.eval()
    eager = copy.deepcopy(model)
    full = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_repeats=1, profile_dir=None)
    least = monet_opt.optimize(model, x, full.plan.min_feasible_bytes, profile_repeats=1,
                               profile_dir=None, time_limit_s=5)
    assert least.plan.recomputed_ops > 0
    assert not least.training  # the wrapper's mode is the model's
    least.eval()
    measured = monet_opt.measure_peak(lambda: loss_fn(least(x)).backward(),
                                      monet_opt.resident_tensors(model, x))
    eager_peak = monet_opt.measure_peak(lambda: loss_fn(eager(x)).backward(),
                                        monet_opt.resident_tensors(eager, x))
    assert measured == least.plan.predicted_peak_bytes < eager_peak
    for m in (model, eager):
        m.zero_grad(set_to_none=True)
    loss_fn(least(x)).backward()
    loss_fn(eager(x)).backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad), name
    least.train()  # a step for train mode is planned (it used to refuse): here it cannot fit
    with pytest.raises(monet_opt.InfeasibleBudgetError) as raised:
        least(x)
    assert "; the model eval -> train" in "".join(raised.value.__notes__)


def test_the_wrappers_mode_is_the_models():
    """NOTE [Optimized in eval mode]: opt.eval() for validation, then model.train() on the
    model itself: the step runs its plan (it ran the model itself, over its limit)."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    full = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_repeats=1, profile_dir=None)
    least = monet_opt.optimize(model, x, full.plan.min_feasible_bytes, profile_repeats=1,
                               profile_dir=None, time_limit_s=5)
    least.eval()
    assert not model.training
    model.train()
    assert least.training
    measured = monet_opt.measure_peak(lambda: loss_fn(least(x)).backward(),
                                      monet_opt.resident_tensors(model, x))
    assert measured == least.plan.predicted_peak_bytes < full.plan.predicted_peak_bytes
    model.eval()
    assert not least.training


def test_a_backward_through_an_eval_step_run_unplanned_warns_once():
    """NOTE [Trained in eval mode, unplanned]: trained after model.eval() with a plan made in
    train mode, the step ran the model itself, over its limit, with no word; validation with
    gradients on (no backward) stays quiet, and the gradients are eager's."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    eager = copy.deepcopy(model).eval()
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.UnplannedStepWarning)
        loss_fn(opt(x))  # validation, gradients on
    with pytest.warns(monet_opt.UnplannedStepWarning, match="in eval mode.*optimize.. with the"):
        loss_fn(opt(x)).backward()
    loss_fn(eager(x)).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           eager.parameters()))
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.UnplannedStepWarning)
        loss_fn(opt(x)).backward()  # once per module


def test_cumulative_batchnorm_averages_run_the_model_itself():
    """NOTE [Cumulative averages, unplanned]: Lightning's SWA sets momentum=None and runs
    forwards with gradients on and no backward to recompute the statistics; the call failed
    (CaptureError, "Give it a momentum"). It runs the model itself, warned once, with eager's
    statistics; with the momentum back, the plan trains bitwise again, planned once."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    norms = [[m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
             for net in (model, eager)]
    for bn in sum(norms, []):
        bn.reset_running_stats()
        bn.momentum = None
    with pytest.warns(monet_opt.UnplannedStepWarning, match="cumulative") as said:
        for seed in range(2):
            for net in (opt, eager):
                torch.manual_seed(seed)
                net(x)
    assert len([w for w in said if w.category is monet_opt.UnplannedStepWarning]) == 1
    for ours, theirs in zip(*norms):
        assert torch.equal(ours.running_mean, theirs.running_mean)
        assert int(ours.num_batches_tracked) == 2
        ours.momentum = theirs.momentum = 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.ReplanWarning)
        for net in (opt, eager):
            torch.manual_seed(2)
            loss_fn(net(x)).backward()
    assert len(opt.plans) == 1
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(),
                                                            eager.parameters()))
