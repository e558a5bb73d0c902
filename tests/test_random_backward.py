"""NOTE [Random ops of the backward] (monet_opt/rewrite.py): a backward that draws random
numbers from forward values alone draws them in the backward, as eager does, and only there."""
from __future__ import annotations

import torch
from torch import nn

from tests.test_executor import assert_plans_train_like_eager


class _NoisyTanh(torch.autograd.Function):
    """tanh whose backward scales its gradient by noise shaped like the saved output."""

    @staticmethod
    def forward(ctx, x):
        y = x.tanh()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return g * (1 - y * y) * (1 + 0.1 * torch.randn_like(y))


class _Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.l3(_NoisyTanh.apply(self.l2(_NoisyTanh.apply(self.l1(x)))))


def test_noise_drawn_in_a_custom_backward_is_eager_noise():
    """The forward also ran the backward's randn_like and dropped its draw, so the backward drew
    other numbers than eager's: every gradient below the first noisy layer differed (0.19 at
    most), with nothing said. Now bitwise eager's over three steps, generator state included,
    at store-all and at the least peak, memory at the prediction."""
    torch.manual_seed(0)
    base, x = _Noisy(), torch.randn(16, 8)
    loss_fn = lambda out: out.sum()  # noqa: E731
    assert_plans_train_like_eager(base, x, loss_fn, "noise drawn in a custom backward vs eager")
