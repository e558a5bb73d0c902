"""NOTE [Buffers viewing a larger storage]: a buffer that views part of a larger storage is
counted as the storage it keeps alive."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40


class _Sliced(nn.Module):
    def __init__(self, twice: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(10, 10)
        table = torch.randn(1000, 10)
        self.register_buffer("pe", table[:4])
        if twice:
            self.register_buffer("pe2", table[4:8])
        self.twice = twice

    def forward(self, x):
        h = self.lin(x + self.pe)
        return torch.tanh(h + self.pe2) if self.twice else h


@pytest.mark.parametrize("twice", [False, True])
def test_a_buffer_slicing_a_larger_table_is_counted_whole(twice):
    """Store-all predicted 1,488 B where the step held 41,328 B (the rest of the table the
    buffer keeps alive); now its prediction to the byte, the table counted once for two
    buffers slicing it; gradients eager's."""
    torch.manual_seed(0)
    model, x = _Sliced(twice), torch.randn(4, 10)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    measured = monet_opt.measure_peak(lambda: opt(x).sum().backward(),
                                      monet_opt.resident_tensors(model, x))
    assert measured == opt.plan.predicted_peak_bytes
    assert opt.plan.fixed_bytes >= 1000 * 10 * 4
    eager(x).sum().backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           eager.parameters()))
