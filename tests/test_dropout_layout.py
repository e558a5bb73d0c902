"""NOTE [Dropout backward's layout]: a norm_first nn.TransformerEncoder followed by a batch_first
nn.MultiheadAttention (which transposes its input) hands the encoder's last dropout a transposed
gradient, whose CPU backward kernel keeps that layout where the trace assumed a contiguous one;
optimize() failed on it (CaptureError). Now it trains as eager."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(
            64, 4, 128, dropout=0.1, batch_first=True, norm_first=True), 2)
        self.attend = nn.MultiheadAttention(64, 4, dropout=0.1, batch_first=True)

    def forward(self, x, pad):
        h = self.enc(x, src_key_padding_mask=pad)
        return self.attend(h, h, h, key_padding_mask=pad, need_weights=False)[0].sum()


def _step(module, owner, x, pad):
    owner.zero_grad(set_to_none=True)
    torch.manual_seed(2)
    loss = module(x, pad)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in owner.parameters()]


@pytest.mark.parametrize("half", [False, True])
def test_norm_first_encoder_trains_as_eager(half):
    torch.manual_seed(0)
    model = _Encoder().train()
    x, pad = torch.randn(4, 32, 64), torch.zeros(4, 32, dtype=torch.bool)
    pad[0, 20:] = True
    opt = monet_opt.optimize(copy.deepcopy(model), (x, pad), HUGE, profile_dir=None,
                             profile_repeats=1)
    if half:
        p = opt.plan
        opt = monet_opt.optimize(copy.deepcopy(model), (x, pad), p.fixed_bytes + p.gradient_bytes
                                 + p.store_all_activation_bytes // 2, profile_dir=None,
                                 profile_repeats=1, time_limit_s=5)
        assert opt.plan.recomputed_ops > 0
    eager = copy.deepcopy(model)
    (want_loss, want), (loss, grads) = _step(eager, eager, x, pad), _step(opt, opt.model, x, pad)
    assert torch.equal(loss, want_loss)
    assert all(torch.equal(g, w) for g, w in zip(grads, want))
    opt.model.zero_grad(set_to_none=True)
    peak = monet_opt.measure_peak(lambda: opt(x, pad).backward(),
                                  monet_opt.resident_tensors(opt.model, (x, pad)))
    assert abs(peak - opt.plan.predicted_peak_bytes) <= 8, (peak, opt.plan.predicted_peak_bytes)
