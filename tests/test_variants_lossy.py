"""Lossy variants (reduced-precision storage): opt-in only, and within a stated error.

NOTE [Lossy bound] in monet_opt/variants.py: a float32 tensor that convolution_backward (its
input) or mm/bmm (either operand) reads is kept as bfloat16 and upcast in the backward.
Measured here on CPU (3 seeds, every variant's time set to zero so the plan keeps everything in
its lightest form): the first step's parameter gradients differ from eager's by at most 1.8e-3
(small CNN) and 3.3e-4 (MLP), max-abs relative per parameter; the loss over 3 SGD steps by at
most 8.9e-4 relative. The tests assert 1e-2 and 5e-3: about 5x margin. The test's small CNN
has 1x1 convolutions (a 3x3's backward scratch sets its least peak where CPU scratch is
counted): 1.7e-3 and 5.7e-4 on the same 3 seeds. Later steps' gradients
are not compared element for element: the parameters have moved apart, and biases feeding a
BatchNorm have gradients at rounding level, whose relative error means nothing.
"""
from __future__ import annotations

import copy

import pytest
import torch

import monet_opt
from monet_opt import families, variants
from monet_opt.cache import ProfileCache
from solvers.variants import lightest
from tests import models
from tests.test_executor import HUGE, _check_memory, run_steps
from tests.test_variants import _no_recompute_peak, free_variants  # noqa: F401 (a fixture)

GRAD_BOUND = 1e-2   # first step, each parameter gradient, max-abs relative to eager
LOSS_BOUND = 5e-3   # every step's loss, relative to eager
LOSSY = {f.name for f in variants.FAMILIES if not f.exact}


def _families(names) -> set[str]:
    return {name.split(":")[0] for name in names}


@pytest.mark.parametrize("factory, family", [(lambda: models.small_cnn(kernel=1),
                                              "conv.input_bf16"),
                                             (models.mlp, "mm.arg1_bf16")],
                         ids=["small_cnn", "mlp"])
def test_lossy_plan_trains_within_the_stated_bound(factory, family, free_variants):  # noqa: F811
    """At the peak of keeping everything in its lightest form (lossy ones included), the plan
    uses the lossy family, and its gradients and losses stay within the stated bounds."""
    torch.manual_seed(0)
    base, x, loss_fn = factory()
    problem = monet_opt.lower_problem(copy.deepcopy(base), x, profile_repeats=1,
                                      allow_lossy=True)
    light = lightest(problem)
    limit = _no_recompute_peak(problem, light)
    exact = {v for v in light if problem.variants[v].name.split(":")[0] not in LOSSY}
    assert limit < _no_recompute_peak(problem, exact)
    opt = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                             allow_lossy=True, time_limit_s=10)
    assert family in _families(opt.plan.variants), opt.plan.explain()
    assert_trains_within_bounds(opt, base, x, loss_fn)
    _check_memory(opt, x, loss_fn, limit, "lossy plan")


def assert_trains_within_bounds(opt, base, x, loss_fn) -> None:
    """`opt`'s losses over run_steps and its first step's gradients are within LOSS_BOUND
    and GRAD_BOUND of eager `base`'s."""
    eager = copy.deepcopy(base)
    (got, _), (want, _) = run_steps(opt, opt.model, x, loss_fn), run_steps(eager, eager, x,
                                                                          loss_fn)
    for step, ((loss_a, _), (loss_b, _)) in enumerate(zip(got, want)):
        err = ((loss_a - loss_b).abs() / loss_b.abs()).item()
        assert err <= LOSS_BOUND, f"step {step}: loss relative error {err:.2e}"
    grads_a, grads_b = got[0][1], want[0][1]
    for name, g in grads_b.items():
        if not g.is_floating_point():
            continue
        err = ((grads_a[name].double() - g.double()).abs().max()
               / g.double().abs().max().clamp_min(1e-30)).item()
        assert err <= GRAD_BOUND, f"{name}: gradient relative error {err:.2e}"


def test_lossy_variants_are_never_offered_by_default(tmp_path):
    """Without allow_lossy no lossy family is lowered, offered or accepted from the profiler;
    asking for one by name is an error; the profile cache keeps the two apart."""
    torch.manual_seed(0)
    for factory in (models.small_cnn, models.mlp):
        base, x, _ = factory()
        plain = monet_opt.lower_problem(copy.deepcopy(base), x, profile_repeats=1)
        assert not _families(v.name for v in plain.variants) & LOSSY
        lossy = monet_opt.lower_problem(copy.deepcopy(base), x, profile_repeats=1,
                                        allow_lossy=True)
        assert _families(v.name for v in lossy.variants) & LOSSY
    with pytest.raises(ValueError, match="allow_lossy=True"):
        monet_opt.optimize(base, x, HUGE, variants={"mm.arg1_bf16"})
    site = type("Site", (), {"family": "mm.arg1_bf16"})
    assert not families.acceptable(site, 1e-4, allow_lossy=False)
    assert families.acceptable(site, 1e-4, allow_lossy=True)
    assert not families.acceptable(site, 0.5, allow_lossy=True)
    for allow in (False, True):
        monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, allow_lossy=allow,
                           profile_dir=tmp_path)
    profiles = ProfileCache(tmp_path).profiles()
    offered = {dict(p.key.options)["allow_lossy"]: _families(v.name for v in p.problem.variants)
               for p in profiles}
    assert len(profiles) == 2 and not offered[False] & LOSSY and offered[True] & LOSSY
