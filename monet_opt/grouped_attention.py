"""Grouped-query attention reads its keys and values unrepeated, as eager does (a rewrite of the
joint graph).

NOTE [Grouped-query attention]
  A model with fewer key/value heads than query heads (Llama, Mistral, Qwen: grouped-query
  attention) either hands the attention kernel its keys and values as they are and lets the
  kernel share each among its group of query heads (`enable_gqa=True`), or repeats them itself
  to one per query head first (HF's `repeat_kv`: unsqueeze, expand, clone, reshape). HF does the
  first only when it passes no mask (`use_gqa_in_sdpa`), which in eager is whenever no token is
  padded, and traced it builds a mask where a check would read values (with use_cache=False, as
  training sets it, the check for packed sequences in the position ids; NOTE [Constant attention
  masks]); so our trace holds the second where eager does the first. The step then keeps the
  repeated keys and values for the attention's backward (the group's size times their bytes: 4x
  for Llama-3-8B's 32 query and 8 key/value heads), copies them in the forward, and sums the
  kernel's per-head gradients over each group in another order than the kernel does: HF Llama
  (4 query heads, 2 key/value heads, 128 wide) had gradients up to 4.4e-7 relative from
  eager's.

  So where NOTE [Constant attention masks] has just removed an attention's mask, and that
  attention reads repeated keys and values, and its kernel takes grouped ones itself (GROUPED
  below), the forward and backward attention read the keys and values as they were before the
  repeat, and whatever read the group sums of the kernel's key and value gradients reads the
  kernel's gradients instead: the call eager makes, with eager's results bitwise
  (tests/test_grouped_attention.py). The copies and sums are then read by nothing and go. The
  rewrite is made only where the whole pattern is there: the repeat read by nothing but these
  attention ops, and each gradient read only by its group sum; otherwise nothing changes. Under
  autocast the repeat is cast before the kernel and the gradient cast back before its sum; the
  kernel then reads the unrepeated keys cast (a new cast node) and the gradient is cast back
  after it, as eager does (the group sum in float32 of bfloat16 gradients had put Llama's
  gradients 6e-3 relative from eager's, which sums in the kernel and rounds once).

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
  op, with other outputs for the backward) is not done and not measured on a GPU. With attention
  dropout the CPU runs SDPA's math path, which the trace decomposes into its ops, so there is no
  kernel call to rewrite here: NOTE [Grouped keys on the math path] (monet_opt/grouped_math.py)
  puts that path's casts where eager has them.

NOTE [Masks eager builds too]
  HF's attention hands SDPA grouped keys only where it hands it no mask (`use_gqa_in_sdpa`),
  and a model that builds its causal mask whatever the padding (its code passes
  `allow_is_causal_skip=False`: Falcon, to add ALiBi onto it) repeats its keys in eager too.
  Rewritten, its step ran another call than eager's: Falcon with 2 key/value heads of 4 under
  CPU bfloat16 autocast had 12 of 19 gradients up to 7e-4 from eager's (float32 happened to
  agree; torch.compile's aot_eager is bitwise; HF zoo probe, 2026-12-06). Such a model's
  attention is left as traced (`eager_masks`).
"""
from __future__ import annotations

import functools
import inspect
import operator
import sys

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
RESHAPES = (aten._unsafe_view.default, aten.view.default, aten.reshape.default)


def eager_masks(model: torch.nn.Module) -> bool:
    """Whether an HF module of `model` builds its causal mask whatever the padding (NOTE [Masks
    eager builds too])."""
    return any(_builds_masks(name) for name in {type(m).__module__ for m in model.modules()}
               if name.startswith("transformers."))


