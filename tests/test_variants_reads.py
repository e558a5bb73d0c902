"""Lossy variants that read a forward tensor the graph makes anyway: a BatchNorm's backward from
its output (NOTE [BatchNorm from its output]) and convolution's backward on another backend
(NOTE [Other implementations])."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import monet_opt
from monet_opt import measured, variants_bn, variants_impl
from monet_opt.variant_probe import relative_error
from tests import models
from tests.test_executor import HUGE, _check_memory
from tests.test_variants import (_no_recompute_peak, even_times,  # noqa: F401 (fixtures)
                                 free_variants)
from monet_opt.variants import LOSSY_OP_BOUND
from tests.test_variants_lossy import assert_trains_within_bounds

aten = torch.ops.aten
BN = "batchnorm.output_activated"
CONV = "conv.other_backend"
ATTENTION = "attention.math_backward"


def _bn_backward_both_ways(weight: torch.Tensor, bias: torch.Tensor, layout=None):
    torch.manual_seed(0)
    x = torch.randn(8, weight.numel(), 12, 12) * 3 + 1
    if layout is not None:
        x = x.contiguous(memory_format=layout)
    out, mean, invstd = aten.native_batch_norm(x, weight, bias, None, None, True, 0.1, 1e-5)
    grad = torch.randn_like(out)
    args = (weight, None, None, mean, invstd, True, 1e-5, [True, True, True])
    want = aten.native_batch_norm_backward(grad, x, *args)
    return (lambda: variants_bn.from_output(grad, out, *args)), want


@pytest.mark.parametrize("layout", [None, torch.channels_last], ids=["nchw", "channels_last"])
def test_batchnorm_backward_from_its_output_is_within_the_bound(layout):
    """Weights and biases of either sign and size; every output within the lossy bound, and
    far inside it (measured here about 1e-6)."""
    weight = torch.tensor([1.0, -0.5, 2.0, 0.05, 3.0, -1.5])
    bias = torch.tensor([0.0, 1.0, -2.0, 0.3, 5.0, 0.0])
    got, want = _bn_backward_both_ways(weight, bias, layout)
    err = relative_error(got(), want)
    assert 0 < err <= 1e-4 <= LOSSY_OP_BOUND, err


def test_batchnorm_near_zero_scale_is_refused_not_miscomputed():
    """A channel whose weight is too small beside its bias raises, naming the channel and what
    to do, where the rebuilt input would be wrong."""
    weight = torch.tensor([1.0, 1e-3, 2.0])
    got, _ = _bn_backward_both_ways(weight, torch.tensor([0.0, 0.5, 0.0]))
    with pytest.raises(variants_bn.BatchNormScaleError, match="channel 1 of 3.*allow_lossy"):
        got()


def _bn_problem(base, x):
    problem = monet_opt.lower_problem(copy.deepcopy(base), x, profile_repeats=1,
                                      allow_lossy=True, variants={BN})
    return problem, frozenset(v for v, var in enumerate(problem.variants)
                              if var.name.startswith(BN))


def test_batchnorm_from_its_output_fits_where_recomputation_would_be_needed(  # noqa: F811
        free_variants, even_times):
    """conv-BN-SiLU: SiLU keeps the BatchNorm's output, so a BatchNorm that reads it instead of
    its input lets the convolution's output go at once. At the peak of keeping everything that
    way, the plan recomputes nothing, uses the family, stays within its limit (measured) and
    trains within the lossy bounds; without the family the same limit needs recomputation.
    Every op is profiled at 1 ms (`even_times`): under load two SiLUs' recomputation was
    profiled within auto's close-enough margin of the step, and auto stopped there."""
    torch.manual_seed(0)
    base, x, loss_fn = models.silu_cnn()
    problem, chosen = _bn_problem(base, x)
    assert len(chosen) == 3  # every BatchNorm
    limit = _no_recompute_peak(problem, chosen)
    assert limit < _no_recompute_peak(problem, frozenset())
    opt = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                             allow_lossy=True, variants={BN}, time_limit_s=10)
    assert opt.plan.recomputed_ops == 0 and \
        {name.split(":")[0] for name in opt.plan.variants} == {BN}, opt.plan.explain()
    assert_trains_within_bounds(opt, base, x, loss_fn)
    _check_memory(opt, x, loss_fn, limit, "BatchNorm from its output")
    plain = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                               variants=False, time_limit_s=10)
    assert plain.plan.recomputed_ops > 0


