"""Grouped-query attention on SDPA's math path casts its keys and values before it repeats them,
as eager does (a rewrite of the joint graph).

NOTE [Grouped keys on the math path]
  Where the CPU's attention runs SDPA's math path (with attention dropout: the fused kernel
  takes none), the trace holds that path's ops, not a kernel call, so NOTE [Grouped-query
  attention] finds nothing to rewrite. Eager there is given grouped keys and values
  (`enable_gqa`, HF passing no mask) and the math path casts them (autocast's cast to
  bfloat16, then its own back to float32) and then repeats them for the query heads; its
  backward sums each group's gradients in float32 and rounds the sum once, in the casts'
  backward. The trace holds HF's `repeat_kv` (traced, HF builds a mask and so repeats the keys
  itself): repeat, then cast, so its backward rounds each head's gradient to bfloat16 before
  the group sum. HF Llama with attention dropout 0.1 and 2 key/value heads for 4 query heads,
  under CPU bfloat16 autocast, had gradients 0.44 from eager's.

  So where a repeat (NOTE [Grouped-query attention]'s pattern) is read by nothing but a chain
  of casts, and those only by the math path of attention whose mask is a constant causal one
  or one that masks nothing (NOTE [Constant attention masks]: the mask HF builds because it is
  traced, where eager passes none), the casts move before the repeat in the forward, and in
  the backward the casts' gradients move after the group sum: eager's ops in eager's order,
  eager's gradients bitwise (tests/test_grouped_attention.py). The forward's values are the
  same either way (a cast is elementwise, a repeat copies). The math path's own causal mask
  (`where(tril(ones(L, S)))`, what SDPA builds for is_causal=True) is not such a mask: a model
  that repeats its keys itself and passes is_causal=True runs in eager as traced, and is left
  so. A backward op is tied to its forward op by AOTAutograd's `seq_nr`; the rewrite is made
  only where the whole backward chain (the casts' gradients, then the group sum) is there.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from monet_opt.attention_masks import constant, kind
from monet_opt.grouped_attention import RESHAPES, only_user, refresh, repeated
from monet_opt.phase import in_backward

aten = torch.ops.aten
# What the math path does to a key or value between its casts and its batched products.
_TO_PRODUCT = (aten.mul.Scalar, aten.transpose.int, aten.expand.default, aten.clone.default,
               *RESHAPES)
# What it does to the softmax's output before the product with the values.
_FROM_SOFTMAX = (aten.native_dropout.default, operator.getitem, aten.expand.default,
                 aten.clone.default, *RESHAPES)


def cast_before_repeat(gm: fx.GraphModule) -> int:
    """NOTE [Grouped keys on the math path], in place; returns how many repeats it moved."""
    softmaxes = _masked_softmaxes(gm)
    if not softmaxes:
        return 0
    backward: dict[int, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if in_backward(node) and "seq_nr" in node.meta:
            backward.setdefault(node.meta["seq_nr"], []).append(node)
    count = 0
    for node in list(gm.graph.nodes):
        match = _match(node, softmaxes, backward) if node.target in RESHAPES else None
        if match is not None:
            _move_casts(*match)
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _masked_softmaxes(gm: fx.GraphModule) -> set[fx.Node]:
    """The math path's softmaxes whose scores have a constant mask added that is causal or masks
    nothing, other than SDPA's own causal mask."""
    found = set()
    for softmax in gm.graph.find_nodes(op="call_function", target=aten._safe_softmax.default):
        scores = softmax.args[0]
        if scores.target is not aten.add.Tensor or not isinstance(scores.args[1], fx.Node):
            continue
        mask = scores.args[1]
        if _sdpa_causal(mask):
            continue
        L, S = softmax.meta["val"].shape[-2:]
        if kind(constant(mask), L, S) is not None:
            found.add(softmax)
    return found


def _sdpa_causal(mask: fx.Node) -> bool:
    """Whether `mask` is the one SDPA's math path builds for is_causal=True."""
    if mask.target is not aten.where.self or not isinstance(mask.args[0], fx.Node):
        return False
    tril = mask.args[0]
    return tril.target is aten.tril.default and isinstance(tril.args[0], fx.Node) \
        and tril.args[0].target is aten.ones.default


def _match(reshape: fx.Node, softmaxes: set[fx.Node], backward: dict[int, list[fx.Node]]):
    """(the repeat's nodes, its casts, the casts' backward, the group sum's nodes) where
    `reshape` ends a repeat that the rewrite applies to; else None."""
    found = repeated(reshape)
    if found is None or found[2][-1] is not reshape:
        return None
    chain = found[2]
    casts = []
    node = reshape
    while (user := only_user(node)) is not None and user.target is aten._to_copy.default \
            and len(user.args) == 1 and set(user.kwargs) <= {"dtype"}:
        casts.append(user)
        node = user
    if not casts or not _read_by_attention(casts[-1], softmaxes):
        return None
    sums = _backward_of(chain, casts, backward)
    return None if sums is None else (chain, casts, *sums)