@functools.cache
def _builds_masks(module_name: str) -> bool:
    try:
        return "allow_is_causal_skip=False" in inspect.getsource(sys.modules[module_name])
    except (KeyError, OSError, TypeError):  # no source to read: as HF's usual models
        return False


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
    repeats = [repeated(key), repeated(value)]
    if None in repeats or repeats[0][1] != repeats[1][1]:
        return 0
    group = repeats[0][1]
    chains = [chain for _, _, chain in repeats]
    backward_op = GROUPED[forward.target]
    readers = set(key.users) | set(value.users)
    backwards = [n for n in readers if n is not forward]
    if not all(n.target is backward_op and node_argument(n, "key") is key
               and node_argument(n, "value") is value
               and node_argument(n, mask_arg(n.target)) is None for n in backwards):
        return 0
    sums = []  # (a kernel gradient, the nodes summing it over each group, the sum last)
    for backward in backwards:
        for index, (source, _, _) in zip((_GRAD_KEY, _GRAD_VALUE), repeats):
            for grad in _outputs(backward, index):
                chain = _group_sum(grad, source, group)
                if chain is None:
                    return 0
                sums.append((grad, chain))
    with gm.graph.inserting_before(forward):  # the kernel's inputs: cast as the repeats were
        k, v = (_cast_as(gm, x, chain[-1]) for x, _, chain in repeats)
    for node in (forward, *backwards):
        set_argument(node, "key", k)
        set_argument(node, "value", v)
        refresh(node)
    for grad, chain in sums:
        with gm.graph.inserting_after(grad):  # the gradient cast back as the sum's input was
            chain[-1].replace_all_uses_with(_cast_as(gm, grad, chain[0]))
        chains.append(chain)
    erased: set[fx.Node] = set()  # keys and values may be one repeat
    for chain in chains:
        for node in reversed(chain):
            if node not in erased and not node.users:
                gm.graph.erase_node(node)
                erased.add(node)
    return 1 + len(backwards)


def repeated(node) -> tuple[fx.Node, int, list[fx.Node]] | None:
    """(x, r, the repeat's nodes in order) where `node` is x ([b, h, s, d]) with each head
    repeated r > 1 times in place: reshape(clone(expand(unsqueeze(x, 2), [b, h, r, s, d])),
    [b, h * r, s, d]), possibly then cast (`_to_copy`: autocast's, before the kernel); else
    None."""
    if not isinstance(node, fx.Node):
        return None
    chain = [node]
    if node.target is aten._to_copy.default:
        node = node.args[0]
        chain.append(node)
    if node.target not in RESHAPES:
        return None
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


def _cast_as(gm: fx.GraphModule, x: fx.Node, node: fx.Node) -> fx.Node:
    """x, cast as `node` casts where it is a `_to_copy` (a new node, at the graph's insertion
    point); else x itself."""
    if node.target is not aten._to_copy.default:
        return x
    cast = gm.graph.call_function(aten._to_copy.default, (x,), dict(node.kwargs))
    cast.meta = dict(node.meta)  # its phase (partitioner_tag), its place in the model
    refresh(cast)
    return cast


def _outputs(node: fx.Node, index: int) -> list[fx.Node]:
    return [u for u in node.users if u.target is operator.getitem and u.args[1] == index]


def _group_sum(grad: fx.Node, source: fx.Node, group: int) -> list[fx.Node] | None:
    """The nodes that sum `grad` (a gradient of the repeated tensor) over each group back to
    `source`'s shape and dtype, in order, where that is all `grad` is read by: possibly a cast
    (`_to_copy`, back from autocast's), reshape to [b, h, r, s, d], sum over dim 2, then squeeze
    or reshape if the sum kept the dim; else None."""
    b, h, s, d = source.meta["val"].shape
    chain = []
    split = only_user(grad)
    if split is not None and split.target is aten._to_copy.default:
        chain.append(split)
        split = only_user(split)
    if split is None or split.target not in RESHAPES \
            or tuple(split.meta["val"].shape) != (b, h, group, s, d):
        return None
    total = only_user(split)
    if total is None or total.target is not aten.sum.dim_IntList \
            or list(total.args[1]) not in ([2], [-3]) or len(total.args) > 3 or total.kwargs:
        return None
    chain += [split, total]
    if tuple(total.meta["val"].shape) == (b, h, 1, s, d):
        total = only_user(total)
        if total is None or not (total.target in RESHAPES or (
                total.target is aten.squeeze.dim and total.args[1] in (2, -3))):
            return None
        chain.append(total)
    val = total.meta["val"]
    if tuple(val.shape) != (b, h, s, d) or val.dtype != source.meta["val"].dtype:
        return None
    return chain


def only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def refresh(node: fx.Node) -> None:
    """Work out the node's (fake) value and its getitems' again from its new arguments."""
    args, kwargs = pytree.tree_map_only(fx.Node, lambda a: a.meta["val"], (node.args, node.kwargs))
    with detect_fake_mode((args, kwargs)):
        node.meta["val"] = node.target(*args, **kwargs)
    for user in node.users:
        if user.target is operator.getitem:
            user.meta["val"] = node.meta["val"][user.args[1]]

