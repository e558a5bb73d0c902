"""Ops whose traced Python decomposition is not what eager runs (upsampling, GRU and RNN with
dropout between layers, margin losses) are traced as eager's kernels, so plans train bitwise
like eager; LSTM traces, with a warning that says how it differs (NOTE [Eager's own
kernels])."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import monet_opt
from monet_opt.eager_kernels import _EAGER, _KEYS, _overloads, eager_kernels
from tests.test_executor import HUGE, _check_memory, assert_same, run_steps


class Upsampling(nn.Module):
    def __init__(self, dims: int, **interpolate):
        super().__init__()
        conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1]
        self.a, self.b = conv(3, 8, 3, padding=1), conv(8, 4, 3, padding=1)
        self.interpolate = interpolate

    def forward(self, x):
        return self.b(F.interpolate(torch.relu(self.a(x)), **self.interpolate))


class Recurrent(nn.Module):
    def __init__(self, rnn: nn.RNNBase, grad_into: bool = True):
        super().__init__()
        self.into = nn.Linear(12, 12) if grad_into else nn.Identity()
        self.rnn, self.out = rnn, nn.Linear(rnn.hidden_size * (1 + rnn.bidirectional), 3)

    def forward(self, x):
        return self.out(self.rnn(self.into(x))[0])


class CellLoop(nn.Module):
    """nn.GRUCell stepped in Python over the sequence."""

    def __init__(self, width: int = 40):
        super().__init__()
        self.cell, self.out = nn.GRUCell(12, width), nn.Linear(width, 3)

    def forward(self, x):
        h = x.new_zeros(x.shape[1], self.cell.hidden_size)
        for step in x:
            h = self.cell(step, h)
        return self.out(h)


class Margin(nn.Module):
    """A classifier with its margin loss (sums in another order when decomposed: a loss
    1.2e-7 from eager's; with p=2 and class weights, gradients 3e-8)."""

    def __init__(self, multilabel: bool):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 6))
        self.multilabel = multilabel
        target = torch.full((8, 6), -1) if multilabel else torch.arange(8) % 6
        if multilabel:
            target[:, 0], target[::2, 1] = torch.arange(8) % 6, 5
        self.register_buffer("target", target)

    def forward(self, x):
        out = self.net(x)
        if self.multilabel:
            return F.multilabel_margin_loss(out, self.target)
        return F.multi_margin_loss(out, self.target, p=2, weight=torch.linspace(0.5, 2, 6))


CASES = {
    "bilinear": lambda: (Upsampling(2, scale_factor=2, mode="bilinear"), (2, 3, 11, 13)),
    "bilinear_corners": lambda: (Upsampling(2, size=(17, 30), mode="bilinear",
                                            align_corners=True), (2, 3, 11, 13)),
    "bicubic": lambda: (Upsampling(2, scale_factor=1.7, mode="bicubic"), (2, 3, 11, 13)),
    "nearest": lambda: (Upsampling(2, scale_factor=2, mode="nearest"), (2, 3, 11, 13)),
    "trilinear": lambda: (Upsampling(3, scale_factor=2, mode="trilinear"), (2, 3, 5, 6, 7)),
    "linear": lambda: (Upsampling(1, scale_factor=2.5, mode="linear"), (2, 3, 19)),
    "gru_dropout": lambda: (Recurrent(nn.GRU(12, 32, num_layers=2, batch_first=True,
                                             dropout=0.3)), (4, 9, 12)),
    # widths not a multiple of the vector loop's step (NOTE [A GRU's gates by rows]): before,
    # outputs 4.5e-8 and gradients 9.5e-7 from eager's (100 wide), 16 wide 3e-8
    "gru_100_bidirectional": lambda: (Recurrent(nn.GRU(12, 100, num_layers=2, batch_first=True,
                                                       bidirectional=True)), (3, 5, 12)),
    "gru_16_dropout": lambda: (Recurrent(nn.GRU(12, 16, num_layers=2, dropout=0.3)),
                               (9, 4, 12)),
    "gru_cell_40": lambda: (CellLoop(), (6, 5, 12)),
    "rnn_tanh_dropout": lambda: (Recurrent(nn.RNN(12, 16, num_layers=2, dropout=0.3)),
                                 (9, 4, 12)),
    "multi_margin": lambda: (Margin(multilabel=False), (8, 16)),
    "multilabel_margin": lambda: (Margin(multilabel=True), (8, 16)),
}


def _loss(out):  # allocates nothing the plan does not count (its gradient is the plan's)
    return out.sum()


@pytest.mark.parametrize("name", sorted(CASES))
def test_traced_as_eager_runs_it(name):
    """Two SGD steps of the store-all plan and of a plan at half its activations: bitwise
    eager's (before, upsampling differed from eager's in the last bits, and GRU with dropout
    drew other masks: outputs 0.16 apart)."""
    torch.manual_seed(0)
    model, shape = CASES[name]()
    x = torch.randn(shape)
    eager = copy.deepcopy(model)
    eager_run = run_steps(eager, eager, x, _loss)
    full = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_repeats=1)
    assert_same(run_steps(full, full.model, x, _loss), eager_run, exact=True,
                what=f"{name}: store-all plan vs eager")
    plan = full.plan
    limit = max(plan.min_feasible_bytes, plan.fixed_bytes + plan.gradient_bytes
                + plan.store_all_activation_bytes // 2)
    half = monet_opt.optimize(copy.deepcopy(model), x, limit, profile_repeats=1, time_limit_s=4)
    assert_same(run_steps(half, half.model, x, _loss), eager_run, exact=True,
                what=f"{name}: half plan vs eager")
    _check_memory(half, x, _loss, limit, name)


@pytest.mark.parametrize("grad_into", [False, True])
def test_lstm_traces_and_warns(grad_into):
    """An LSTM whose input needs no gradient used to fail to trace (oneDNN's backward without
    its workspace). Now it traces as the decomposition, with a warning; its gradients agree
    with eager's to rounding and its plan holds its limit."""
    torch.manual_seed(0)
    model = Recurrent(nn.LSTM(12, 16, num_layers=2, batch_first=True), grad_into)
    x = torch.randn(4, 9, 12)
    with pytest.warns(UserWarning, match="LSTM"):
        full = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_repeats=1)
    plan = full.plan
    limit = max(plan.min_feasible_bytes, plan.fixed_bytes + plan.gradient_bytes
                + plan.store_all_activation_bytes // 2)
    with pytest.warns(UserWarning, match="LSTM"):
        half = monet_opt.optimize(copy.deepcopy(model), x, limit, profile_repeats=1,
                                  time_limit_s=4)
    eager = copy.deepcopy(model)
    assert_same(run_steps(half, half.model, x, _loss), run_steps(eager, eager, x, _loss),
                exact=False, what="LSTM half plan vs eager")
    _check_memory(half, x, _loss, limit, "LSTM")


def test_python_kernels_restored():
    """Leaving eager_kernels() (normally or by an exception) puts every Python kernel back."""
    def kernels():
        return {(op, key): op.py_kernels.get(key) for op in _overloads(
            _EAGER + ("lstm", "gru_cell")) for key in _KEYS}
    before = kernels()
    assert any(before.values())
    with pytest.raises(RuntimeError, match="inside"):
        with eager_kernels():  # a GRU's composite, tagging what it records, in their place
            inside = kernels()
            assert not any(inside[k] is before[k] for k in inside
                           if before[k] is not None and "lstm" not in str(k[0]))
            raise RuntimeError("inside")
    assert kernels() == before
