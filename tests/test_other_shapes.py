"""A step planned for another shape starts from the plans made for the same graph (NOTE [Plans
for other shapes] in solvers/remembered.py): where one fits, auto gets a sixth of its time and
no least-peak program and ends no slower than it, its least peak no higher than theirs; where
none fits, or the step holds gradients in place, the whole time; the step trains bitwise as
planned."""
from __future__ import annotations

import collections
import copy
import warnings

import pytest
import torch

import monet_opt
import solvers
from solvers import remembered
from solvers.remembered import REPLAN_MIN_S, REPLAN_SHARE, fitting
from tests import models

HUGE = 1 << 40
SECONDS = 12.0


@pytest.mark.parametrize("cached", [False, True])
def test_a_smaller_batch_starts_from_the_plan_before(monkeypatch, tmp_path, cached):
    monkeypatch.setattr(remembered, "_plans", collections.OrderedDict())  # this test's alone
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    store_all = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_repeats=1,
                                   profile_dir=None)
    limit = (store_all.plan.min_feasible_bytes + store_all.plan.predicted_peak_bytes) // 2
    calls = []
    real = solvers.solve

    def solve(problem, budget, solver="auto", *args, **kwargs):
        result = real(problem, budget, solver, *args, **kwargs)
        calls.append((problem, budget, kwargs.get("time_limit_s"),
                      list(kwargs.get("candidates", ())), result, kwargs.get("least_peak")))
        return result

    monkeypatch.setattr(solvers, "solve", solve)
    opt = monet_opt.optimize(model, x, limit, profile_repeats=1, time_limit_s=SECONDS,
                             profile_dir=tmp_path / "profiles" if cached else None)
    assert opt.plan.recomputed_ops > 0 and len(calls) == 1
    assert calls[0][2] == SECONDS and not calls[0][3], "optimize()'s own step: the whole time"
    assert calls[0][5] is True
    first = opt.plan

    short = x[:3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        torch.manual_seed(5)  # its dropout
        loss_fn(opt(short)).backward()
    problem, budget, seconds, offered, result, least_peak = calls[-1]
    assert budget == first.memory_limit_bytes and least_peak is False
    fits = fitting(problem, budget, offered)
    assert fits, "the batch of 4's schedule runs on the batch of 3 and fits the same limit"
    assert seconds == max(min(SECONDS, REPLAN_MIN_S), SECONDS * REPLAN_SHARE)
    assert result.feasible and result.objective_s <= min(r.objective_s for r in fits)
    assert result.min_feasible_bytes <= min(solvers.simulate(problem, s).peak_bytes
                                            for s in offered)

    # the step trains as the plan says: bitwise like store-all's step on that batch
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for p in store_all.model.parameters():
        p.grad = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        torch.manual_seed(5)
        loss_fn(store_all(short)).backward()
    assert all(torch.equal(grads[n], p.grad) for n, p in store_all.model.named_parameters())

    # gradients in place: another graph's step (NOTE [Gradients resident at the start]), not
    # started from the plans without them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        loss_fn(opt(x)).backward()
    problem, budget, seconds, offered, _, least_peak = calls[-1]
    assert seconds == SECONDS and not offered and least_peak is True

    model.zero_grad(set_to_none=True)
    wide = torch.cat([x, x])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        try:
            loss_fn(opt(wide)).backward()
        except monet_opt.InfeasibleBudgetError:
            pass  # the limit cannot hold it: planned all the same
    problem, budget, seconds, offered, _, least_peak = calls[-1]
    assert offered and not fitting(problem, budget, offered) and least_peak is True
    assert seconds == SECONDS, "no plan before fits the larger batch: the whole time"
