"""NOTE [Grouped-query attention]: where HF repeats a grouped-query attention's keys and values
only because it was traced, the step hands the kernel the unrepeated ones as eager does: eager's
kernel calls, eager's gradients bitwise, and the repeated copies no longer kept. A model that
repeats them in eager too is traced as it runs."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import monet_opt
from monet_opt import grouped_attention, grouped_math
from tests.test_attention_masks import _recorded, assert_trains_as_eager, store_all
from tests.test_executor import assert_same, run_steps


def _llama(kv_heads: int = 2, attention_dropout: float = 0.0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=500, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, use_cache=False,
        attention_dropout=attention_dropout)).train()
    # a mean: with a sum, SGD's steps blow the logits up to NaN by the third step
    return model, {"input_ids": torch.randint(0, 500, (2, 64))}, lambda out: out.logits.mean()


class GroupedAttention(nn.Module):
    """Grouped-query attention that repeats its keys and values itself (as HF's repeat_kv), then
    calls the kernel with `mask`: "is_causal" (no mask) or "causal" (an explicit one); `shared`:
    the keys serve as the values too; `dropout`: the attention's."""

    def __init__(self, mask: str, dim: int = 64, heads: int = 4, kv_heads: int = 2,
                 shared: bool = False, dropout: float = 0.0):
        super().__init__()
        self.mask, self.heads, self.kv_heads, self.shared = mask, heads, kv_heads, shared
        self.dropout = dropout
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        r = self.heads // self.kv_heads
        q = self.q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k, v = (t.view(b, n, self.kv_heads, -1).transpose(1, 2)
                for t in self.kv(x).chunk(2, dim=-1))
        k, v = (t[:, :, None].expand(b, self.kv_heads, r, n, self.head_dim)
                .reshape(b, self.heads, n, self.head_dim) for t in (k, v))
        if self.shared:
            v = k
        p = self.dropout if self.training else 0.0
        if self.mask == "is_causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        else:
            causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, dropout_p=p)
        return self.out(y.transpose(1, 2).reshape(b, n, d))


def _without_rewrite(monkeypatch):
    monkeypatch.setattr(grouped_attention, "use_grouped_keys", lambda gm, unmasked: 0)


def test_llama_runs_the_kernel_as_eager_does():
    """HF Llama with 2 key/value heads for 4 query heads: the kernel gets 2-head keys as in
    eager, and the gradients are eager's bitwise, at the store-all plan and at a third of its
    activations."""
    base, x, loss_fn = _llama()
    eager = _recorded(base, x, loss_fn).key_shapes
    assert eager and {s[1] for s in eager} == {2}, eager
    full = store_all(base, x)
    p = full.plan
    limit = p.fixed_bytes + p.gradient_bytes + p.store_all_activation_bytes // 3
    third = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_dir=None,
                               profile_repeats=1, time_limit_s=10)
    assert third.plan.recomputed_ops > 0
    reference = run_steps(base, base, x, loss_fn)
    for optimized in (full, third):
        assert set(_recorded(optimized, x, loss_fn).key_shapes) == set(eager)
        assert_same(run_steps(optimized, optimized.model, x, loss_fn), reference, exact=True,
                    what="Llama with grouped keys")


def _under_autocast(module):
    """`module` called under bfloat16 autocast, entered per step as in PyTorch's AMP recipe
    (autocast caches its casts of the parameters until its block ends)."""
    def run(**kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return module(**kwargs)
    return run


def test_llama_under_autocast_runs_the_kernel_as_eager_does():
    """Under bfloat16 autocast the traced keys are repeated in float32 and then cast, and their
    gradients cast back before the group sums: the kernel gets the 2-head keys cast, as in
    eager, and the gradients are eager's bitwise (repeated, 6e-3 relative off)."""
    base, x, _ = _llama()
    loss_fn = lambda out: out.logits.float().mean()  # noqa: E731
    with torch.autocast("cpu", dtype=torch.bfloat16):
        optimized = store_all(base, x)
        eager = _recorded(base, x, loss_fn).key_shapes
        assert {s[1] for s in eager} == {2}
        assert set(_recorded(optimized, x, loss_fn).key_shapes) == set(eager)
    assert_same(run_steps(_under_autocast(optimized), optimized.model, x, loss_fn),
                run_steps(_under_autocast(base), base, x, loss_fn), exact=True,
                what="Llama under autocast with grouped keys")


def _counting_math_rewrites(monkeypatch) -> list[int]:
    """How many repeats NOTE [Grouped keys on the math path] moved, per traced step."""
    counts = []
    rewrite = grouped_math.cast_before_repeat
    monkeypatch.setattr(grouped_math, "cast_before_repeat",
                        lambda gm: counts.append(rewrite(gm)) or counts[-1])
    return counts


@pytest.mark.parametrize("share, kv_heads", [(None, 2), (3, 2), (None, 1)])
def test_llama_with_attention_dropout_under_autocast_trains_as_eager(monkeypatch, share,
                                                                     kv_heads):
    """With attention dropout the CPU runs SDPA's math path: the traced keys and values are cast
    before they are repeated, as in eager, and the gradients are eager's bitwise (without: 0.44
    off), at the store-all plan and at a third of its activations. With one key/value head the
    repeat is a view the casts made contiguous: moved, it failed to trace."""
    counts = _counting_math_rewrites(monkeypatch)
    base, x, _ = _llama(kv_heads=kv_heads, attention_dropout=0.1)
    loss_fn = lambda out: out.logits.float().mean()  # noqa: E731
    with torch.autocast("cpu", dtype=torch.bfloat16):
        optimized = store_all(base, x)
        if share is not None:
            p = optimized.plan
            limit = p.fixed_bytes + p.gradient_bytes + p.store_all_activation_bytes // share
            optimized = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_dir=None,
                                           profile_repeats=1, time_limit_s=10)
            assert optimized.plan.recomputed_ops > 0
    assert counts[-1] == 4  # keys and values in each of 2 layers
    assert_same(run_steps(_under_autocast(optimized), optimized.model, x, loss_fn),
                run_steps(_under_autocast(base), base, x, loss_fn), exact=True,
                what="Llama under autocast with attention dropout")


