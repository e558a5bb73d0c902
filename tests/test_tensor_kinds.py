"""Kinds of tensor a traced step cannot take, as inputs or made in the forward: each named with
what to do (NOTE [Tensor subclasses as inputs] in monet_opt/input_spec.py, NOTE [Kinds of tensor
made in the forward] in monet_opt/tensor_kinds.py), and the eager check in grad mode (NOTE [The
eager check in grad mode] in monet_opt/eager_check.py)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

import monet_opt

HUGE = 1 << 40


def _optimize(model, sample):
    return monet_opt.optimize(model, sample, HUGE, profile_dir=None, profile_repeats=1)


class Attention(nn.Module):
    def __init__(self, mask_inside: bool) -> None:
        super().__init__()
        self.qkv, self.mask_inside = nn.Linear(32, 96), mask_inside

    def forward(self, x, mask=None):
        q, k, v = self.qkv(x).view(2, 8, 3, 4, 8).permute(2, 0, 3, 1, 4)
        mask = causal_lower_right(8, 8) if self.mask_inside else mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum()


class NestedInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(8, 8)

    def forward(self, a, b):
        nested = torch.nested.nested_tensor([a, b], layout=torch.jagged)
        return self.f(nested).relu().values().sum()


class CsrInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(16, 16)

    def forward(self, adj, x):
        return torch.sparse.mm(adj.to_sparse_csr(), torch.tanh(self.f(x))).sum()


@pytest.mark.parametrize("model, sample, said", [
    (NestedInside(), (torch.randn(5, 8), torch.randn(9, 8)), "a nested tensor"),
    (CsrInside(), ((torch.rand(20, 20) > 0.8).float(), torch.randn(20, 16)), ".to_sparse_coo()"),
    (Attention(mask_inside=True), (torch.randn(2, 8, 32),), "is_causal=True"),
], ids=["nested", "csr", "causal bias"])
def test_kinds_made_in_the_forward_are_named(model, sample, said):
    """Each trained eagerly and failed to trace deep in torch, told to avoid .item()."""
    model(*sample).backward()
    with pytest.raises(monet_opt.CaptureError) as err:
        _optimize(model, sample)
    what_to_try = str(err.value).split("What to try:")[1]
    assert said in what_to_try and ".item()" not in what_to_try


def test_a_causal_bias_input_is_refused_with_the_mask_to_pass():
    """It failed in the trace, "Attempting to broadcast a dimension of length 2", for an 8x8
    mask; the mask the message names trains like eager."""
    x = torch.randn(2, 8, 32)
    with pytest.raises(TypeError, match=r"CausalBias.*is_causal=True.*tril\(S - L\)"):
        _optimize(Attention(mask_inside=False), (x, causal_lower_right(8, 8)))
    torch.manual_seed(0)
    model = Attention(mask_inside=False)
    eager = copy.deepcopy(model)
    mask = torch.ones(8, 8, dtype=torch.bool).tril(8 - 8)
    opt = _optimize(model, (x, mask))
    opt(x, mask).backward()
    eager(x, causal_lower_right(8, 8)).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(),
                                                            eager.parameters()))


def test_a_subclass_adding_only_methods_trains_like_eager():
    class Tagged(torch.Tensor):
        pass

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    eager = copy.deepcopy(model)
    x = torch.randn(4, 8).as_subclass(Tagged)
    _optimize(model, x)(x).sum().backward()
    eager(x).sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(),
                                                            eager.parameters()))


def test_a_call_with_another_kind_says_which():
    """A nested tensor at a later call raised a bare NotImplementedError (aten._nnz); a dense
    matrix where the sample's was sparse was said to be on another device."""
    opt = _optimize(nn.Linear(8, 8), torch.randn(4, 8))
    nested = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)],
                                        layout=torch.jagged)
    with pytest.raises(TypeError, match="found a nested tensor"):
        opt(nested)

    class Mixing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f = nn.Linear(6, 6)

        def forward(self, adj, x):
            return torch.sparse.mm(adj, self.f(x)).sum()

    dense = (torch.rand(6, 6) > 0.5).float()
    x = torch.randn(6, 6)
    opt = _optimize(Mixing(), (dense.to_sparse(), x))
    with pytest.raises(monet_opt.PlanMismatchError, match="dense or sparse layouts") as err:
        opt(dense, x)
    assert "devices" not in str(err.value)


class GradModeOnly(nn.Module):
    """Runs under no_grad, fails with a gradient to compute (as flex_attention on CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(8, 8)

    def forward(self, x):
        y = self.f(x)
        if y.requires_grad:
            raise NotImplementedError("this op has no backward on this device")
        return y


class PenaltyThenValue(nn.Module):
    """A gradient penalty taken where gradients are on (it reads what autograd saved), then a
    value read in Python, which fails to trace."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(8, 8)

    def forward(self, x):
        y = self.f(x)
        if torch.is_grad_enabled():
            g, = torch.autograd.grad(y.square().sum(), self.f.weight, create_graph=True)
            y = y + g.norm()
        return y * 2 if y.sum().item() > 0 else y


def test_the_eager_check_runs_with_gradients_too():
    """A failure only in grad mode was not seen (the check ran under no_grad), and the model
    was told to avoid .item(); a forward that reads what autograd saved is not blamed for the
    check's dropping it."""
    x = torch.randn(4, 8)
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)What to try: the model fails on "
                       r"sample_input run eagerly too \(NotImplementedError: this op has no"):
        _optimize(GradModeOnly(), x)
    PenaltyThenValue()(x).sum().backward()
    with pytest.raises(monet_opt.CaptureError) as err:
        _optimize(PenaltyThenValue(), x)
    assert "tracing is not the cause" not in str(err.value)
