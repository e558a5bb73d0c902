"""NOTE [Gradients in the parameter's layout] (monet_opt/grad_layout.py): a gradient made in
another layout than its parameter's is copied where it is made, as eager's AccumulateGrad does,
so the measured peak is the predicted one and stays within the limit."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt import measured
from monet_opt.profiler import profile
from tests.test_executor import HUGE, assert_plans_train_like_eager, assert_same, run_steps


class Downsample(nn.Module):
    """ConvNeXt's downsampling: LayerNorm over channels (in NHWC), then a strided convolution
    of the channels-last result, whose weight gradient comes out channels-last; the weight is
    the largest tensor of the step."""

    def __init__(self, c: int = 64, out: int = 512) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(c)
        self.conv = nn.Conv2d(c, out, 2, stride=2)
        self.head = nn.Linear(out, 10)

    def forward(self, x):
        x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.head(self.conv(x).relu().mean((2, 3)))


def test_gradients_in_their_parameters_layout_are_counted():
    torch.manual_seed(0)
    base, x = Downsample(), torch.randn(2, 64, 8, 8)
    loss_fn = lambda out: out.sum()  # noqa: E731
    full = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, profile_dir=None)
    for limit in (HUGE, full.plan.min_feasible_bytes):
        opt = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                                 profile_dir=None, time_limit_s=5)
        peak = monet_opt.measure_peak(lambda: loss_fn(opt(x)).backward(),
                                      monet_opt.resident_tensors(opt.model, x))
        assert peak == opt.plan.predicted_peak_bytes <= limit
        for p in opt.model.parameters():
            assert p.grad.stride() == p.stride()
        eager = copy.deepcopy(base)
        opt.model.zero_grad(set_to_none=True)
        assert_same(run_steps(opt, opt.model, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                    exact=True, what="gradients copied into their parameters' layout vs eager")


class _Transposed(nn.Module):
    """A sequence model returning time-major outputs: a transposed view of its last result,
    whose backward views the output gradient as the trace laid it out."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.conv = nn.Conv1d(16, 16, 3, padding=1)

    def forward(self, x):
        h = torch.relu(self.lin(x)).transpose(1, 2)
        return self.lin(torch.tanh(self.conv(h)).transpose(1, 2)).transpose(0, 1)


def test_an_output_in_another_layout_is_profiled_and_trains_like_eager():
    """The profiler handed the backward contiguous output gradients, and the transposed output's
    backward failed to `view` it ("view size is not compatible with input tensor's size and
    stride"): every optimize() of such a model raised. Now they are laid out as the trace's."""
    torch.manual_seed(0)
    base, x = _Transposed(), torch.randn(4, 10, 16)
    loss_fn = lambda out: out.sum()  # noqa: E731
    assert_plans_train_like_eager(base, x, loss_fn, "a transposed output vs eager")


class _GroupNormed(nn.Module):
    """A channels-last conv, GroupNorm, flattened into a Linear; `contiguous`: the conv's
    output made contiguous before the GroupNorm, as the error says to."""

    def __init__(self, contiguous: bool) -> None:
        super().__init__()
        self.contiguous = contiguous
        self.conv, self.norm = nn.Conv2d(3, 4, 3, padding=1), nn.GroupNorm(2, 4)
        self.head = nn.Linear(4 * 36, 3)

    def forward(self, x):
        h = self.conv(x)
        return self.head(self.norm(h.contiguous() if self.contiguous else h).flatten(1))


