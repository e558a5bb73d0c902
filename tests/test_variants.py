"""The operator-variant library: exact encodings, and what they are worth to a plan."""
from __future__ import annotations

import copy

import pytest
import torch

import monet_opt
from monet_opt import variants
from tests import models
from tests.test_executor import HUGE, _check_memory, assert_same, run_steps

aten = torch.ops.aten


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (9,), (3, 5, 7), (2, 64, 33)])
def test_bit_packing_round_trips(shape):
    b = torch.rand(shape) < 0.4
    packed = variants.pack_bits(b)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-b.numel() // 8)
    assert torch.equal(variants.unpack_bits(packed, b.shape), b)


def test_each_family_reproduces_its_op_bitwise():
    torch.manual_seed(0)
    y = torch.relu(torch.randn(4, 8, 9, 9))
    y[0, 0, 0, :3] = torch.tensor([float("nan"), 0.0, -0.0])
    g = torch.randn_like(y)
    want = aten.threshold_backward(g, y, 0)
    for name in ("relu.bool_mask", "relu.bit_mask"):
        fam = variants.family(name)
        got = fam.run(g, fam.encode(y, 0), 0)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num()), name
    out, mask = aten.native_dropout(y, 0.3, True)
    want = aten.native_dropout_backward(g, mask, 1 / 0.7)
    fam = variants.family("dropout.bit_mask")
    assert torch.equal(fam.run(g, fam.encode(mask), 1 / 0.7), want)
    out, idx = aten.max_pool2d_with_indices(y, [3, 3], [2, 2], [1, 1])
    gp = torch.randn_like(out)
    rest = ([3, 3], [2, 2], [1, 1], [1, 1], False, idx)
    want = aten.max_pool2d_with_indices_backward(gp, y, *rest)
    fam = variants.family("maxpool.shape_only")
    assert torch.equal(fam.run(gp, (tuple(y.shape), y.dtype), *rest), want)


def test_variants_lower_the_least_peak_and_train_exactly():
    """On a network with ReLU, max-pool and dropout: with variants the least reachable peak is
    lower than with recomputation alone, and the plan there uses them, trains bitwise like
    store-all, and stays within its limit (measured)."""
    torch.manual_seed(0)
    base, x, loss_fn = models.small_cnn()
    without = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1,
                                 variants=False)
    with_ = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1)
    assert with_.plan.min_feasible_bytes < without.plan.min_feasible_bytes
    limit = with_.plan.min_feasible_bytes
    tight = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                               time_limit_s=10)
    assert tight.plan.variants, "the least-peak plan uses no variant"
    assert "variants in use" in tight.plan.explain()
    ref_run = run_steps(with_, with_.model, x, loss_fn)
    assert_same(run_steps(tight, tight.model, x, loss_fn), ref_run, exact=True,
                what="least-peak plan with variants vs store-all")
    _check_memory(tight, x, loss_fn, limit, "least peak with variants")
