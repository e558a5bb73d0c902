"""A Python complex number in the forward: the backward of `t * 1j` conjugates the number
itself (`_conj(1j)`), a view of no node, which walks from a view to its base stepped into
(AttributeError: 'complex' object has no attribute 'op'; complex ops probe, 2026-12-06)."""
from __future__ import annotations

import copy

import torch

import monet_opt
from tests.records import assert_same_grads, measured_peak_of


class _Phased(torch.nn.Module):
    """Four Linear blocks, each turning its spectrum's phase by its real part."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            spectrum = torch.fft.rfft(layer(x), dim=-1)
            x = torch.tanh(torch.fft.irfft(spectrum * torch.exp(1j * spectrum.real), n=16))
        return x.sum()


def test_a_complex_number_in_the_forward_trains_like_eager_at_its_least_peak():
    torch.manual_seed(0)
    model, x = _Phased(), torch.randn(4, 32, 16)
    eager = copy.deepcopy(model)
    with_all = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                                  time_limit_s=5)
    least = with_all.plan.min_feasible_bytes
    assert least < with_all.plan.store_all_peak_bytes  # something is recomputed there
    opt = monet_opt.optimize(model, x, least, profile_dir=None, time_limit_s=5)
    peak = monet_opt.measure_peak(lambda: opt(x).backward(), monet_opt.resident_tensors(model, x))
    assert peak <= least and peak == measured_peak_of(opt.plan)
    model.zero_grad(set_to_none=True)
    assert_same_grads(opt, model, eager, x, steps=2)
