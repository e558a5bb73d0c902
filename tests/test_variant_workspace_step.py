"""NOTE [A variant's workspace beyond its op's] (monet_opt/lower_variants.py): a variant whose run
needs less scratch than its op has a negative extra workspace, and a plan choosing it measures
its prediction. On the CPU, a convolution's backward with oneDNN off (conv.other_backend) takes
a fraction of the weight-gradient-sized scratch oneDNN's takes."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt
from tests.test_generator_states import measured

CONV = "conv.other_backend"
HUGE = 1 << 40


class _Wide(nn.Module):
    """A 256-channel 3x3 convolution on 8x8 images: its weight (2.25 MiB) outweighs its
    activations, so the step peaks at its backward, where oneDNN's scratch is a weight's."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(8, 256, 3, padding=1), nn.Conv2d(256, 256, 3, padding=1)
        self.fc = nn.Linear(256, 4)

    def forward(self, x):
        return self.fc(self.b(torch.relu(self.a(x))).mean((2, 3)))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN: no other "
                    "convolution backend on the CPU")
def test_a_backend_with_less_scratch_lowers_the_least_peak_and_measures_it():
    """Its extra was floored at 0 before: the variant was dropped as no faster (NOTE [Variants
    that cannot pay]) and the least peak was store-all's, 7,561,256 B; chosen anyway, its plan
    predicted 1,180,672 B over its step. Now the least peak is 6,380,584 B, measured so."""
    torch.manual_seed(0)
    base, x = _Wide(), torch.randn(2, 8, 8, 8)
    kw = dict(profile_repeats=1, variants={CONV}, allow_lossy=True)
    problem = monet_opt.lower_problem(copy.deepcopy(base), x, **kw)
    kw["profile_dir"] = None
    (var,) = problem.variants
    op = problem.ops[var.op]
    assert -op.workspace_bytes < var.extra_workspace_bytes < -op.workspace_bytes // 4, (
        var.extra_workspace_bytes, op.workspace_bytes)
    store_all = monet_opt.optimize(copy.deepcopy(base), x, HUGE, **kw)
    least = store_all.plan.min_feasible_bytes
    assert least <= store_all.plan.store_all_peak_bytes + var.extra_workspace_bytes
    tight = monet_opt.optimize(copy.deepcopy(base), x, least, time_limit_s=5, **kw)
    assert tight.plan.variants == (var.name,), tight.plan.explain()
    assert "convolution_backward" in tight.plan.peak_op
    assert measured(tight, x, lambda out: out.sum()) == tight.plan.predicted_peak_bytes <= least
