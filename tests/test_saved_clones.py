"""NOTE [Saved clones] (monet_opt/saved_clones.py): the copies autograd saves for in-place
activations are not made, ReLU6's backward reads its own output, and training stays bitwise."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt
from tests.test_executor import HUGE, assert_same, run_steps

aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("lo,hi", [(0.0, 6.0), (-1.0, 1.0), (-0.5, 2.5), (1.0, 1.0)])
def test_hardtanh_backward_from_the_output_is_bitwise(dtype, lo, hi):
    """Rewrite 2's claim, on the values where it could fail: NaN, infinities, both zeros, the
    bounds themselves and their neighbours, and random values around them."""
    torch.manual_seed(0)
    special = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, lo, hi]
    near = [torch.nextafter(torch.tensor(b, dtype=torch.float64), torch.tensor(d)).item()
            for b in (lo, hi) for d in (-1e9, 1e9)]
    x = torch.cat([torch.tensor(special + near), torch.randn(4096) * 4]).to(dtype)
    g = torch.randn(x.shape, dtype=dtype)
    y = aten.hardtanh(x, lo, hi)
    from_input = aten.hardtanh_backward(g, x, lo, hi)
    from_output = aten.hardtanh_backward(g, y, lo, hi)
    assert torch.equal(from_input, from_output)
    assert from_input.ne(0).any() or lo == hi  # not vacuous


class InvertedResidual(nn.Module):
    """MobileNetV2's block: expand, depthwise, project, each convolution followed by BatchNorm,
    the first two by ReLU6(inplace=True), whose derivative reads its input."""

    def __init__(self, c: int = 8, expand: int = 4) -> None:
        super().__init__()
        h = c * expand
        self.body = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(inplace=True),
            nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h),
            nn.ReLU6(inplace=True), nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.body(x)


def _net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), InvertedResidual(), InvertedResidual(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def test_relu6_network_keeps_no_clones_and_trains_bitwise():
    """Eager keeps a clone of each ReLU6's input (four here, each h x 16 x 16 floats); the
    store-all plan keeps none, peaks lower by most of them, as predicted, and trains like eager to
    the bit (gradients, BatchNorm statistics, parameters over three SGD steps)."""
    torch.manual_seed(0)
    base, x = _net().train(), torch.randn(4, 3, 16, 16)
    loss_fn = lambda out: out.square().sum()  # noqa: E731
    problem = monet_opt.lower_problem(copy.deepcopy(base), x, profile_repeats=1)
    assert not [op.name for op in problem.ops if op.name.startswith("clone")]
    eager = copy.deepcopy(base)
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, profile_dir=None)
    step = lambda m: loss_fn(m(x)).backward()  # noqa: E731
    eager_peak = monet_opt.measure_peak(lambda: step(eager), monet_opt.resident_tensors(eager, x))
    ours = monet_opt.measure_peak(lambda: step(opt), monet_opt.resident_tensors(opt.model, x))
    assert ours == opt.plan.predicted_peak_bytes
    clones = 4 * 4 * 32 * 16 * 16 * 4  # eager frees some before its peak; 3.25 of 4 measured
    assert eager_peak - ours >= 0.75 * clones
    for m in (eager, opt.model):
        m.load_state_dict(base.state_dict())
        m.zero_grad(set_to_none=True)
    assert_same(run_steps(opt, opt.model, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                exact=True, what="ReLU6 network without saved clones vs eager")


def test_relu6_network_recomputing_trains_bitwise():
    """At the least feasible limit the plan recomputes through the rewritten ReLU6 backward and
    still trains bitwise like eager."""
    torch.manual_seed(0)
    base, x = _net().train(), torch.randn(4, 3, 16, 16)
    loss_fn = lambda out: out.square().sum()  # noqa: E731
    full = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, profile_dir=None)
    tight = monet_opt.optimize(copy.deepcopy(base), x, full.plan.min_feasible_bytes,
                               profile_repeats=1, profile_dir=None, time_limit_s=5)
    assert tight.plan.recomputed_ops > 0
    eager = copy.deepcopy(base)
    assert_same(run_steps(tight, tight.model, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                exact=True, what="recomputing ReLU6 plan vs eager")