def test_batchnorm_output_is_not_offered_where_nothing_else_keeps_it(free_variants):  # noqa: F811
    """conv-BN-ReLU: ReLU keeps its own output, so reading the BatchNorm's output instead of its
    input would keep as many bytes and save nothing (NOTE [Variants that cannot pay])."""
    torch.manual_seed(0)
    base, x, _ = models.pool_cnn()
    problem, offered = _bn_problem(base, x)
    assert not offered and any(op.name.startswith("native_batch_norm_backward")
                               for op in problem.ops)


def test_batchnorm_weights_at_zero_are_not_offered_and_stop_training(  # noqa: F811
        free_variants, even_times):
    """Weights already failing the guard when the model is profiled: the family is not
    offered there. Weights that reach zero later, in training: the step raises (the gradients
    would be wrong), it does not return them. Every op at 1 ms (`even_times`), as in the test
    above: under load (pytest -n 2, 2026-11-30) auto once stopped at evict's plan, which uses
    no variant, and the test failed before the weights were touched."""
    torch.manual_seed(0)
    base, x, loss_fn = models.silu_cnn()
    dead = copy.deepcopy(base)
    with torch.no_grad():
        dead.body[1].weight[2] = 0.0
    _, offered = _bn_problem(dead, x)
    assert len(offered) == 2
    problem, chosen = _bn_problem(base, x)
    opt = monet_opt.optimize(copy.deepcopy(base), x, _no_recompute_peak(problem, chosen),
                             profile_repeats=1, allow_lossy=True, variants={BN},
                             time_limit_s=10)
    assert opt.plan.variants
    with torch.no_grad():
        for bn in (opt.model.body[1], opt.model.body[4], opt.model.body[7]):
            bn.weight[0] = 0.0
    with pytest.raises(variants_bn.BatchNormScaleError):
        loss_fn(opt(x)).backward()


def test_a_cached_profile_is_not_served_with_the_family_to_weights_failing_its_guard(  # noqa: F811
        free_variants, even_times, tmp_path):
    """NOTE [Guards on a cached profile]: parameter values are in no key, so a profile made on
    healthy weights was served to the same model with a channel's weight at zero; its plan
    kept the family there and the first backward raised BatchNormScaleError. Now that
    BatchNorm is planned without it (warned), the step trains, and the plan is a fresh
    directory's."""
    torch.manual_seed(0)
    base, x, loss_fn = models.silu_cnn()
    problem, chosen = _bn_problem(base, x)
    limit = _no_recompute_peak(problem, chosen)
    kw = dict(profile_repeats=1, allow_lossy=True, variants={BN}, time_limit_s=10)
    assert len(monet_opt.optimize(copy.deepcopy(base), x, limit, profile_dir=tmp_path / "a",
                                  **kw).plan.variants) == 3
    dead = copy.deepcopy(base)
    with torch.no_grad():
        dead.body[1].weight[2] = 0.0
    with pytest.warns(RuntimeWarning, match="too near zero to rebuild the input"):
        served = monet_opt.optimize(dead, x, limit, profile_dir=tmp_path / "a", **kw)
    fresh = monet_opt.optimize(copy.deepcopy(dead), x, limit, profile_dir=tmp_path / "b", **kw)
    assert len(served.plan.variants) == 2 and served.plan.variants == fresh.plan.variants
    loss_fn(served(x)).backward()


