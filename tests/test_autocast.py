"""NOTE [Autocast is traced] (monet_opt/capture.py): a plan made under torch.autocast trains
like the model under autocast, bitwise; a step under another autocast state is planned for it."""
from __future__ import annotations

import copy
import warnings

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


def test_a_step_under_another_autocast_state_is_planned_for_it():
    """A step under another autocast state than optimize() saw is planned for that state once
    (ReplanWarning naming it; it was refused with PlanMismatchError) and trains bitwise like
    eager under it: off, then bfloat16, then off again (the first plan), both ways round."""
    torch.manual_seed(0)
    base, x = _cnn()
    plain = _optimize(base, x, HUGE)
    with torch.autocast(**BF16):
        mixed = _optimize(base, x, HUGE)
    for opt, states in ((plain, (False, True, False)), (mixed, (True, False, True))):
        eager = copy.deepcopy(base)
        for k, on in enumerate(states):
            opt.model.zero_grad(set_to_none=True)
            eager.zero_grad(set_to_none=True)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                with torch.autocast(**BF16, enabled=on):
                    torch.manual_seed(k)
                    ours = opt(x)
                    torch.manual_seed(k)
                    theirs = eager(x)
            replans = [str(w.message) for w in seen if w.category is monet_opt.ReplanWarning]
            assert len(replans) == (k == 1), replans
            assert all("autocast on for cpu (torch.bfloat16)" in r if on else "autocast off" in r
                       for r in replans), replans
            ours.float().square().sum().backward()
            theirs.float().square().sum().backward()
            assert ours.dtype == theirs.dtype == (torch.bfloat16 if on else torch.float32)
            assert torch.equal(ours, theirs), (on, k)
            for (name, p), q in zip(opt.model.named_parameters(), eager.parameters()):
                assert torch.equal(p.grad, q.grad), (on, k, name)
        assert len(opt.plans) == 2


def test_accelerate_prepared_after_optimize():
    """accelerate's Accelerator(mixed_precision="bf16") prepared around the optimized module
    runs each step under autocast: one step planned for it, then eager's outputs and gradients
    (PlanMismatchError before)."""
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    base, x = _cnn()
    eager = copy.deepcopy(base)
    with pytest.warns(monet_opt.ReplanWarning, match="autocast on for cpu"):
        prepared = accelerate.Accelerator(mixed_precision="bf16", cpu=True).prepare(
            _optimize(base, x, HUGE))
        torch.manual_seed(3)
        ours = prepared(x)
    with torch.autocast(**BF16):
        torch.manual_seed(3)
        theirs = eager(x)
    ours.float().sum().backward()
    theirs.float().sum().backward()
    assert torch.equal(ours.float(), theirs.float())
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(prepared.parameters(),
                                                             eager.parameters()))


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


def test_backward_inside_autocast_warns_and_runs_as_outside():
    """NOTE [Backward under autocast]: loss.backward() inside the autocast block warns
    (AutocastBackwardWarning, naming the caller's line) and gives the gradients of a backward
    called outside, bitwise; outside it, nothing is said."""
    torch.manual_seed(0)
    base, x = _cnn()
    with torch.autocast(**BF16):
        opt = _optimize(base, x, HUGE)
    grads = {}
    for inside in (False, True):
        opt.model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with torch.autocast(**BF16):
                loss = opt(x).float().square().sum()
                if inside:
                    loss.backward()
            if not inside:
                loss.backward()
        said = [w for w in seen if w.category is monet_opt.AutocastBackwardWarning]
        assert len(said) == inside, [str(w.message) for w in seen]
        assert all(w.filename == __file__ and "after the autocast block" in str(w.message)
                   for w in said)
        grads[inside] = [p.grad.clone() for p in opt.model.parameters()]
    assert all(map(torch.equal, grads[False], grads[True]))
