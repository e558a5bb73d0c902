"""NOTE [Autocast is traced] (monet_opt/capture.py): a plan made under torch.autocast trains
like the model under autocast, bitwise; a step under another autocast state is refused."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt
from tests import models
from tests.test_executor import HUGE, _check_memory

BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


class FloatHead(nn.Module):
    """A bfloat16 layer, then one the model keeps in float32 with autocast turned off inside:
    eager runs that layer's backward in float32 too."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 16)

    def forward(self, x):
        h = self.a(x).relu()
        with torch.autocast("cpu", enabled=False):
            return self.b(h.float())


def _cnn():
    """BatchNorm, dropout (p 0.3: eager's CPU dropout scales in bfloat16 here, NOTE [Dropout's
    scale] in monet_opt/dropout_scale.py), in-place ReLU."""
    model, x, _ = models.small_cnn()
    return model, x


def _gpt2():
    """Dropout 0.1 after the embeddings, in the attention and after its projections."""
    model, x, _ = models.gpt2_tiny(dropout=0.1)
    return model, x


def _step(module, x, seed=7):
    torch.manual_seed(seed)
    with torch.autocast(**BF16):
        out = module(**x) if isinstance(x, dict) else module(x)
        out = getattr(out, "logits", out)
        loss = out.float().square().sum()
    loss.backward()
    return out


def _optimize(base, x, limit):
    return monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1, profile_dir=None,
                              time_limit_s=5)


@pytest.mark.parametrize("factory,tight", [
    (lambda: (FloatHead(), torch.randn(8, 32)), False),
    (_cnn, False), (_cnn, True), (_gpt2, False), (_gpt2, True)],
    ids=["float_head", "cnn_store_all", "cnn_least_peak", "gpt2_store_all", "gpt2_least_peak"])
def test_plan_made_under_autocast_trains_like_eager_under_autocast(factory, tight):
    """Outputs, every gradient and BatchNorm's statistics bitwise eager's over two steps;
    the backward runs as eager's does when loss.backward() is called outside autocast."""
    torch.manual_seed(0)
    base, x = factory()
    with torch.autocast(**BF16):
        opt = _optimize(base, x, HUGE)
        if tight:
            opt = _optimize(base, x, opt.plan.min_feasible_bytes)
    assert opt.plan.recomputed_ops > 0 if tight else opt.plan.recomputed_ops == 0
    eager = copy.deepcopy(base)
    for _ in range(2):  # fresh gradients each step (accumulation: tests/test_resident_grads.py)
        opt.model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        ours, theirs = _step(opt, x), _step(eager, x)
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
        for (name, p), q in zip(opt.model.named_parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad), name
    for a, b in zip(opt.model.buffers(), eager.buffers()):
        assert torch.equal(a, b)


def test_step_under_another_autocast_state_is_refused():
    torch.manual_seed(0)
    base, x = _cnn()
    plain = _optimize(base, x, HUGE)
    with torch.autocast(**BF16):
        mixed = _optimize(base, x, HUGE)
        with pytest.raises(monet_opt.PlanMismatchError, match="optimized with autocast off"):
            plain(x)
        with torch.no_grad():  # no step to plan: the model runs as it is
            assert plain(x).dtype == torch.bfloat16
    with pytest.raises(monet_opt.PlanMismatchError, match=r"runs with autocast off.*on for cpu"):
        mixed(x)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        with pytest.raises(monet_opt.PlanMismatchError, match="torch.float16"):
            mixed(x)


def test_gpt2_least_plan_under_autocast_stays_within_its_limit():
    """GPT-2 under bfloat16 autocast (the fused CPU attention in bfloat16, weights cast in the
    graph): the least plan's measured peak is within its limit, at its prediction."""
    torch.manual_seed(0)
    base, x, loss_fn = models.gpt2_tiny(dropout=0.0)
    with torch.autocast(**BF16):
        full = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1,
                                  profile_dir=None)
        least = _optimize(base, x, full.plan.min_feasible_bytes)
        assert least.plan.recomputed_ops > 0
        _check_memory(least, x, loss_fn, full.plan.min_feasible_bytes, "least under autocast")
