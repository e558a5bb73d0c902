"""Plan.explain()'s table: every op under its whole name, columns aligned whatever the
decision's length (names were cut to 28 characters: twenty of ResNet-18's BatchNorms read
alike, and the op at the peak could not be found; UX probe, 2026-12-06)."""
from __future__ import annotations

import torch
import torch.fx.traceback as fx_traceback

import monet_opt
from tests import models


def test_the_table_shows_whole_names_in_aligned_columns():
    torch.manual_seed(0)
    model, x, _ = models.small_cnn()
    least = monet_opt.optimize(model, x, 1 << 40, profile_dir=None,
                               profile_repeats=1).plan.min_feasible_bytes
    plan = monet_opt.optimize(model, x, least, profile_dir=None, profile_repeats=1,
                              time_limit_s=5).plan
    text = plan.explain()
    lines = text.splitlines()
    head = next(k for k, line in enumerate(lines) if line.lstrip().startswith("phase"))
    rows = lines[head + 1:]
    assert len(rows) == len(plan.rows) and plan.recomputed_ops > 0
    for row, line in zip(plan.rows, rows):
        assert f" {row.name} " in line
    starts = {line.index(row.label, line.index(row.decision) + len(row.decision))
              for row, line in zip(plan.rows, rows)}
    assert starts == {lines[head].index("source")}  # the source column, aligned
    peak = plan.peak_op.split(",")[0]
    assert sum(line.split()[1] == peak for line in rows) == 1


def test_ops_are_named_with_the_module_they_ran_in():
    """NOTE [Module paths of ops]: the source column named the ATen overload alone."""
    torch.manual_seed(0)
    model, x, _ = models.small_cnn()
    plan = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1).plan
    labels = {(r.phase, r.label) for r in plan.rows}
    assert ("forward", "convolution.default in stem.0") in labels
    assert ("backward", "convolution_backward.default in stem.0") in labels
    assert ("forward", "native_dropout.default in drop") in labels
    assert "nn_module_stack" not in fx_traceback.current_meta  # nothing left behind
    assert not torch.nn.modules.module._global_forward_pre_hooks
