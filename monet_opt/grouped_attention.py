"""Grouped-query attention reads its keys and values unrepeated, as eager does (a rewrite of the
joint graph).

NOTE [Grouped-query attention]
  A model with fewer key/value heads than query heads (Llama, Mistral, Qwen: grouped-query
  attention) either hands the attention kernel its keys and values as they are and lets the
  kernel share each among its group of query heads (`enable_gqa=True`), or repeats them itself
  to one per query head first (HF's `repeat_kv`: unsqueeze, expand, clone, reshape). HF does the
  first only when it passes no mask (`use_gqa_in_sdpa`), which in eager is whenever no token is
  padded, and traced it always builds a mask (NOTE [Constant attention masks]); so our trace
  holds the second where eager does the first. The step then keeps the repeated keys and values
  for the attention's backward (the group's size times their bytes: 4x for Llama-3-8B's 32
  query and 8 key/value heads), copies them in the forward, and sums the kernel's per-head
  gradients over each group in another order than the kernel does: HF Llama (4 query heads, 2
  key/value heads, 128 wide) had gradients up to 4.4e-7 relative from eager's.

  So where NOTE [Constant attention masks] has just removed an attention's mask, and that
  attention reads repeated keys and values, and its kernel takes grouped ones itself (GROUPED
  below), the forward and backward attention read the keys and values as they were before the
  repeat, and whatever read the group sums of the kernel's key and value gradients reads the
  kernel's gradients instead: the call eager makes, with eager's results bitwise
  (tests/test_grouped_attention.py). The copies and sums are then read by nothing and go. The
  rewrite is made only where the whole pattern is there: the repeat read by nothing but these
  attention ops, and each gradient read only by its group sum; otherwise nothing changes.

  Only where a mask was removed: a model that repeats its keys and calls the kernel with no mask
  in eager too (torchtitan's Llama: repeat_kv, then is_causal=True) is traced as it runs and left
  so, bitwise eager's. One that repeats them and passes an explicit causal mask in eager is
  rewritten: its results then differ from eager's in the last bits of the key and value
  gradients (the kernel sums over the group in its own order), and it keeps the keys and values
  once rather than once per query head.

  GROUPED holds the CPU's fused kernel, which eager calls with grouped keys (checked by the
  test). On CUDA the traced call is the memory-efficient kernel's (the mask HF builds when traced
  selects it; with the mask dropped it runs is_causal), where eager, given no mask and grouped
  keys, picks by its own rules (flash in half precision): making our call eager's there (another
  op, with other outputs for the backward) is not done and not measured on a GPU.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.utils import _pytree as pytree

from monet_opt.attention_masks import mask_arg, node_argument, set_argument

aten = torch.ops.aten
# Attention kernels that share each key/value head among a group of query heads, and their
# backward: the backward's outputs (grad query, grad key, grad value) are at these positions.
GROUPED = {aten._scaled_dot_product_flash_attention_for_cpu.default:
           aten._scaled_dot_product_flash_attention_for_cpu_backward.default}
_GRAD_KEY, _GRAD_VALUE = 1, 2
_RESHAPES = (aten._unsafe_view.default, aten.view.default, aten.reshape.default)


def use_grouped_keys(gm: fx.GraphModule, unmasked: list[fx.Node]) -> int:
    """NOTE [Grouped-query attention], in place, for the attention ops `unmasked` whose mask NOTE
    [Constant attention masks] removed; returns how many attention ops were changed."""
    count = 0
    for forward in [n for n in unmasked if n.target in GROUPED]:
        count += _rewrite(gm, forward)
    if count:
        gm.recompile()
    return count


def _rewrite(gm: fx.GraphModule, forward: fx.Node) -> int:
    if node_argument(forward, mask_arg(forward.target)) is not None:
        return 0
    key, value = (node_argument(forward, n) for n in ("key", "value"))
    repeats = [_repeated(key), _repeated(value)]
    if None in repeats or repeats[0][1] != repeats[1][1]:
        return 0
    (k, group, k_chain), (v, _, v_chain) = repeats
    chains = [k_chain, v_chain]
    backward_op = GROUPED[forward.target]
    readers = set(key.users) | set(value.users)
    backwards = [n for n in readers if n is not forward]
    if not all(n.target is backward_op and node_argument(n, "key") is key
               and node_argument(n, "value") is value
               and node_argument(n, mask_arg(n.target)) is None for n in backwards):
        return 0
    sums = []  # (a kernel gradient, the nodes summing it over each group, the sum last)
    for backward in backwards:
        for index, source in ((_GRAD_KEY, k), (_GRAD_VALUE, v)):
            for grad in _outputs(backward, index):
                chain = _group_sum(grad, source, group)
                if chain is None:
                    return 0
                sums.append((grad, chain))
    for node in (forward, *backwards):
        set_argument(node, "key", k)
        set_argument(node, "value", v)
        _refresh(node)
    for grad, chain in sums:
        chain[-1].replace_all_uses_with(grad)
        chains.append(chain)
    for chain in chains:
        for node in reversed(chain):
            if not node.users:
                gm.graph.erase_node(node)
    return 1 + len(backwards)


def _repeated(node) -> tuple[fx.Node, int, list[fx.Node]] | None:
    """(x, r, the repeat's nodes in order) where `node` is x ([b, h, s, d]) with each head
    repeated r > 1 times in place: reshape(clone(expand(unsqueeze(x, 2), [b, h, r, s, d])),
    [b, h * r, s, d]); else None."""
    if not isinstance(node, fx.Node) or node.target not in _RESHAPES:
        return None
    chain = [node]
    expanded = node.args[0]
    if expanded.target is aten.clone.default:
        chain.append(expanded)
        expanded = expanded.args[0]
    if expanded.target is not aten.expand.default:
        return None
    unsqueezed = expanded.args[0]
    if unsqueezed.target is not aten.unsqueeze.default or unsqueezed.args[1] not in (2, -3):
        return None
    x = unsqueezed.args[0]
    shape = tuple(x.meta["val"].shape)
    if len(shape) != 4:
        return None
    b, h, s, d = shape
    r = expanded.meta["val"].shape[2]
    if r < 2 or tuple(expanded.meta["val"].shape) != (b, h, r, s, d) \
            or tuple(node.meta["val"].shape) != (b, h * r, s, d):
        return None
    return x, r, [unsqueezed, expanded, *reversed(chain)]


def _outputs(node: fx.Node, index: int) -> list[fx.Node]:
    return [u for u in node.users if u.target is operator.getitem and u.args[1] == index]


def _group_sum(grad: fx.Node, source: fx.Node, group: int) -> list[fx.Node] | None:
    """The nodes that sum `grad` (a gradient of the repeated tensor) over each group back to
    `source`'s shape, in order, where that is all `grad` is read by: reshape to [b, h, r, s, d],
    sum over dim 2, then squeeze or reshape if the sum kept the dim; else None."""
    b, h, s, d = source.meta["val"].shape
    split = _only_user(grad)
    if split is None or split.target not in _RESHAPES \
            or tuple(split.meta["val"].shape) != (b, h, group, s, d):
        return None
    total = _only_user(split)
    if total is None or total.target is not aten.sum.dim_IntList \
            or list(total.args[1]) not in ([2], [-3]) or len(total.args) > 3 or total.kwargs:
        return None
    chain = [split, total]
    if tuple(total.meta["val"].shape) == (b, h, 1, s, d):
        total = _only_user(total)
        if total is None or not (total.target in _RESHAPES or (
                total.target is aten.squeeze.dim and total.args[1] in (2, -3))):
            return None
        chain.append(total)
    val = total.meta["val"]
    if tuple(val.shape) != (b, h, s, d) or val.dtype != grad.meta["val"].dtype:
        return None
    return chain


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _refresh(node: fx.Node) -> None:
    """Work out the node's (fake) value and its getitems' again from its new arguments."""
    args, kwargs = pytree.tree_map_only(fx.Node, lambda a: a.meta["val"], (node.args, node.kwargs))
    with detect_fake_mode((args, kwargs)):
        node.meta["val"] = node.target(*args, **kwargs)
    for user in node.users:
        if user.target is operator.getitem:
            user.meta["val"] = node.meta["val"][user.args[1]]