def test_a_layout_the_tracer_misreads_is_named():
    """NOTE [Layouts the tracer misreads] (monet_opt/misread_layouts.py): the CPU's GroupNorm
    keeps a channels-last layout the tracer takes for contiguous, so the flatten traced as a
    view failed in the profiler asking to report the model; now a CaptureError names the op
    and what to do, and doing it trains bitwise like eager."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    with pytest.raises(monet_opt.CaptureError, match="native_group_norm.*contiguous"):
        monet_opt.optimize(_GroupNormed(False), x, HUGE, profile_repeats=1, profile_dir=None)
    base = _GroupNormed(True)
    eager = copy.deepcopy(base)
    opt = monet_opt.optimize(base, x, HUGE, profile_repeats=1, profile_dir=None)
    loss_fn = lambda out: out.sum()  # noqa: E731
    assert_same(run_steps(opt, opt.model, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                exact=True, what="GroupNorm of a contiguous input vs eager")


class _Phase(nn.Module):
    """A spectrogram's phase (complex angle, which the CPU lays out otherwise than traced),
    time-major, flattened into a Linear; `contiguous`: the spectrogram made contiguous first."""

    def __init__(self, contiguous: bool) -> None:
        super().__init__()
        self.contiguous = contiguous
        self.conv, self.head = nn.Conv1d(1, 1, 3, padding=1), nn.Linear(81, 3)
        self.register_buffer("window", torch.hann_window(16))

    def forward(self, x):
        h = self.conv(x.unsqueeze(1)).squeeze(1)
        spec = torch.stft(h, 16, hop_length=8, window=self.window, return_complex=True)
        phase = (spec.contiguous() if self.contiguous else spec).angle()
        return self.head((phase + 1).transpose(1, 2).flatten(1))


def test_the_op_that_misread_a_layout_is_named_not_those_that_carried_it_on():
    """The error names the angle whose layout the tracer misread, not the add and transpose
    between it and the failing view (which it named before); doing what it says trains like
    eager."""
    torch.manual_seed(0)
    x = torch.randn(2, 64)
    with pytest.raises(monet_opt.CaptureError, match=r"aten\.angle.*aten\.view.*contiguous"):
        monet_opt.optimize(_Phase(False), x, HUGE, profile_repeats=1, profile_dir=None)
    assert_plans_train_like_eager(_Phase(True), x, lambda out: out.pow(2).sum(), "phase")


class _LayerScaled(nn.Module):
    """A channels-last conv, GroupNorm, a layer scale and ReLU, pooled into a Linear."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, c, 3, padding=1), nn.GroupNorm(8, c)
        self.scale, self.head = nn.Parameter(torch.full((1, c, 1, 1), 0.5)), nn.Linear(c, 10)

    def forward(self, x):
        return self.head(torch.relu(self.scale * self.norm(self.conv(x))).mean((2, 3)))


def test_no_op_writes_into_a_tensor_laid_out_otherwise_than_traced():
    """NOTE [Writing into a tensor laid out otherwise than traced] (misread_layouts.py): below
    a channels-last GroupNorm, ReLU's backward ran its out= form into its contiguous incoming
    gradient where eager's result is channels-last, and the layer scale's gradient, summed in
    another order, was 9.3e-10 off eager's. Now every step is bitwise eager's."""
    torch.manual_seed(0)
    base = _LayerScaled().to(memory_format=torch.channels_last)
    x = torch.randn(8, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    assert_plans_train_like_eager(base, x, lambda out: out.square().mean(), "layer scale")


def test_a_profile_that_withdrew_writes_into_arguments_is_served_from_the_directory(
        tmp_path, monkeypatch):
    """The profile directory's check of a cached profile against the fresh lowering took the
    in-place writes withdrawn above for a profile made by another monet_opt: every optimize()
    warned and profiled again. Now the second plans from the directory, silent and alike."""
    profiled = []
    monkeypatch.setattr(measured, "profile", lambda *a, **k: profiled.append(1) or profile(*a, **k))
    base = _LayerScaled().to(memory_format=torch.channels_last)
    x = torch.randn(8, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    first = monet_opt.optimize(base, x, HUGE, profile_repeats=1, profile_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = monet_opt.optimize(base, x, HUGE, profile_repeats=1, profile_dir=tmp_path)
    assert len(profiled) == 1 and again.plan == first.plan


def test_strides_along_dimensions_of_1_are_eager_s():
    """NOTE [Strides along a dimension of 1] (misread_layouts.py): a channels-last ShuffleNetV2
    block at 1x1. ReLU's backward wrote into a depthwise convolution's input gradient whose
    strides along the 1s are not the trace's, the BatchNorm and convolution below read them,
    and the first convolution's weight gradient was 1.5e-9 off eager's. Now bitwise."""
    from torchvision.models.shufflenetv2 import InvertedResidual
    torch.manual_seed(0)
    base = nn.Sequential(InvertedResidual(64, 64, 1), InvertedResidual(64, 64, 1)).to(
        memory_format=torch.channels_last)
    x = torch.randn(2, 64, 1, 1).contiguous(memory_format=torch.channels_last)
    assert_plans_train_like_eager(base, x, lambda out: out.square().mean(), "1x1 stage")