def _read_by_attention(node: fx.Node, softmaxes: set[fx.Node]) -> bool:
    """Whether the forward reads `node` only in batched products of the math path of attentions
    whose softmax is in `softmaxes`, as their keys or their values."""
    products, stack = [], [node]
    while stack:
        for user in stack.pop().users:
            if in_backward(user):
                continue  # what the backward reads is the same after the rewrite
            if user.target is aten.bmm.default:
                products.append(user)
            elif user.target in _TO_PRODUCT:
                stack.append(user)
            else:
                return False
    return bool(products) and all(_scores_of(p) in softmaxes or _softmax_in(p.args[0])
                                  in softmaxes for p in products)


def _scores_of(product: fx.Node) -> fx.Node | None:
    """The softmax reading `product`'s output (query times keys) through a reshape and the
    mask's addition, if that is all that reads it."""
    node = only_user(product)
    if node is None or node.target not in RESHAPES:
        return None
    node = only_user(node)
    if node is None or node.target is not aten.add.Tensor:
        return None
    return only_user(node)


def _softmax_in(node) -> fx.Node | None:
    """The softmax `node` (the weights multiplied into the values) is made from, if any."""
    for _ in range(8):
        if not isinstance(node, fx.Node):
            return None
        if node.target is aten._safe_softmax.default:
            return node
        if node.target not in _FROM_SOFTMAX:
            return None
        node = node.args[0]
    return None


def _backward_of(chain: list[fx.Node], casts: list[fx.Node], backward):
    """(the casts' gradients, last cast's first, then the group sum's nodes: reshape, sum,
    squeeze) where they form one chain, each read only by the next; else None."""
    def one(forward: fx.Node, targets) -> fx.Node | None:
        nodes = [n for n in backward.get(forward.meta.get("seq_nr"), []) if n.target in targets]
        return nodes[0] if len(nodes) == 1 else None

    unsqueeze, expand, *_, reshape = chain
    nodes = [one(c, (aten._to_copy.default,)) for c in reversed(casts)]
    nodes += [one(reshape, RESHAPES), one(expand, (aten.sum.dim_IntList,)),
              one(unsqueeze, (aten.squeeze.dim, *RESHAPES))]
    if None in nodes:
        return None
    for before, after in zip(nodes, nodes[1:]):
        if only_user(before) is not after or after.args[0] is not before:
            return None
    total = nodes[-2]
    if list(total.args[1]) not in ([2], [-3]) or total.kwargs.get("dtype") is not None:
        return None
    return nodes[:len(casts)], nodes[len(casts):]


def _move_casts(chain: list[fx.Node], casts: list[fx.Node], cast_grads: list[fx.Node],
                group_sum: list[fx.Node]) -> None:
    """Forward: x, repeat, casts -> x, casts, repeat. Backward: casts' gradients, group sum ->
    group sum, casts' gradients."""
    unsqueeze, reshape = chain[0], chain[-1]
    source = unsqueeze.args[0]
    casts[-1].replace_all_uses_with(reshape)
    casts[0].replace_input_with(reshape, source)
    unsqueeze.replace_input_with(source, casts[-1])
    for cast in casts:
        unsqueeze.prepend(cast)
    for node in (*casts, *chain):
        refresh(node)
    if not any(node.target is aten.clone.default for node in chain):
        # one key/value head: the repeat is a view (stride 0 over the heads), and the casts
        # after it were what made it contiguous, as the math path's views read it (they
        # failed to trace: Gemma-like MQA under autocast; HF hunt, 2026-12-02). Eager's
        # repeat copies, so a copy here holds what the moved casts held.
        with reshape.graph.inserting_after(reshape):
            copy = reshape.graph.call_function(aten.clone.default, (reshape,),
                                               {"memory_format": torch.contiguous_format})
        reshape.replace_all_uses_with(copy, delete_user_cb=lambda user: user is not copy)
        copy.meta.update({k: v for k, v in reshape.meta.items() if k != "val"})
        refresh(copy)

    first, last = group_sum[0], group_sum[-1]
    grad = cast_grads[0].args[0]
    last.replace_all_uses_with(cast_grads[-1])
    first.replace_input_with(cast_grads[-1], grad)
    cast_grads[0].replace_input_with(grad, last)
    at = last
    for cast in cast_grads:
        at.append(cast)
        at = cast
    for node in (*group_sum, *cast_grads):
        refresh(node)
