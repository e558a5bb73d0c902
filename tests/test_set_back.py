"""What a trace leaves on modules, set back as it was (NOTE [Tensors kept boxed] in
monet_opt/set_back.py, NOTE [A parameter held as a plain attribute] in
monet_opt/attribute_tensors.py, NOTE [Grad mode left off] in monet_opt/capture.py)."""
from __future__ import annotations

import copy
import types
import warnings

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40


class CachedNorm(nn.Module):
    """PyG's GCNConv(cached=True): edge weights computed on the first call, kept as a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self._cached = nn.Linear(16, 4), None

    def forward(self, x, index):
        if self._cached is None:
            self._cached = (index, torch.ones(index.numel()) / index.numel() ** 0.5)
        weight = self._cached[1]
        rows = self.lin(x).index_select(0, index) * weight[:, None]
        return torch.zeros(x.shape[0], 4).index_add(0, index, rows)


def test_a_tuple_of_tensors_kept_on_a_module_is_set_back():
    """NOTE [Tensors kept boxed]: the trace's tensors stayed in the tuple; optimize() failed
    ('the model fails eagerly too') and the model itself failed after it."""
    torch.manual_seed(0)
    model, x, index = CachedNorm(), torch.randn(50, 16), torch.randint(0, 50, (200,))
    eager = copy.deepcopy(model)
    with pytest.warns(monet_opt.SideEffectWarning, match=r"dicts holding tensors to _cached"):
        opt = monet_opt.optimize(model, (x, index), HUGE, profile_dir=None, profile_repeats=1)
    assert model._cached is None
    for _ in range(2):
        outs = [module(x, index) for module in (opt, eager)]
        for out in outs:
            out.square().sum().backward()
        assert torch.equal(*outs)
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(),
                                                                eager.parameters()))
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
    model(x, index)  # the model itself runs


class BoxesThenValue(nn.Module):
    """torchvision's DefaultBoxGenerator, then a branch on a value, which fails to trace."""

    def __init__(self) -> None:
        from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
        super().__init__()
        self.conv, self.gen = nn.Conv2d(3, 4, 3, stride=2, padding=1), \
            DefaultBoxGenerator([[2], [2, 3]])

    def forward(self, x):
        from torchvision.models.detection.image_list import ImageList
        f = self.conv(x)
        anchors = self.gen(ImageList(x, [(32, 32)] * x.shape[0]), [f, f])
        return (f * 2 if f.sum() > 0 else f).sum() + torch.stack(anchors).sum()


def test_a_failed_trace_is_not_said_to_change_lists_it_left_equal():
    """A failed trace leaves equal copies of the generator's inner lists: a SideEffectWarning
    said the forward changed `gen.aspect_ratios (2 -> 2 items)`. They are put back, unsaid."""
    model = BoxesThenValue()
    inner = list(model.gen.aspect_ratios)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(monet_opt.CaptureError):
            monet_opt.optimize(model, torch.randn(2, 3, 32, 32), HUGE, profile_dir=None,
                               profile_repeats=1)
    assert not [w for w in caught if w.category is monet_opt.SideEffectWarning]
    assert all(a is b for a, b in zip(model.gen.aspect_ratios, inner))


def test_torchs_own_rnn_weights_remade_in_the_trace_are_not_warned_about():
    """nn.LSTM makes its _flat_weights anew while traced: they are set back, but the user's
    forward assigned nothing, and a SideEffectWarning said to keep a tensor as an attribute."""
    model = nn.Sequential(nn.LSTM(8, 8, batch_first=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monet_opt.optimize(_FirstOutput(model), torch.randn(2, 5, 8), HUGE, profile_dir=None,
                           profile_repeats=1)
    assert not [w for w in caught if w.category is monet_opt.SideEffectWarning]


class _FirstOutput(nn.Module):
    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]


class _PlainParameter(nn.Module):
    """A Parameter held as a plain attribute (object.__setattr__), not registered."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(16, 16)
        object.__setattr__(self, "scale", nn.Parameter(torch.ones(16)))

    def forward(self, x):
        return self.f(x) * self.scale


def test_a_parameter_held_as_a_plain_attribute_stays_unregistered():
    """NOTE [A parameter held as a plain attribute]: optimize() registered it, and the step
    took its parameters in another order (an error, or the wrong tensors)."""
    torch.manual_seed(0)
    model, x = _PlainParameter(), torch.randn(4, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    assert [n for n, _ in model.named_parameters()] == ["f.weight", "f.bias"]
    for module in (opt, eager):
        module(x).square().sum().backward()
    assert torch.equal(model.f.weight.grad, eager.f.weight.grad)
    assert torch.equal(model.scale.grad, eager.scale.grad)


class _WritesAHelpersTensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f, self.stats = nn.Linear(16, 16), types.SimpleNamespace(mean=torch.zeros(16))

    def forward(self, x):
        y = self.f(x)
        with torch.no_grad():
            self.stats.mean.mul_(0.9).add_(y.mean(0), alpha=0.1)
        return y - self.stats.mean


def test_a_failed_trace_leaves_grad_mode_on():
    """NOTE [Grad mode left off]: a route failing inside torch.export left it off."""
    with pytest.raises(monet_opt.CaptureError):
        monet_opt.optimize(_WritesAHelpersTensor(), torch.randn(4, 16), HUGE, profile_dir=None,
                           profile_repeats=1)
    assert torch.is_grad_enabled()

