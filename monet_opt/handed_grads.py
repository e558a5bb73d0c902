"""NOTE [Output gradients as handed]
  A loss such as `out.sum() * 1.3`, `out.sum() / n` or `out.sum(0).sum()` hands the step's
  backward an expanded gradient: one value (or one row) broadcast over the output, its storage
  that value alone. AOTAutograd traced the backward for a contiguous gradient and copies the one
  it is handed into that layout before the backward runs; eager's ops read the expanded one.
  Most ops compute the same bits either way, but a reduction over a broadcast tensor adds in
  another order than over its contiguous copy: a Linear's bias gradient (`sum` over the batch)
  came out 3.8e-6 from eager's under `out.sum() * 1.3` (37 x 10 outputs), a BatchNorm's weight
  gradient 1.4e-4 (a conv then BatchNorm2d; native_batch_norm_backward sums over the batch and
  the pixels), even 2.7e-6 under plain `out.sum()`. torch.compile(backend="aot_eager") differs
  alike (measured 2026-12-04).
  A permuted output alike (NHWC boxes `conv(x).permute(0, 2, 3, 1)`, a (N, L, C) sequence, a
  transposed head): its gradient reaches the last layer permuted, and AOTAutograd copies it
  contiguous. Under a weighted sum a Linear's bias gradient came out 9.5e-7 from eager's, a
  BatchNorm1d's 9.3e-6, a BatchNorm2d's 2.4e-5 (and every gradient before it); under
  cross-entropy 8e-9 to 4e-8 (measured 2026-12-04).
  So the step's backward node notes the gradients it is handed (`prehook`: its pre-hook sees
  them before AOTAutograd copies them), and in the backward graph each reduction that reads a
  tangent (READ_AS_HANDED: `sum`, ATen's BatchNorm backward) reads the gradient as handed
  (`as_handed`) where its strides are not the tangent's, the copy living on to its planned last
  read. An expanded gradient's storage is one value or one row. A permuted one is full-size,
  outside the plan as every full-size output gradient is (OutputGradientWarning, NOTE [The
  output's gradient] in monet_opt/lower.py): read so, it lives beside the copy to its last
  reduction (before, it died when copied), and a step peaking there measures over its
  prediction by at most its size, as the warning says, and by a BatchNorm's per-channel
  temporary for a strided gradient (64 B on a 16-channel BatchNorm1d under cross-entropy).
  A reduction over a view of the tangent (a Linear on tokens sums its bias gradient over the
  gradient viewed as rows) reads the same view of the handed one (`view_as_handed`), where it
  can be so viewed (eager's reshape copies it where not, as the trace's copy).
  Only those: every other op measured computes the same bits from either (mm, convolution's,
  LayerNorm's and GroupNorm's backwards, softmax's, elementwise ones), and some make a
  contiguous copy of a broadcast input inside (mm, convolution's backward: 1,480 B over the
  plan on a Linear head, both copies alive), which the plan does not count. CPU's BatchNorm
  backward makes an input-sized temporary for a contiguous gradient and none for a broadcast
  one, so a step whose peak is there measures that much under its prediction (2,636 B on a
  Linear then BatchNorm1d, `out.sum() * 1.3`), as eager does. Where no node is running (the
  profiler), the gradient came in the tangent's layout (cross-entropy's of an output as it was
  made) or cuDNN's BatchNorm reads it (eager's copies it), nothing changes.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.fx as fx

from monet_opt.absent_grads import tangent_positions
from monet_opt.lower import is_view_node

aten = torch.ops.aten
READ_AS_HANDED = frozenset({aten.sum.default, aten.sum.dim_IntList,
                            aten.native_batch_norm_backward.default})
_KEY = "monet_opt.handed"  # in the backward node's metadata: output position -> its gradient


def prehook(node) -> None:
    """Hook the step's backward node (absent_grads.step_node's; None: nothing) to note the
    gradients it is handed, by output position."""
    if node is not None:
        node.register_prehook(_noting(node.metadata))


def _noting(metadata: dict):
    def note(grad_outputs: Sequence[torch.Tensor | None]) -> None:
        metadata[_KEY] = {k: g for k, g in enumerate(grad_outputs)
                          if isinstance(g, torch.Tensor) and g.layout == torch.strided}
    return note


def apply(bw: fx.GraphModule, joint: fx.GraphModule, num_fwd_outputs: int) -> None:
    """Have the reductions of `bw` that read a tangent, or a view of it, read the gradient as
    handed (NOTE [Output gradients as handed]). The backward takes what its node noted first
    thing, so that nothing noted outlives it (a loss the caller keeps keeps the node). Call
    recompile() after."""
    order = {n: k for k, n in enumerate(bw.graph.nodes)}
    with bw.graph.inserting_after(list(bw.graph.find_nodes(op="placeholder"))[-1]):
        noted = bw.graph.call_function(take_noted, ())
    for tangent, k in tangent_positions(bw, joint, num_fwd_outputs).items():
        if _reduced(tangent):
            with bw.graph.inserting_after(noted):
                handed = bw.graph.call_function(as_handed, (noted, tangent, k))
            handed.meta = dict(tangent.meta)
            _redirect(bw, tangent, handed, order)


def _reduced(node: fx.Node) -> bool:
    """Whether a reduction of READ_AS_HANDED reads `node`, or a view of it (of a view...)."""
    return any(user.target in READ_AS_HANDED or _viewed(user, node) and _reduced(user)
               for user in node.users)


def _viewed(user: fx.Node, node: fx.Node) -> bool:
    return is_view_node(user) and user.args[:1] == (node,)


def _redirect(bw: fx.GraphModule, value: fx.Node, handed: fx.Node, order: dict) -> None:
    """The reductions reading `value` read `handed`, the views of it reduced later view
    `handed` alike, and `value` is read after its last reader, to keep it as long as planned
    (a view keeps its base's storage)."""
    users = [user for user in value.users if user in order]  # not `handed` itself
    moved = set()
    for user in users:
        if user.target in READ_AS_HANDED:
            user.replace_input_with(value, handed)
            moved.add(user)
        elif _viewed(user, value) and _reduced(user):
            with bw.graph.inserting_after(user):
                view = bw.graph.call_function(view_as_handed(user.target),
                                              (user, value, handed, *user.args[1:]), user.kwargs)
            view.meta = dict(user.meta)
            _redirect(bw, user, view, order)
    last = max(users, key=order.__getitem__)
    if last in moved:
        with bw.graph.inserting_after(last):
            bw.graph.call_function(_read, (value,))


def take_noted() -> dict[int, torch.Tensor]:
    """What the running backward node noted (`prehook`), no longer kept on it."""
    node = torch._C._current_autograd_node()
    return {} if node is None else node.metadata.pop(_KEY, {})


def as_handed(noted: dict[int, torch.Tensor], tangent: torch.Tensor, k: int) -> torch.Tensor:
    """The gradient noted for output k where it holds `tangent`'s values in another layout
    (expanded, permuted); else `tangent`."""
    handed = noted.get(k)
    if handed is None or handed.shape != tangent.shape or handed.dtype != tangent.dtype or \
            handed.device != tangent.device or handed.stride() == tangent.stride():
        return tangent
    return handed


@functools.cache
def view_as_handed(op):
    """What views the gradient as handed as `op` viewed the tangent: `op(handed, *args)`, or
    the tangent's view (`viewed`) where it was not handed otherwise or `op` cannot view it so
    (a view that merges a broadcast dimension with one that is not)."""
    def view(viewed: torch.Tensor, tangent: torch.Tensor, handed: torch.Tensor, *args,
             **kwargs) -> torch.Tensor:
        if handed is tangent:
            return viewed
        try:
            return op(handed, *args, **kwargs)
        except RuntimeError:
            return viewed
    view.__name__ = view.__qualname__ = f"{str(op).replace('.', '_')}_as_handed"
    return view


def _read(value: torch.Tensor) -> None:
    """Nothing: reading `value` here keeps it to its planned last read."""
