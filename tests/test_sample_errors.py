"""Samples optimize() cannot run: on the meta device, or one the model rejects eagerly too;
each error says so and what to do."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import monet_opt


@pytest.mark.parametrize("where", ["model", "input"])
def test_a_model_or_input_on_the_meta_device_is_refused_clearly(where):
    """A BatchNorm CNN on 'meta' failed in torch.Generator(device='meta') ("META device type
    not an accelerator"), a plain MLP in the profiler's aten::equal: neither said why."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 2))
    x = torch.randn(2, 3, 6, 6)
    model, x = (model.to("meta"), x.to("meta")) if where == "model" else (model, x.to("meta"))
    said = "the model's parameters are" if where == "model" else "the sample input is"
    with pytest.raises(ValueError, match=f"{said} on the 'meta' device.*to_empty"):
        monet_opt.optimize(model, x, 1 << 30, profile_dir=None)


def test_a_sample_the_model_rejects_eagerly_is_said_to_be_the_cause():
    """A wrong channel count ended in "avoid data-dependent Python ... pass use_cache=False to
    HF models", beside the point; the BatchNorm's statistics stay as they were."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(64, 2))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)fails on sample_input run eagerly "
                                                     r"too.*3 channels.*tracing is not") as err:
        monet_opt.optimize(model, torch.randn(2, 5, 6, 6), 1 << 30, profile_dir=None)
    assert "use_cache" not in str(err.value)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


class Folded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(12, 12)

    def forward(self, x):
        return F.fold(self.linear(x), output_size=(5, 5), kernel_size=2)


def test_a_sample_a_torch_function_rejects_eagerly_gets_no_tracing_hints():
    """F.fold with a channel count its kernel does not divide fails in torch's own check, and
    eagerly too: the error also said that function "reads its input's values" and to call it
    outside the optimized module, beside the point."""
    model = Folded()
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)fails on sample_input run eagerly "
                                                     r"too.*divisible.*tracing is not") as err:
        monet_opt.optimize(model, torch.randn(2, 3, 12), 1 << 30, profile_dir=None)
    assert "reads its input's values" not in str(err.value)


def test_a_check_inside_a_torch_function_is_named():
    """NOTE [Failing inside torch's functions] (monet_opt/capture_hints.py): gaussian_nll_loss
    checks `torch.any(var < 0)`; the error named only the lambda calling it, with advice about
    .item() there and HF's use_cache."""
    loss = lambda o, t: F.gaussian_nll_loss(o[:, :3], t, o[:, 3:].exp())  # noqa: E731
    model = monet_opt.WithLoss(nn.Linear(16, 6), loss)
    with pytest.raises(monet_opt.CaptureError) as caught:
        monet_opt.optimize(model, (torch.randn(8, 16), torch.randn(8, 3)), 1 << 30,
                           profile_dir=None)
    message = str(caught.value)
    assert "in torch's gaussian_nll_loss, at `elif torch.any(var < 0):`" in message
    assert "optimize the model, not WithLoss" in message


class TakesAList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, xs):
        return self.a(xs[0]) + self.b(xs[1])


def test_a_list_sample_for_a_forward_taking_one_list_says_how_to_pass_it():
    """NOTE [A list read as arguments]: the error said the model fails on the sample eagerly
    and to check its shapes and dtypes, where `model([a, b])` runs; so passed, it trains."""
    model, pair = TakesAList(), [torch.randn(4, 8), torch.randn(4, 8)]
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)read as 2 positional arguments.*"
                                                     r"pass `\(\[a, b, \.\.\.\],\)`") as err:
        monet_opt.optimize(model, pair, 1 << 30, profile_dir=None)
    assert "fix the sample input" not in str(err.value)
    opt = monet_opt.optimize(model, (pair,), 1 << 30, profile_dir=None, profile_repeats=1)
    assert torch.equal(opt(pair), model(pair))


class DiagonalWritten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h.diagonal().sub_(0.5)  # into what ReLU's backward reads: eager's backward fails too
        return self.b(h)


def test_a_forward_writing_into_what_its_backward_reads_says_so(capfd):
    """Autograd's version check fails in eager's backward as in the trace: the error gave only
    the generic hint, and anomaly mode printed the forward's traceback once per route."""
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)modified by an inplace.*writes in "
                                                     r"place into a tensor its backward reads"):
        monet_opt.optimize(DiagonalWritten(), torch.randn(8, 8), 1 << 30, profile_dir=None)
    assert "Error detected in" not in capfd.readouterr().err
