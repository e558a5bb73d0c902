"""The lower-set DP (solver="dp") on lowered models."""
from __future__ import annotations

import torch
from torch import nn

import monet_opt


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.into, self.rnn, self.out = nn.Linear(12, 12), nn.GRU(12, 32, batch_first=True), \
            nn.Linear(32, 3)

    def forward(self, x):
        return self.out(self.rnn(self.into(x))[0]).square().mean()


def test_a_limit_store_all_fits_is_met():
    """Each chain of the DP's least cap simulated above store-all's peak: the least peak it
    said was 77,648 B where store-all peaks at 71,312 B, and it refused that limit."""
    torch.manual_seed(0)
    x = torch.randn(4, 7, 12)
    plan = monet_opt.optimize(_Recurrent(), x, 1 << 40, profile_dir=None,
                              profile_repeats=1).plan
    limit = plan.store_all_peak_bytes
    opt = monet_opt.optimize(_Recurrent(), x, limit, solver="dp", profile_dir=None,
                             profile_repeats=1, time_limit_s=5)
    assert opt.plan.predicted_peak_bytes <= limit and opt.plan.min_feasible_bytes <= limit
