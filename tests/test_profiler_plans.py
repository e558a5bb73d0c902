"""NOTE [Plans made inside a profiler] (monet_opt/alloc_events.py): a step planned inside the
user's torch.profiler counts no kernels' scratch, so run outside it, it is planned again; a
plan made outside serves inside a profiler without planning."""
from __future__ import annotations

import warnings

import torch
import torch.profiler

import monet_opt
from tests import models

HUGE = 1 << 40


def _least(model, x) -> int:
    return monet_opt.optimize(model, x, HUGE, profile_dir=None,
                              profile_repeats=1).plan.min_feasible_bytes


def _profiler():
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  profile_memory=True)


def _step(opt, x, loss_fn):
    loss_fn(opt(x)).backward()
    opt.model.zero_grad(set_to_none=True)


def test_a_plan_made_inside_a_profiler_is_made_again_outside_it():
    """It passed its limit by the scratch at every later step (15,008 B over 175,176 on the
    probe's CNN), silently; the profiler's warning came once per op profiled."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    limit = _least(model, x)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with _profiler():
            opt = monet_opt.optimize(model, x, limit, profile_dir=None, profile_repeats=1,
                                     time_limit_s=5)
            _step(opt, x, loss_fn)
    said = [w for w in seen if "inside a running torch.profiler" in str(w.message)]
    assert len(said) == 1 and len(opt.plans) == 1
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _step(opt, x, loss_fn)  # outside: planned again, counting the scratch
    replans = [str(w.message) for w in seen if w.category is monet_opt.ReplanWarning]
    assert len(replans) == 1 and "scratch unmeasured" in replans[0] and len(opt.plans) == 2
    resident = monet_opt.resident_tensors(model, x)
    measured = monet_opt.measure_peak(lambda: loss_fn(opt(x)).backward(), resident)
    assert measured <= limit


def test_a_plan_made_outside_serves_inside_a_profiler():
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    opt = monet_opt.optimize(model, x, _least(model, x), profile_dir=None, profile_repeats=1,
                             time_limit_s=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.ReplanWarning)
        with _profiler():
            for _ in range(2):
                _step(opt, x, loss_fn)
        _step(opt, x, loss_fn)
    assert len(opt.plans) == 1
