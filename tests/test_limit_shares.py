"""Limits written as shares of the store-all step (NOTE [Limits as shares]): parsed, turned into
bytes by the first plan, kept for other shapes, and named where they cannot be met."""
from __future__ import annotations

import warnings

import pytest
import torch

import monet_opt
from monet_opt.units import Share, parse_limit
from tests import limits, models


@pytest.mark.parametrize("text, expected", [
    ("50% of activations", Share(0.5, "activations")), ("33.3 % activations",
                                                         Share(0.333, "activations")),
    ("60% of PEAK", Share(0.6, "peak")), ("120%peak", Share(1.2, "peak")),
    ("512MiB", 512 * 2**20), (4096, 4096),
    ("1e-3% of peak", Share(1e-5, "peak")),  # refused: "write a positive share"
])
def test_limit_forms(text, expected):
    assert parse_limit(text) == expected


@pytest.mark.parametrize("bad", ["50%", "0% of peak", "50% of gradients", "-10% of peak",
                                 "half of activations", 0.5, "lots", "1e400% of peak"])
def test_limit_rejects_saying_how_to_write_a_share(bad):
    with pytest.raises(ValueError, match="50% of activations"):
        parse_limit(bad)
    with pytest.raises(ValueError, match="memory_limit"):
        monet_opt.optimize(models.tiny_mlp(), torch.randn(8, 8), bad, profile_dir=None)


def test_share_checks_its_fields():
    with pytest.raises(ValueError, match="'activations' or 'peak'"):
        Share(0.5, "gradients")
    with pytest.raises(ValueError, match="positive and finite"):
        Share(float("inf"), "peak")


@pytest.mark.parametrize("of", ["activations", "peak"])
def test_a_share_past_every_byte_count_is_no_limit(of):
    """'1e308% of activations' raised a bare OverflowError (float infinity to an integer)."""
    assert Share(1e306, of).bytes_of(1000, 5000) == (0 if of == "peak" else 1000) + 2 ** 62
    opt = monet_opt.optimize(models.tiny_mlp(), torch.randn(8, 8), f"1e308% of {of}",
                             profile_dir=None, time_limit_s=5)
    assert opt.plan.recomputed_ops == 0


def _floor(plan: monet_opt.Plan) -> int:
    return plan.fixed_bytes + plan.gradient_bytes


@pytest.mark.parametrize("share", ["of activations", "70% of peak"])
def test_a_share_is_met_in_bytes_and_kept_for_other_shapes(share):
    torch.manual_seed(0)
    model, x, _ = models.small_cnn()
    if share == "of activations":  # halfway from the least peak to store-all (NOTE [Limits
        share = limits.share_between(model, x)  # between the least peak and store-all])
    opt = monet_opt.optimize(model, x, share, profile_repeats=1, time_limit_s=5,
                             profile_dir=None)
    plan = opt.plan
    wanted = parse_limit(share).bytes_of(_floor(plan), plan.store_all_peak_bytes)
    assert plan.memory_limit_bytes == wanted
    assert _floor(plan) < wanted < plan.store_all_peak_bytes
    assert plan.predicted_peak_bytes <= wanted
    resident = monet_opt.resident_tensors(model, x)
    measured = monet_opt.measure_peak(lambda: opt(x).sum().backward(), resident)
    assert measured <= wanted
    # a smaller batch is planned under the same bytes, not under the share of its own step
    small = x[:2].clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        opt(small).sum().backward()
    assert len(opt.plans) == 2
    assert all(p.memory_limit_bytes == wanted for p in opt.plans.values())


def test_an_unreachable_share_names_itself_and_its_bytes():
    model, x, _ = models.small_cnn()
    with pytest.raises(monet_opt.InfeasibleBudgetError, match=r"'1% of activations' \(") as info:
        monet_opt.optimize(model, x, "1% of activations", profile_repeats=1, time_limit_s=5,
                           profile_dir=None)
    assert info.value.min_feasible_bytes > info.value.memory_limit_bytes
