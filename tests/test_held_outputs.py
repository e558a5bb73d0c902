"""What the caller holds of a step's outputs through its backward (NOTE [Outputs held through
the backward] in monet_opt/held_outputs.py)."""
from __future__ import annotations

import copy
import warnings

import torch

import monet_opt
from tests import models

HUGE = 1 << 40


def test_an_alias_of_the_outputs_kept_through_the_backward_is_seen():
    """NOTE [Outputs held by their storage]: `preds = out.logits.detach(); del out` keeps the
    logits' storage, not the output tensor; every step passed its limit by the logits' bytes,
    with no warning and no replan. Now as for `out` kept: warned, then planned with them."""
    torch.manual_seed(0)
    base, x, _ = models.gpt2_tiny(dropout=0.0)
    x = {**x, "labels": x["input_ids"]}
    full = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, profile_dir=None)
    limit = full.plan.min_feasible_bytes + 2 * 2 * 32 * 500 * 4  # room to hold the logits
    least = monet_opt.optimize(base, x, limit, profile_repeats=1, profile_dir=None,
                               time_limit_s=5)
    seen = []
    for _ in range(3):
        base.zero_grad(set_to_none=True)
        out = least(**x)
        loss, kept = out.loss, out.logits.detach()
        del out
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss.backward()
            del kept
        seen.append([w.category for w in caught])
    assert seen[0] == [monet_opt.OutputsHeldWarning], seen
    assert "outputs held through the backward" in list(least.plans)[-1]