def test_convolution_backward_on_another_backend_is_within_its_bound():
    """The backend changes the order of the sums, not the result beyond rounding."""
    torch.manual_seed(0)
    for c_in, c_out, k in ((16, 8, 1), (8, 8, 3)):
        x, w = torch.randn(4, c_in, 10, 10), torch.randn(c_out, c_in, k, k)
        y = aten.convolution(x, w, None, [1, 1], [k // 2] * 2, [1, 1], False, [0, 0], 1)
        args = (torch.randn_like(y), x, w, [0], [1, 1], [k // 2] * 2, [1, 1], False, [0, 0], 1,
                [True, True, False])
        err = relative_error(variants_impl.conv_backward(*args),
                             aten.convolution_backward(*args))
        assert err <= 1e-5, (c_in, c_out, k, err)


def _decree(monkeypatch, family: str, extra_s: float) -> None:
    """The profiler reports `family`'s variants as `extra_s` slower than their op."""
    real = measured.profile

    def profile(joint, lowered, *args, **kwargs):
        result = real(joint, lowered, *args, **kwargs)
        costs = tuple((e, ews, extra_s if site.family == family else t, ws)
                      for site, (e, ews, t, ws) in zip(lowered.variant_sites,
                                                       result.variant_costs))
        return dataclasses.replace(result, variant_costs=costs)
    monkeypatch.setattr(measured, "profile", profile)


def test_a_faster_backend_is_chosen_and_trains_within_the_bound(monkeypatch):
    """Profiled faster (here by decree: 1 ms less each), the other backend is chosen for every
    convolution whose input the backward reads, and the plan trains within the lossy bounds."""
    _decree(monkeypatch, CONV, -1e-3)
    torch.manual_seed(0)
    base, x, loss_fn = models.silu_cnn()
    problem = monet_opt.lower_problem(copy.deepcopy(base), x, profile_repeats=1,
                                      allow_lossy=True, variants={CONV})
    assert [v.name.split(":")[0] for v in problem.variants] == [CONV, CONV]
    # the peak keeping everything with both in use: on CPU the other backend's backward has
    # more scratch (NOTE [Allocation events]), so store-all's own peak does not fit it
    limit = max(_no_recompute_peak(problem, frozenset()),
                _no_recompute_peak(problem, frozenset(range(len(problem.variants)))))
    opt = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                             allow_lossy=True, variants={CONV}, time_limit_s=10)
    assert len(opt.plan.variants) == 2, opt.plan.explain()
    assert_trains_within_bounds(opt, base, x, loss_fn)
    _check_memory(opt, x, loss_fn, limit, "convolution on another backend")


@pytest.mark.parametrize("causal, mask", [(True, None), (False, "causal"), (False, "random")])
def test_attention_backward_as_plain_products_is_within_its_bound(causal, mask):
    """The fused CPU kernel's backward against its products form from the same saved tensors:
    causal by flag, by an additive mask as Hugging Face's GPT-2 builds it, and a random mask."""
    torch.manual_seed(0)
    b, h, n, m, d = 2, 4, 24, 24 if mask != "random" else 40, 16
    q, k, v = torch.randn(b, h, n, d), torch.randn(b, h, m, d), torch.randn(b, h, m, d)
    attn_mask = None
    if mask == "causal":
        attn_mask = torch.zeros(n, m).masked_fill_(torch.ones(n, m, dtype=torch.bool).triu_(1),
                                                   torch.finfo(torch.float32).min)
    elif mask == "random":
        attn_mask = torch.randn(b, 1, n, m)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=attn_mask, scale=0.3)[:2]
    args = (torch.randn_like(out), q, k, v, out, lse, 0.0, causal)
    want = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *args, attn_mask=attn_mask, scale=0.3)
    got = variants_impl.attention_backward(*args, attn_mask=attn_mask, scale=0.3)
    assert relative_error(got, want) <= 1e-5


