"""NOTE [Workspace written into] (monet_opt/variant_probe.py): a 1-bit mask's backward writing
into its dying dy is priced with the workspace it has so, and its step measures the plan's peak
to the byte; unpacking a mask makes no second byte per element (NOTE [1-bit masks])."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt import memory, variants_bits
from solvers import SolveResult, registry, schedule_from_kept
from solvers.milp import MilpOptions
from solvers.variants import lightest
from tests.problems import as_result
from tests.test_executor import HUGE


class _MaskLast(nn.Module):
    """A ReLU or dropout whose backward, its mask kept as bits and its result written into
    its dy, holds the step's peak: the gradient of the scale after it is held then, and the
    layer before has a frozen weight (its bias's gradient is small). The shift's gradient, held
    through the backward, keeps the peak there: else a dropout's forward, priced with one
    generator state more than it holds there (NOTE [The replay's state held] in
    monet_opt/recompute.py), held the plan's peak once its kernel's scratch was counted."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 256)
        self.lin.weight.requires_grad_(False)
        self.act = nn.ReLU() if kind == "relu" else nn.Dropout(0.3)
        self.scale = nn.Parameter(torch.randn(16, 256))
        self.shift = nn.Parameter(torch.randn(16, 256))

    def forward(self, x):
        return (self.act(self.lin(x)) * self.scale + self.shift.square()).sum()


def _lightest_kept(problem, budget, _options) -> SolveResult:
    """Nothing recomputed, every lightest variant in use, their encodings kept."""
    light = lightest(problem)
    replaced = {problem.variants[v].replaces for v in light}
    reads = {t for v in light for t in problem.variants[v].reads}
    return as_result(problem, schedule_from_kept(problem, frozenset(
        set(problem.saved_for_backward) - replaced | reads), light))


@pytest.mark.parametrize("kind, op", [("relu", "threshold_backward"),
                                      ("dropout", "native_dropout_backward")])
def test_masks_written_into_measure_their_prediction(monkeypatch, kind, op):
    """Before, the workspace was measured with the result made anew (the unpacked mask beside
    dx), and the step peaked over its plan by the unpacking's second temporary."""
    monkeypatch.setitem(registry._REGISTRY, "milp", (_lightest_kept, MilpOptions))
    torch.manual_seed(0)
    base, x = _MaskLast(kind), torch.randn(16, 8)
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, solver="milp", profile_repeats=1,
                             variants=(f"{kind}.bit_mask",), profile_dir=None)
    assert f"{kind}.bit_mask:{op}" in opt.plan.variants
    assert opt.plan.peak_op.startswith(f"{op},"), opt.plan.peak_op
    assert opt.plan.in_place_backward >= 1
    resident = monet_opt.resident_tensors(opt.model, x)
    torch.manual_seed(1)
    measured = monet_opt.measure_peak(lambda: opt(x).sum().backward(), resident)
    assert measured == opt.plan.predicted_peak_bytes
    # a second step adds into the gradients in place (NOTE [Accumulating in place]), the scale's
    # gradient made by a multiplication into the activation made again: that call took the
    # op's tag for writing into its input, an internal error
    torch.manual_seed(2)
    with pytest.warns(monet_opt.ReplanWarning, match="gradients resident"):
        opt(x).sum().backward()
    eager = copy.deepcopy(base)
    for seed in (1, 2):
        torch.manual_seed(seed)
        eager(x).sum().backward()
    for (name, p), q in zip(opt.model.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        assert p.grad is None or torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("numel", [8, 4096, 4099])
def test_unpacking_makes_one_byte_per_element(numel):
    mask = torch.rand(numel) > 0.5
    packed = variants_bits.pack_bits(mask)
    out, workspace = memory.counted(lambda: variants_bits.unpack_bits(packed, (numel,)), False,
                                    (packed,))
    assert torch.equal(out, mask)
    # the bit weights as they are made, and by the allocation events (NOTE [Allocation
    # events]) ne_'s wrapped scalar and its cast too (17 B): a few bytes, nothing per element
    assert workspace <= 32
