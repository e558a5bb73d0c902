"""Attention masks that are constants: attention runs as eager runs it (a rewrite of the joint
graph).

NOTE [Constant attention masks]
  HF transformers gives scaled_dot_product_attention no mask and is_causal=True when it can see
  that no token is padded, and an explicit mask when it cannot see, which is whenever the model is
  traced (`is_tracing`, masking_utils.py). Our trace is such a time, so the captured graph builds
  a [batch, 1, L, S] mask from the input's shape (arange, comparisons, new_ones of input_ids) and
  the attention kernel reads it, where eager's skips the blocks above the diagonal: on an H200,
  GPT-2 (batch 8 x 1,024, float32) took +10.8 % over eager in our store-all step, with a mask
  kept for the backward of each of its 12 layers (docs/benchmarks/gpu/README.md).

  A mask computed from no input's values (only from shapes and constants) is the same on every
  call with the same shapes, and a step's key holds every input's shape, dtype and device (a new
  one is traced again). So it is computed once here, on the device, and where it is SDPA's
  causal mask (lower-triangular, L == S) the attention ops that read it, forward and backward,
  run with is_causal=True and no mask; where it masks nothing, with no mask. Its nodes are then
  read by nothing and are removed. Boolean masks (True: attend) and additive ones (0: attend;
  -inf or the dtype's lowest: masked) are recognized. A mask that reads an input's values (a
  padding attention_mask passed in), a parameter, or anything random is left as it is.

  Masked scores contribute exactly zero either way (exp(-inf) = 0 in the kernels' running
  softmax), so the kernel computes the same sums over the same keys. For HF's models this is the
  call eager makes, and their gradients are eager's bitwise (tests/test_attention_masks.py); a
  model that hands SDPA an explicit causal mask in eager too gets its results bitwise from the
  CPU's kernel (same tests), not yet checked on CUDA's.
"""
from __future__ import annotations

import functools
import operator
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _pytree as pytree

aten = torch.ops.aten
MASK_ARGS = ("attn_bias", "attn_mask")
# Ops that read only their first argument's shape, dtype and device, not its values.
_METADATA_ONLY = (aten.new_ones.default, aten.new_zeros.default, aten.new_full.default,
                  aten.ones_like.default, aten.zeros_like.default, aten.full_like.default,
                  aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int)
_UNINITIALIZED = (aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
                  aten.empty_strided.default, aten.new_empty_strided.default)


def drop_constant_masks(gm: fx.GraphModule) -> list[fx.Node]:
    """NOTE [Constant attention masks], in place; returns the attention ops changed."""
    changed = []
    masks = {}
    for node in list(gm.graph.nodes):
        mask_arg = _mask_arg(node)
        if mask_arg is None or node_argument(node, "is_causal") is True:
            continue
        mask = node_argument(node, mask_arg)
        if not isinstance(mask, fx.Node):
            continue
        if mask not in masks:
            masks[mask] = _kind(constant(mask), node)
        if masks[mask] is not None:
            set_argument(node, mask_arg, None)
            if masks[mask] == "causal":
                set_argument(node, "is_causal", True)
            changed.append(node)
    for mask in masks:
        _erase_unread(gm, mask)
    if changed:
        gm.recompile()
    return changed


@functools.lru_cache(maxsize=None)
def mask_arg(op) -> str | None:
    """The name of an attention op's mask argument; None if `op` is not such an op."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    names = {a.name for a in op._schema.arguments}
    if "is_causal" not in names:
        return None
    return next((n for n in MASK_ARGS if n in names), None)


def argument(op: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str):
    """The value of `op`'s argument `name` in a call with these args and kwargs."""
    i, arg = _position(op, name)
    if i < len(args):
        return args[i]
    return kwargs.get(name, arg.default_value if arg.has_default_value() else None)


def _mask_arg(node: fx.Node) -> str | None:
    return mask_arg(node.target) if node.op == "call_function" else None


