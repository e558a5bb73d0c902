"""Variants in channels-last networks: NOTE [1-bit masks] and NOTE [Layouts a stand-in cannot
show] (monet_opt/variants.py). Converting a CNN to channels-last is a user's one line (and what
torch.compile does on CPU by itself); the variants must keep working there."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import monet_opt
from monet_opt import variants
from monet_opt.memory import counted
from tests import models
from tests.test_executor import HUGE, _check_memory, assert_same, run_steps
from tests.test_variants import _no_recompute_peak, free_variants  # noqa: F401 (a fixture)
from solvers.variants import lightest

aten = torch.ops.aten

def _squeezed():
    """A squeeze-excitation block (RegNet-Y's, MobileNetV3's): a ReLU on a [N, C, 1, 1] map,
    whose channels-last strides differ from its variants' only in the dimensions of length 1
    (their masks were refused: `_same_layout` in monet_opt/variant_probe.py)."""
    from torchvision.ops import SqueezeExcitation
    net = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), SqueezeExcitation(8, 2),
                              torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(8, 3))
    return net, torch.randn(2, 8, 16, 16), lambda out: out.sum()


def _channels_last(make):
    torch.manual_seed(0)
    base, x, loss_fn = make()
    return (base.to(memory_format=torch.channels_last),
            x.contiguous(memory_format=torch.channels_last), loss_fn)


@pytest.mark.parametrize("make, wanted", [
    (models.pool_cnn, {"relu.bit_mask", "maxpool.shape_only", "maxpool.compact_indices"}),
    (lambda: models.shape_only_net("avgpool"), {"avgpool.shape_only"}),
    (lambda: models.shape_only_net("adaptive_avgpool"), {"adaptive_avgpool.shape_only"}),
    (lambda: _squeezed(), {"relu.bit_mask"})],
    ids=["pool_cnn", "avgpool", "adaptive_avgpool", "squeeze_excitation"])
def test_channels_last_network_keeps_every_exact_variant(make, wanted):
    """The profiler refuses no variant of a channels-last network (before: every ReLU's 1-bit
    mask and every pooling's shape-only stand-in, their results laid out contiguous)."""
    base, x, _ = _channels_last(make)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problem = monet_opt.lower_problem(copy.deepcopy(base), x, profile_repeats=1)
    refused = [w for w in caught if "did not reproduce" in str(w.message)]
    assert not refused, refused[0].message
    offered = {v.name.split(":")[0] for v in problem.variants}
    assert wanted <= offered, offered


@pytest.mark.parametrize("make, wanted", [
    (models.pool_cnn, {"relu.bit_mask", "maxpool.shape_only"}), (_squeezed, {"relu.bit_mask"})],
    ids=["pool_cnn", "squeeze_excitation"])
def test_channels_last_plan_with_the_variants_trains_bitwise(free_variants, make, wanted):
    """At the peak of keeping everything with the lightest variants, the plan uses the 1-bit
    masks and the max-pool's stand-in, and trains bitwise like store-all, within its limit."""
    base, x, loss_fn = _channels_last(make)
    problem = monet_opt.lower_problem(copy.deepcopy(base), x, profile_repeats=1)
    limit = _no_recompute_peak(problem, lightest(problem))
    tight = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                               time_limit_s=10)
    used = {name.split(":")[0] for name in tight.plan.variants}
    assert wanted <= used, tight.plan.explain()
    ref = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, variants=False)
    assert_same(run_steps(tight, tight.model, x, loss_fn), run_steps(ref, ref.model, x, loss_fn),
                exact=True, what="channels-last variants vs store-all")
    _check_memory(tight, x, loss_fn, limit, "channels-last variants")


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last],
                         ids=["nchw", "channels_last"])
def test_combined_maxpool_variants_hold_no_more_than_their_parts(layout):
    """The simulator adds the workspaces the profiler measured for each variant alone; the
    two max-pool variants together must not hold more (their result was once allocated
    before the indices were decoded, and held beside the decoding's temporaries: 8 MiB over
    on GoogLeNet, over its limit)."""
    x = torch.randn(4, 32, 16, 16).contiguous(memory_format=layout)
    rest = ([3, 3], [1, 1], [1, 1], [1, 1], True)
    out, idx = aten.max_pool2d_with_indices(x, *rest)
    g = torch.randn_like(out)
    geometry = (3, 3, 1, 1, 1, 1, 1, 1, 16)
    offsets = variants.encode("maxpool.compact_indices", idx, *geometry)
    like, strides = (tuple(x.shape), x.dtype, x.device), (x.stride(),)
    want = aten.max_pool2d_with_indices_backward(g, x, *rest, idx)
    shape_only, ws_shape = counted(lambda: variants.run(
        ("maxpool.shape_only",), (strides,), g, like, *rest, idx), cuda=False)
    compact, ws_compact = counted(lambda: variants.run(
        ("maxpool.compact_indices",), (geometry,), g, x, *rest, offsets), cuda=False)
    both, ws_both = counted(lambda: variants.run(
        ("maxpool.shape_only", "maxpool.compact_indices"), (strides, geometry), g, like, *rest,
        offsets), cuda=False)
    for got in (shape_only, compact, both):
        assert torch.equal(got, want) and got.stride() == want.stride()
    assert ws_both <= ws_shape + ws_compact, (ws_both, ws_shape, ws_compact)