@pytest.mark.parametrize("n", [24, 40])
def test_efficient_attention_stand_in_reads_the_padded_logsumexp(n):
    """The CUDA memory-efficient kernel's stand-in (run here on the CPU kernel's saved tensors,
    with its logsumexp padded to a multiple of 32 rows as that kernel's is, the padding
    garbage): the CPU kernel's gradients within 1e-5, and no bias gradient."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, n, 16), torch.randn(2, 4, n, 16), torch.randn(2, 4, n, 16)
    bias = torch.randn(2, 1, n, n)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=bias, scale=0.3)[:2]
    padded = torch.cat([lse, torch.randn(2, 4, -n % 32)], dim=-1)
    grad = torch.randn_like(out)
    want = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, False, attn_mask=bias, scale=0.3)
    seed = offset = torch.empty((), dtype=torch.long)
    got = variants_impl.efficient_attention_backward(
        grad, q, k, v, bias, out, padded, seed, offset, 0.0, [True, True, True, False],
        False, scale=0.3)
    assert got[3] is None
    assert relative_error(got[:3], want) <= 1e-5


@pytest.mark.parametrize("extra_s", [1e-3, -1e-3], ids=["slower", "faster"])
def test_attention_products_are_offered_only_where_faster(extra_s, monkeypatch):
    """GPT-2 without dropout has the fused attention kernel in its graph. Its products form,
    profiled slower (by decree), is not offered (NOTE [Other implementations]); profiled faster,
    it is chosen at every attention, and the plan trains within the lossy bounds."""
    _decree(monkeypatch, ATTENTION, extra_s)
    torch.manual_seed(0)
    base, x, loss_fn = models.gpt2_tiny(dropout=0.0)
    problem = monet_opt.lower_problem(copy.deepcopy(base), x, profile_repeats=1,
                                      allow_lossy=True, variants={ATTENTION})
    assert len(problem.variants) == (2 if extra_s < 0 else 0)  # one per layer, or none
    if extra_s > 0:
        return
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1,
                             allow_lossy=True, variants={ATTENTION}, time_limit_s=10)
    assert len(opt.plan.variants) == 2, opt.plan.explain()
    assert_trains_within_bounds(opt, base, x, loss_fn)


def test_other_backends_leave_the_settings_as_they_were():
    """oneDNN's switch, and cuDNN's benchmark, deterministic and TF32 settings, are back as
    they were after the other backend ran (or failed)."""
    cudnn = torch.backends.cudnn
    before = (torch._C._get_mkldnn_enabled(), cudnn.benchmark, cudnn.deterministic,
              cudnn.allow_tf32)
    with variants_impl._mkldnn_off():
        assert not torch._C._get_mkldnn_enabled()
    with pytest.raises(RuntimeError), variants_impl._cudnn_flipped():
        assert cudnn.benchmark != before[1] and cudnn.deterministic
        raise RuntimeError("a failing op")
    assert (torch._C._get_mkldnn_enabled(), cudnn.benchmark, cudnn.deterministic,
            cudnn.allow_tf32) == before


def test_attention_bench_tables_what_each_backend_keeps(capsys):
    """monet_opt.bench_attention on CPU: the math backend keeps the probabilities (12 heads of
    128 x 128 float32: 0.75 MiB), the fused kernel only its logsumexp, and the stand-in gives
    the kernel's gradients within IMPL_BOUND."""
    from monet_opt import bench_attention
    bench_attention.main(["--device", "cpu", "--batch", "1", "--lengths", "128",
                          "--repeats", "1"])
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    kept = {tuple(r[:2]): r[-1] for r in rows if r[1] == "float32"}
    assert float(kept[("math", "float32")]) >= 0.7, kept
    assert float(kept[("flash_attention", "float32")]) == 0.0, kept
    stand_in = next(r for r in rows if r[0] == "128")
    assert float(stand_in[-1]) <= variants_impl.IMPL_BOUND, stand_in
