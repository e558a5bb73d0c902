"""NOTE [Hooks on an output others are computed from]
  An output that another output is computed from (a trunk's features returned beside the
  head's logits) is one more output of the step's one autograd node, as under torch.compile:
  a hook the caller puts on it (`h.register_hook(lambda g: g * 0.5)`) runs on the gradient the
  loss hands it directly, not on what reaches it through the outputs computed from it, which
  flows inside the step. Eager's hook sees the sum, so a hook that changes the gradient
  changed only part of it: the trunk's gradients 2.0x eager's, silently, where the docs said
  the parameters' gradients were eager's (multitask probe, 2026-12-07; torch.compile's
  aot_eager gives the same 2.0x). Which returned outputs others are computed from is read off
  the joint graph when the step is planned (`feeding`); as the step's backward begins, one of
  them with a hook on it is warned about (HookWarning, once per call site as warnings go).
"""
from __future__ import annotations

import warnings
import weakref

from torch import fx
from torch.utils import _pytree as pytree

from monet_opt.errors import user_stacklevel
from monet_opt.hooks import HookWarning


def feeding(joint: fx.GraphModule, returned: tuple[int, ...]) -> tuple[int, ...]:
    """The leaf positions, among the forward's outputs, of those `returned` (positions among
    the joint graph's outputs) that another of them is computed from."""
    output = joint.graph.output_node()
    values = pytree.arg_tree_leaves(*output.args)
    descs = output.meta.get("desc") or ()
    bit = {values[k]: 1 << j for j, k in enumerate(returned) if isinstance(values[k], fx.Node)}
    reach: dict[fx.Node, int] = {}
    for node in joint.graph.nodes:
        reach[node] = bit.get(node, 0)
        for arg in node.all_input_nodes:
            reach[node] |= reach[arg]
    used = 0
    for node, own in bit.items():
        used |= reach[node] & ~own
    return tuple(descs[k].idx for j, k in enumerate(returned)
                 if used >> j & 1 and k < len(descs) and hasattr(descs[k], "idx"))


def prehook(node, outputs, positions: tuple[int, ...]) -> None:
    """Warn, as the step's backward `node` begins, where one of the outputs at `positions`
    (leaf positions of `outputs`) has a hook on it (NOTE [Hooks on an output others are
    computed from])."""
    if node is None or not positions:
        return
    leaves = pytree.tree_leaves(outputs)
    refs = [weakref.ref(leaves[k]) for k in positions if k < len(leaves)]
    node.register_prehook(lambda grad_outputs: _check(refs))


def _check(refs: list) -> None:
    hooked = [t for t in (r() for r in refs) if t is not None and t._backward_hooks and any(
        not getattr(fn, "ours", False) for fn in t._backward_hooks.values())]
    if hooked:
        warnings.warn(HookWarning(
            f"monet_opt: a hook is on an output of the optimized module that another of its "
            f"outputs is computed from ({hooked[0].dtype} {list(hooked[0].shape)}). It runs "
            "on the gradient the loss hands that output directly; what reaches it through the "
            "outputs computed from it flows inside the step and does not pass the hook, where "
            "eager's hook sees the sum. A hook that changes the gradient (scales, clips) "
            "therefore changes only part of it, and the gradients of what comes before differ "
            "from eager's. Put the hook inside the model (on the tensor in the forward), or run "
            "the model itself for such steps (opt.model). NOTE [Hooks on an output others are "
            "computed from] in monet_opt/output_hooks.py."), stacklevel=user_stacklevel())