def node_argument(node: fx.Node, name: str):
    return argument(node.target, node.args, node.kwargs, name)


def _position(op: torch._ops.OpOverload, name: str) -> tuple[int, Any]:
    arguments = op._schema.arguments
    i = next(i for i, a in enumerate(arguments) if a.name == name)
    return i, arguments[i]


def set_argument(node: fx.Node, name: str, value) -> None:
    i, _ = _position(node.target, name)
    if i < len(node.args):
        node.args = (*node.args[:i], value, *node.args[i + 1:])
    else:
        node.kwargs = {**node.kwargs, name: value}


def constant(mask: fx.Node) -> torch.Tensor | None:
    """The mask's value, where it reads no placeholder's values and nothing random; else None."""
    order = _ancestors(mask)
    among = set(order)
    uses = {n: sum(u in among for u in n.users) for n in order}  # values freed after their last
    values: dict[fx.Node, Any] = {}
    stand_ins: set[fx.Node] = set()  # placeholders: real tensors of their shape, values unset
    with unset_fake_temporarily(), torch.no_grad():
        for node in order:
            val = node.meta.get("val")
            if node.op == "placeholder":
                if not _static(val):
                    return None
                values[node] = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype,
                                                   device=val.device)
                stand_ins.add(node)
            elif node.op == "call_function" and _pure(node.target):
                read = [a for a in node.all_input_nodes if a in stand_ins]
                if read and not (node.target in _METADATA_ONLY and node.args[0] in stand_ins
                                 and read == [node.args[0]]):
                    return None
                args, kwargs = pytree.tree_map(
                    lambda a: values[a] if isinstance(a, fx.Node) else a, (node.args, node.kwargs))
                values[node] = node.target(*args, **kwargs)
                for a in node.all_input_nodes:
                    uses[a] -= 1
                    if uses[a] == 0:
                        del values[a]
            else:
                return None
    value = values[mask]
    return value if isinstance(value, torch.Tensor) else None


def _ancestors(node: fx.Node) -> list[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return sorted(seen, key=_graph_position(node.graph))


def _graph_position(graph: fx.Graph):
    index = {n: i for i, n in enumerate(graph.nodes)}
    return index.__getitem__


def _static(val) -> bool:
    return isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in (
        *val.shape, *val.stride()))


def _pure(target) -> bool:
    if target is operator.getitem:
        return True
    return isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable \
        and torch.Tag.nondeterministic_seeded not in target.tags \
        and target not in _UNINITIALIZED


def _kind(mask: torch.Tensor | None, attention: fx.Node) -> str | None:
    """"causal" where the mask is SDPA's causal mask for this attention, "none" where it masks
    nothing, else None."""
    q, k = (node_argument(attention, n) for n in ("query", "key"))
    if not all(isinstance(t, fx.Node) for t in (q, k)):
        return None
    return kind(mask, q.meta["val"].shape[-2], k.meta["val"].shape[-2])


def kind(mask: torch.Tensor | None, L: int, S: int) -> str | None:
    """"causal" where `mask` is SDPA's causal mask for L queries and S keys, "none" where it
    masks nothing, else None."""
    if mask is None:
        return None
    with unset_fake_temporarily():
        if mask.dtype == torch.bool:
            allowed = mask
        elif mask.is_floating_point():
            allowed = mask == 0
            if not (allowed | (mask <= torch.finfo(mask.dtype).min)).all():
                return None
        else:
            return None
        if mask.dim() > 4 or tuple(mask.shape[-2:]) not in ((L, S), (1, S), (L, 1), (1, 1)):
            return None
        if bool(allowed.all()):
            return "none"
        causal = torch.ones(L, S, dtype=torch.bool, device=mask.device).tril()
        if L == S and bool((allowed == causal).all()):
            return "causal"
    return None


def _erase_unread(gm: fx.GraphModule, mask: fx.Node) -> None:
    for node in reversed(_ancestors(mask)):
        if node.op == "call_function" and not node.users:
            gm.graph.erase_node(node)
