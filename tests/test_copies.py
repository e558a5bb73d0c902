"""NOTE [Copies of a whole storage] (monet_opt/lower.py): a model that writes in place into
slices of a tensor traces as copy and *_scatter ops, each of which allocates a copy of its
first argument's whole storage. Their predicted bytes are those; the step measures its
predicted peak to the byte, within its limit, and trains bitwise as eager does."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt.lower import _COPIES_SELF_STORAGE, _copy_bytes
from tests.test_executor import HUGE, assert_same, run_steps


class WritesIntoSlices(nn.Module):
    """In-place writes into column slices, a row, a diagonal and a strided window."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        h = self.a(x)
        h[:, :4] *= 2
        h[1] += 0.5
        h[:, 8:].diagonal().mul_(3)
        h[::2, 10:14] += 1
        h[:, 4:8].relu_()
        return self.b(torch.sigmoid(h))


def _limits(model, x):
    full = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_repeats=1,
                              profile_dir=None)
    p = full.plan
    half = p.fixed_bytes + p.gradient_bytes + p.store_all_activation_bytes // 2
    return [HUGE, max(p.min_feasible_bytes, half), p.min_feasible_bytes]


@pytest.mark.parametrize("which", ["store-all", "half", "least"])
def test_writes_into_slices_measure_their_prediction(which):
    torch.manual_seed(0)
    model, x = WritesIntoSlices(), torch.randn(8, 16)
    limit = _limits(model, x)[["store-all", "half", "least"].index(which)]
    opt = monet_opt.optimize(copy.deepcopy(model), x, limit, profile_repeats=1,
                             profile_dir=None)
    step = lambda: opt(x).sum().backward()  # noqa: E731
    measured = monet_opt.measure_peak(step, monet_opt.resident_tensors(opt.model, x))
    assert measured == opt.plan.predicted_peak_bytes <= limit
    eager = copy.deepcopy(model)
    opt.model.zero_grad(set_to_none=True)
    loss_fn = lambda out: out.sum()  # noqa: E731
    assert_same(run_steps(opt, opt.model, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                exact=True, what=f"writes into slices at {which}")


def test_copies_are_sized_as_aten_allocates_them():
    """Each op of _COPIES_SELF_STORAGE on a view of a 8x16 matrix allocates the matrix's
    storage, as _copy_bytes says; a self overlapping itself is cloned densely (None: the
    fake tensor's size stands)."""
    base = torch.randn(8, 16)
    view = base[2:6]
    aten = torch.ops.aten
    calls = {aten.copy.default: lambda: aten.copy(view, torch.randn(4, 16)),
             aten.slice_scatter.default: lambda: aten.slice_scatter(view, torch.randn(4, 4), 1, 0,
                                                                    4),
             aten.select_scatter.default: lambda: aten.select_scatter(view, torch.randn(4), 1, 0),
             aten.diagonal_scatter.default: lambda: aten.diagonal_scatter(view, torch.randn(4)),
             aten.as_strided_scatter.default: lambda: aten.as_strided_scatter(
                 view, torch.randn(4, 16), (4, 16), (16, 1), 32)}
    assert set(calls) == _COPIES_SELF_STORAGE
    for op, run in calls.items():
        assert run().untyped_storage().nbytes() == _copy_bytes(view) == 512, op
    assert _copy_bytes(torch.randn(1, 16).expand(8, 16)) is None
