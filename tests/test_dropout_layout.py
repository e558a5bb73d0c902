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
from monet_opt import alloc_events

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
    # 8 B either way; 12 B over where CPU scratch is counted and the plan peaks at a dropout
    # backward written into its dying dy: its functional form, profiled, has 12 B of scratch
    # that `mul(grad, mask, out=dy).mul_(scale)` does not (NOTE [Dropout's gradient in place])
    over = 12 if alloc_events.enabled() and "dropout_backward" in opt.plan.peak_op else 8
    assert -8 <= opt.plan.predicted_peak_bytes - peak <= over, (peak, opt.plan.predicted_peak_bytes)


class _InPlaceDropout(nn.Module):
    """A channels-last CNN whose dropout is in place, and one on a transposed activation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.drop = nn.Conv2d(3, 8, 3, padding=1), nn.Dropout(0.3, inplace=True)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        h = torch.tanh(self.drop(self.conv(x)))  # channels-last
        h = self.fc(h.mean((2, 3)))
        nn.functional.dropout(h.t(), 0.2, True, True)  # into h, through its transpose
        return torch.tanh(h)


class _AfterMisreadLayout(nn.Module):
    """An in-place dropout of a BatchNorm whose input is transposed: the tracer says the
    BatchNorm's output is transposed, the CPU kernel makes it contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.bn, self.drop = nn.BatchNorm2d(3), nn.Dropout(0.5, inplace=True)
        self.head = nn.Linear(3, 4)

    def forward(self, x):
        x = nn.functional.dropout(x.transpose(2, 3), 0.1, self.training)
        return self.head(self.drop(self.bn(x)).mean((2, 3)))


class _ConvModule(nn.Module):
    """A Conformer's convolution module, reduced: a 1x1 Conv1d on the transposed sequence,
    dropout, transposed back, a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.pw, self.lin = nn.Conv1d(64, 64, 1), nn.Linear(64, 64)

    def forward(self, x):
        h = nn.functional.dropout(self.pw(x.transpose(1, 2)), 0.1, True)
        return self.lin(x + h.transpose(1, 2))


@pytest.mark.parametrize("least", [False, True])
def test_a_gradient_nothing_reads_by_strides_keeps_the_kernels_layout(least):
    """The copy into the traced layout, made for every transposed gradient, changed the order
    of the convolution's bias sum: 9.2e-5 from eager's (audio probe, 2026-12-07)."""
    torch.manual_seed(0)
    model, x = _ConvModule(), torch.randn(2, 166, 64)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    if least:
        opt = monet_opt.optimize(model, x, opt.plan.min_feasible_bytes, profile_dir=None,
                                 profile_repeats=1, time_limit_s=5)
    for module in (eager, opt):
        torch.manual_seed(1)
        module(x).sum().backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           eager.parameters()))


@pytest.mark.parametrize("least", [False, True])
@pytest.mark.parametrize("make", [_InPlaceDropout, _AfterMisreadLayout])
def test_in_place_dropout_on_permuted_activations_draws_eager_s_mask(make, least):
    """NOTE [Noise in the input's memory order] in monet_opt/dropout_scale.py: the step drew the
    same numbers onto other elements (a channels-last CNN's loss 0.58 for eager's 0.49); drawn
    by the layout the tracer misread, after a BatchNorm of a transposed input (0.51 for
    0.55)."""
    torch.manual_seed(0)
    model, x = make(), torch.randn(4, 3, 12, 12)
    if make is _InPlaceDropout:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    limit = 1 << 40
    if least:
        with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
            monet_opt.optimize(copy.deepcopy(model), x, 1, profile_dir=None, profile_repeats=1,
                               time_limit_s=5)
        limit = info.value.min_feasible_bytes
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, limit, profile_dir=None, profile_repeats=1,
                             time_limit_s=5)
    runs = []
    for module, owner in ((opt, model), (eager, eager)):
        torch.manual_seed(1)
        out = module(x)
        out.square().sum().backward()
        runs.append((out, [p.grad for p in owner.parameters()], torch.get_rng_state()))
    (out, grads, rng), (want, want_grads, want_rng) = runs
    assert torch.equal(out, want) and torch.equal(rng, want_rng)
    assert all(torch.equal(a, b) for a, b in zip(grads, want_grads))
