"""NOTE [Generator-state replay]: dropout's backward draws its mask again from the generator
state kept from the forward, bitwise, leaving the random stream as eager leaves it."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from monet_opt import recompute, variants
from tests.test_executor import assert_same, run_steps
from tests.test_variants import lowers_the_least_peak

aten = torch.ops.aten
REPLAY = "dropout.replay"


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "channels_last"])
def test_the_replayed_mask_is_the_forwards(layout):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 10, 12)
    x = {"contiguous": x, "transposed": x.transpose(1, 3), "strided": x[:, ::2],
         "channels_last": x.contiguous(memory_format=torch.channels_last)}[layout]
    state = recompute.rng_state("cpu")
    _, mask = aten.native_dropout(x, 0.4, True)
    after = torch.get_rng_state()
    fam = variants.family(REPLAY)
    layout_ = (0.4, tuple(x.shape), tuple(mask.stride()), tuple(x.stride()), x.dtype, 0, "cpu")
    again = fam.decode(state, *layout_)
    assert torch.equal(again, mask) and again.stride() == mask.stride()
    assert torch.equal(torch.get_rng_state(), after)  # the stream is where the forward left it
    assert fam.encode(mask, *layout_).numel() == recompute.rng_state_nbytes("cpu")


class DropoutChain(nn.Module):
    """Dropouts in a row on a wide activation, each backward reading nothing but its mask: the
    masks the backward has not reached yet are what it holds beyond the gradients."""

    def __init__(self, depth: int = 8) -> None:
        super().__init__()
        self.fc, self.depth = nn.Linear(64, 1024), depth

    def forward(self, x):
        y = self.fc(x)
        for _ in range(self.depth):
            y = F.dropout(y, 0.2, self.training) + 1.0
        return y


def test_replay_lowers_the_least_peak_and_trains_exactly():
    """With replay the least reachable peak is lower than with bit masks alone; the plan there
    replays, trains bitwise like store-all (the random stream included) and stays within its
    limit (measured)."""
    torch.manual_seed(0)
    base, x = DropoutChain(), torch.randn(256, 64)
    loss_fn = lambda out: out.sum()  # noqa: E731
    others = [f.name for f in variants.FAMILIES if f.exact and f.name != REPLAY]
    # its least peak is at the last dropout's forward run, priced with a generator state held
    # as its recomputation holds one (NOTE [The replay's state held])
    store_all = lowers_the_least_peak(base, x, loss_fn, REPLAY, without=others,
                                      state_bytes=recompute.rng_state_nbytes("cpu"))
    eager = copy.deepcopy(base)
    assert_same(run_steps(eager, eager, x, loss_fn), store_all, exact=True,
                what="store-all vs eager")
