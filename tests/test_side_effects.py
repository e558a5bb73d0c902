"""What the forward's own Python changes while traced (NOTE [A flag the forward sets once] in
monet_opt/side_effects.py)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40
pytestmark = pytest.mark.filterwarnings("ignore::monet_opt.OutputGradientWarning")


class FirstBatchScale(nn.Module):
    """LSQ's quantizer: its scale set from the first batch it sees, once, by a flag."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(8, 8)
        self.s = nn.Parameter(torch.tensor(1.0))
        self.initialized = False

    def forward(self, x):
        if not self.initialized:
            self.s.data.copy_(2 * x.abs().mean())
            self.initialized = True
        return self.quantized(x)

    def quantized(self, x):
        q = torch.clamp(x / self.s, -8, 7)
        return self.f((q + (q.round() - q).detach()) * self.s)


class PrivateFlag(FirstBatchScale):
    def __init__(self) -> None:
        super().__init__()
        self._initialized = False

    def forward(self, x):
        if not self._initialized:
            self.s.data.copy_(2 * x.abs().mean())
            self._initialized = True
        return self.quantized(x)


@pytest.mark.parametrize("kind, flag", [(FirstBatchScale, "initialized"),
                                        (PrivateFlag, "_initialized")])
def test_a_flag_the_forward_sets_once_is_refused_and_put_back(kind, flag):
    """The trace ran past the flag: the scale was never set and the model was left flagged."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.ReLU(), kind())
    x = torch.randn(16, 8)
    with pytest.raises(monet_opt.CaptureError, match=rf"flipped 1\.{flag} False -> True"
                                                     r".*Run the model once on a batch"):
        monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    assert getattr(model[1], flag) is False
    assert model[1].s.item() == 1.0


def test_run_once_first_the_model_trains_as_eager():
    """What the refusal says to do: the flag is set, the trace reads it as set, and the steps
    are eager's."""
    torch.manual_seed(0)
    model, x = FirstBatchScale(), torch.randn(16, 8)
    model(x)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    for _ in range(2):
        opt(x).sum().backward()
        eager(x).sum().backward()
    assert torch.equal(model.s.grad, eager.s.grad) and torch.equal(model.s, eager.s)
    assert torch.equal(model.f.weight.grad, eager.f.weight.grad)