def test_model_that_repeats_in_eager_on_the_math_path(monkeypatch):
    """A model that repeats its keys itself and passes is_causal=True, with attention dropout,
    under autocast: eager repeats and then casts too, so nothing is moved, bitwise eager's."""
    counts = _counting_math_rewrites(monkeypatch)
    torch.manual_seed(0)
    base = GroupedAttention("is_causal", dropout=0.1)
    x = torch.randn(2, 16, 64)
    loss_fn = lambda out: out.float().square().sum()  # noqa: E731
    with torch.autocast("cpu", dtype=torch.bfloat16):
        optimized = store_all(base, x)
    assert counts == [0]
    assert_same(run_steps(_under_autocast(optimized), optimized.model, {"x": x}, loss_fn),
                run_steps(_under_autocast(base), base, {"x": x}, loss_fn), exact=True,
                what="repeated keys, is_causal, attention dropout")


def test_llama_keeps_the_unrepeated_keys(monkeypatch):
    """The store-all plan keeps each layer's keys and values once, not once per query head: at
    least (r - 1) times their bytes less per layer (r = 2 here)."""
    base, x, _ = _llama()
    ours = store_all(base, x).plan
    _without_rewrite(monkeypatch)
    before = store_all(base, x).plan
    layers, kv_bytes = 2, 2 * (2 * 2 * 64 * 32 * 4)  # keys and values: [2, 2, 64, 32] float32
    saved = before.store_all_activation_bytes - ours.store_all_activation_bytes
    assert saved >= layers * kv_bytes, (saved, layers * kv_bytes)


def test_llama_without_groups_is_unchanged():
    """As many key/value heads as query heads: nothing is repeated; bitwise eager as before."""
    base, x, loss_fn = _llama(kv_heads=4)
    assert_trains_as_eager(store_all(base, x), base, x, loss_fn, exact=True,
                           what="Llama, 4 key/value heads")


@pytest.mark.parametrize("mask,shared,heads,exact", [("is_causal", False, 4, True),
                                                     ("causal", False, 2, False),
                                                     ("causal", True, 4, True)])
def test_models_that_repeat_in_eager(mask, shared, heads, exact):
    """A model that repeats its keys and passes no mask runs as in eager (4-head keys, bitwise);
    one that passes an explicit causal mask has it removed and its keys unrepeated (2-head keys,
    the gradients within rounding of eager's); where its keys are its values, their two
    gradients meet before the group sum, and the keys stay repeated (bitwise)."""
    torch.manual_seed(0)
    base = GroupedAttention(mask, shared=shared)
    x = torch.randn(2, 16, 64)
    loss_fn = lambda out: out.square().sum()  # noqa: E731
    optimized = store_all(base, x)
    assert {s[1] for s in _recorded(optimized, x, loss_fn).key_shapes} == {heads}
    assert_trains_as_eager(optimized, base, x, loss_fn, exact=exact,
                           what=f"{mask}, repeated keys")


def test_shared_keys_whose_gradients_are_not_needed():
    """Keys that are the values too, from a frozen projection: no gradient of theirs is summed,
    the one repeat is replaced once (and removed once), and the step trains as eager does
    within rounding."""
    torch.manual_seed(0)
    base = GroupedAttention("causal", shared=True)
    base.kv.requires_grad_(False)
    x = torch.randn(2, 16, 64)
    loss_fn = lambda out: out.square().sum()  # noqa: E731
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        optimized = store_all(base, x)
    assert not [w for w in seen if "erase_node" in str(w.message)]  # FX: erased twice
    assert {s[1] for s in _recorded(optimized, x, loss_fn).key_shapes} == {2}
    assert_trains_as_eager(optimized, base, x, loss_fn, exact=False, what="shared, frozen keys")


def test_falcon_whose_mask_eager_builds_too_is_left_repeated():
    """NOTE [Masks eager builds too]: Falcon builds its causal mask whatever the padding, so its
    attention repeats the keys in eager; rewritten to grouped keys, 12 of its 19 gradients were
    up to 7e-4 from eager's under bfloat16 autocast. Left as traced: the keys eager's, bitwise."""
    from transformers import FalconConfig, FalconForCausalLM
    torch.manual_seed(0)
    base = FalconForCausalLM(FalconConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_kv_heads=2, new_decoder_architecture=True, alibi=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cache=False, attn_implementation="sdpa")).train()
    assert grouped_attention.eager_masks(base) and not grouped_attention.eager_masks(_llama()[0])
    ids = torch.randint(3, 100, (2, 12))
    x = {"input_ids": ids, "labels": ids.clone()}
    loss_fn = lambda out: out.loss  # noqa: E731
    with torch.autocast("cpu", dtype=torch.bfloat16):
        optimized = store_all(base, x)
        eager = _recorded(base, x, loss_fn).key_shapes
        assert {s[1] for s in eager} == {4}  # repeated to one per query head
        assert set(_recorded(optimized, x, loss_fn).key_shapes) == set(eager)
    assert_same(run_steps(_under_autocast(optimized), optimized.model, x, loss_fn),
                run_steps(_under_autocast(base), base, x, loss_fn), exact=True,
                what="Falcon under autocast")
