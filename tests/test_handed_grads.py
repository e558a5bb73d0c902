"""NOTE [Output gradients as handed] in monet_opt/handed_grads.py: a loss handing the step an
expanded gradient (`out.sum() * 1.3`, `out.sum(0).sum()`), or a permuted output's gradient,
trains bitwise like eager, the reductions over it reading it as handed (an expanded one: the
plan's memory unchanged)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt import handed_grads
from tests.test_executor import HUGE, assert_plans_train_like_eager, assert_same, run_steps

LOSSES = {"scaled": lambda out: out.sum() * 1.3, "rows": lambda out: out.sum(0).sum() * 0.7,
          "plain": lambda out: out.sum()}


def _head() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def _conv_bn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8))


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("make, shape", [(_head, (37, 32)), (_head, (4, 9, 32)),
                                         (_conv_bn, (5, 3, 13, 13))],
                         ids=["linear_head", "linear_on_tokens", "conv_batchnorm"])
def test_an_expanded_output_gradient_trains_bitwise_like_eager(make, shape, loss):
    """Before, a Linear's bias gradient came out 3.8e-6 from eager's under the scaled loss and
    a BatchNorm's weight gradient 1.4e-4 (2.7e-6 under plain `out.sum()`); on tokens, the bias
    gradient sums a view of the output gradient, viewed as handed; each plan measures at its
    prediction (assert_plans_train_like_eager)."""
    torch.manual_seed(0)
    assert_plans_train_like_eager(make(), torch.randn(*shape), LOSSES[loss],
                                  f"{make.__name__} under the {loss} loss")


def test_a_batchnorm_head_reads_it_as_handed_and_measures_under_its_prediction():
    """CPU's BatchNorm backward makes an input-sized temporary for a contiguous gradient and
    none for an expanded one: where the step peaks there it measures under its prediction,
    bitwise eager's."""
    torch.manual_seed(0)
    base, x = nn.Sequential(nn.Linear(20, 30), nn.BatchNorm1d(30)), torch.randn(23, 20)
    loss_fn = LOSSES["scaled"]
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, profile_dir=None)
    resident = monet_opt.resident_tensors(opt.model, x)
    measured = monet_opt.measure_peak(lambda: loss_fn(opt(x)).backward(), resident)
    assert 0 < opt.plan.predicted_peak_bytes - measured <= x.numel() // 20 * 30 * 4
    opt.model.zero_grad(set_to_none=True)
    eager = copy.deepcopy(opt.model)  # its running statistics updated by that step too
    assert_same(run_steps(opt, opt.model, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                exact=True, what="a BatchNorm1d head under a scaled out.sum()")


class _Permuted(nn.Module):
    """A model whose output is a permuted view of its last layer's (NHWC boxes, a (N, L, C)
    sequence, a transposed head)."""

    def __init__(self, body: nn.Module, dims: tuple[int, ...]) -> None:
        super().__init__()
        self.body, self.dims = body, dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).permute(*self.dims)


def _weighted(out: torch.Tensor) -> torch.Tensor:
    return (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum()


def _cross_entropy(out: torch.Tensor) -> torch.Tensor:
    logits = out.reshape(-1, out.shape[-1])
    return nn.functional.cross_entropy(logits, torch.arange(len(logits)) % out.shape[-1])


@pytest.mark.parametrize("loss_fn", [_weighted, _cross_entropy], ids=["weighted", "ce"])
@pytest.mark.parametrize("body, dims, shape", [
    (lambda: nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 10)), (1, 0), (37, 30)),
    (lambda: nn.Sequential(nn.Conv1d(5, 16, 3), nn.BatchNorm1d(16)), (0, 2, 1), (6, 5, 30)),
    (lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 6, 3), nn.BatchNorm2d(6)),
     (0, 2, 3, 1), (4, 3, 12, 12))], ids=["linear_t", "batchnorm1d_nlc", "batchnorm2d_nhwc"])
def test_a_permuted_output_gradient_is_read_in_eagers_layout(body, dims, shape, loss_fn):
    """The gradient of a permuted output reaches the last layer permuted; AOTAutograd copies it
    contiguous. Before, the bias (and BatchNorm) gradients summed that copy: 9.5e-7 (Linear),
    9.3e-6 (BatchNorm1d) and 2.4e-5 (BatchNorm2d) from eager's under the weighted loss, 8e-9 to
    4e-8 under cross-entropy. The full-size gradient is outside the plan (OutputGradientWarning):
    the step measures over its prediction by no more than it, and BatchNorm's per-channel
    temporary for a strided gradient."""
    torch.manual_seed(0)
    base, x = _Permuted(body(), dims), torch.randn(*shape)
    eager = copy.deepcopy(base)
    with pytest.warns(monet_opt.OutputGradientWarning):
        opt = monet_opt.optimize(base, x, HUGE, profile_repeats=1, profile_dir=None)
        measured = monet_opt.measure_peak(lambda: loss_fn(opt(x)).backward(),
                                          monet_opt.resident_tensors(opt.model, x))
    out = eager(x)  # the running statistics as the measured step left base's
    loss_fn(out).backward()
    for module in (base, eager):
        module.zero_grad(set_to_none=True)
    assert measured - opt.plan.predicted_peak_bytes <= out.numel() * 4 + shape[1] * 4
    assert_same(run_steps(opt, base, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                exact=True, what=f"a permuted output under {loss_fn.__name__}")


def test_what_the_backward_node_noted_does_not_outlive_the_backward():
    """A loss the caller keeps keeps the step's backward node: the gradient noted on it is
    taken off by the backward itself."""
    torch.manual_seed(0)
    x = torch.randn(37, 32)
    opt = monet_opt.optimize(_head(), x, HUGE, profile_repeats=1, profile_dir=None)
    out = opt(x)
    loss = out.sum() * 1.3
    node = out.grad_fn
    assert node.name() == "CompiledFunctionBackward"
    loss.backward()
    assert handed_grads._KEY not in node.metadata


def test_without_a_running_node_the_tangent_is_read():
    """The profiler runs the backward graph outside autograd: nothing was noted."""
    tangent = torch.randn(3, 4)
    assert handed_grads.take_noted() == {}
    assert handed_grads.as_handed({}, tangent, 0) is tangent
    wrong = torch.tensor(1.0).expand(4, 3)
    assert handed_grads.as_handed({0: wrong}, tangent, 0) is tangent
    right = torch.tensor(1.0).expand(3, 4)
    assert handed_grads.as_handed({0: right}, tangent, 0) is right
