"""NOTE [Constant attention masks]: an attention mask computed from shapes alone is read once at
optimize(); a causal one becomes is_causal=True, one that masks nothing goes, and the step trains
as eager does. A mask that reads an input's values stays."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import monet_opt
from monet_opt import attention_masks
from tests import models
from tests.test_executor import HUGE, assert_same, call, run_steps


class _Attention(TorchDispatchMode):
    """Records every attention kernel call: (is_causal, whether a mask was passed) in `calls`,
    the key's shape in `key_shapes`."""

    def __init__(self):
        super().__init__()
        self.calls, self.key_shapes = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        mask = attention_masks.mask_arg(func)
        if mask is not None:
            self.calls.append((attention_masks.argument(func, args, kwargs, "is_causal"),
                               attention_masks.argument(func, args, kwargs, mask) is not None))
            self.key_shapes.append(
                tuple(attention_masks.argument(func, args, kwargs, "key").shape))
        return func(*args, **kwargs)


def _recorded(module, x, loss_fn) -> _Attention:
    """The attention kernel calls of one step of `module`."""
    seen = _Attention()
    with seen:
        loss_fn(call(module, x)).backward()
    module.zero_grad(set_to_none=True)
    return seen


def _kernel_calls(module, x, loss_fn):
    return _recorded(module, x, loss_fn).calls


def store_all(base, x):
    """`base` optimized (a copy) with no memory limit: the store-all plan."""
    return monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_dir=None, profile_repeats=1)


def assert_trains_as_eager(optimized, base, x, loss_fn, exact: bool, what: str):
    assert_same(run_steps(optimized, optimized.model, x, loss_fn),
                run_steps(base, base, x, loss_fn), exact=exact, what=what)


class MaskedSelfAttention(nn.Module):
    """One attention layer that passes scaled_dot_product_attention an explicit mask: `mask`
    "causal" (boolean, lower-triangular), "additive" (0 / -inf), "nothing" (all True) or
    "from input" (read from the input's values)."""

    def __init__(self, mask: str, dim: int = 32, heads: int = 4):
        super().__init__()
        self.mask, self.heads = mask, heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        mask = {"causal": causal,
                "additive": torch.zeros(n, n, device=x.device).masked_fill(~causal, -torch.inf),
                "nothing": torch.ones(b, 1, n, n, dtype=torch.bool, device=x.device),
                "from input": (x[:, None, :, :1] > -10).expand(b, 1, n, n) & causal}[self.mask]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, n, d))


def test_gpt2_attention_runs_causal_as_eager_does():
    """HF builds GPT-2's causal mask when traced; the step runs the kernel as eager does (no
    mask, is_causal), at the store-all and the least plan, with eager's gradients bitwise."""
    torch.manual_seed(0)
    base, x, loss_fn = models.gpt2_tiny(dropout=0.0)
    eager_calls = _kernel_calls(base, x, loss_fn)
    assert eager_calls and all(c == (True, False) for c in eager_calls), eager_calls
    full = store_all(base, x)
    least = monet_opt.optimize(copy.deepcopy(base), x, full.plan.min_feasible_bytes,
                               profile_dir=None, profile_repeats=1, time_limit_s=10)
    reference = run_steps(base, base, x, loss_fn)
    for optimized in (full, least):
        calls = _kernel_calls(optimized, x, loss_fn)
        assert len(calls) >= len(eager_calls) and set(calls) == {(True, False)}, calls
        assert_same(run_steps(optimized, optimized.model, x, loss_fn), reference, exact=True,
                    what="GPT-2 with its mask dropped")


@pytest.mark.parametrize("mask,expected", [("causal", (True, False)),
                                           ("additive", (True, False)),
                                           ("nothing", (False, False)),
                                           ("from input", (False, True))])
def test_explicit_masks(mask, expected):
    torch.manual_seed(0)
    base = MaskedSelfAttention(mask)
    x = torch.randn(2, 16, 32)
    loss_fn = lambda out: out.square().sum()  # noqa: E731
    optimized = store_all(base, x)
    assert set(_kernel_calls(optimized, x, loss_fn)) == {expected}
    assert_trains_as_eager(optimized, base, x, loss_fn, exact=mask != "from input",
                           what=f"{mask} mask")


@pytest.mark.parametrize("op,n_args", [
    ("_scaled_dot_product_efficient_attention", 7),
    ("_scaled_dot_product_efficient_attention_backward", 12),
    ("_scaled_dot_product_cudnn_attention", 8),
    ("_scaled_dot_product_cudnn_attention_backward", 15)])
def test_cuda_kernels_arguments_are_found_by_name(op, n_args):
    """The CUDA kernels' mask and is_causal, given positionally as AOTAutograd writes them (no
    GPU needed: only their schemas are read)."""
    target = getattr(torch.ops.aten, op).default
    mask = attention_masks.mask_arg(target)
    assert mask == "attn_bias"
    names = [a.name for a in target._schema.arguments]
    g = torch.fx.Graph()
    args = tuple(g.placeholder(n) if n in ("query", "key", "value", mask) else
                 (False if n == "is_causal" else 0) for n in names[:n_args])
    node = g.call_function(target, args)
    assert attention_masks.argument(target, node.args, node.kwargs, "is_causal") is False
    attention_masks.set_argument(node, mask, None)
    attention_masks.set_argument(node, "is_causal", True)
    assert node.args[names.index(mask)] is None and node.args[names.index("is_causal")] is True
    assert len(node.args) == n_args and not node.kwargs

