"""Lower AOTAutograd's joint forward+backward FX graph to a `solvers.Problem`.

Operators are the ATen calls that allocate. Views (anything whose schema says its output aliases
an input, plus `_unsafe_view` and `unsafe_split`), `getitem`s and detaches are folded: they own
no storage and are re-created on demand by the executor. A Problem tensor is one storage: an
op's output. Parameters, buffers and inputs (the `primals_*` placeholders) are fixed memory;
output gradients (the `tangents_*` placeholders) exist from the start of the backward.

NOTE [The output's gradient]
  The step is planned for a loss whose backward hands it output gradients that cost nothing
  (`out.sum()`: an expanded scalar, made contiguous inside the backward and freed after its last
  read; reductions read it as handed, NOTE [Output gradients as handed]). A loss whose backward
  makes a full-size gradient (cross-entropy, a square, the `.float()` of half-precision logits;
  CUDA autocast runs `sum` in float32, which is such a cast) adds its own memory at the turn
  from forward to backward (what it saved, its temporaries): traced op by op (2026-11-30),
  cross-entropy's step peaked at the loss's own `_log_softmax_backward_data`, its saved
  log-probabilities, nll_loss's gradient and the result (128,000 B each) on top of the forward's
  end; the gradient it then hands us died at its last read in our backward, as planned (a weak
  reference to its storage; not, as this NOTE said before, held by autograd to the backward's
  end). Measured on tests/models.py's GPT-2 (logits 128,000 B float32): cross-entropy +128,000 B
  over the store-all plan's prediction (eager's peak grows alike), +0 at the least plan;
  `logits.square().sum()` +201,728 B at the least plan; under CPU autocast
  `logits.float().sum()` +62,464 B (tests/test_loss_memory.py; on an H200 under CUDA autocast,
  `sum` alone: +55,541 B). Such a gradient is warned about when it arrives
  (OutputGradientWarning, monet_opt/output_grad.py: a hook on each output looks at the
  gradient's storage). Leave that much room under the limit, or compute the loss inside the
  model, where the plan covers it (HF: `labels`; measured to the byte); tracing a separate loss
  function into the step would make it exact too (not done).
"""
from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from monet_opt import (bn_split, conv_split, grad_in_place, mutation_tangents, phase, recompute,
                       updated_buffers)
from monet_opt.errors import UnsupportedGraphError
from monet_opt.memory import allocated_bytes, dense_parts, refuse_sparse_made
from monet_opt.stats_in_place import MARK
from solvers import NO_PRODUCER, Op, Problem, Tensor
from solvers.problem import last_readers

# Views whose schemas do not say so: `unsafe_split` returns slices of its input (GRU and RNN
# cells split their gates with it); counted as new tensors, a GRU's predicted peak was 7.7 %
# over its measured one.
_EXTRA_VIEWS = {torch.ops.aten._unsafe_view.default, torch.ops.aten._reshape_alias.default,
                torch.ops.aten.unsafe_split.Tensor, torch.ops.aten.unsafe_split_with_sizes.default}


@dataclass(frozen=True)
class Lowered:
    """The Problem plus the map back to FX nodes (by name).

    op_nodes[i]: the FX node of op i. tensor_nodes[t]: the FX node holding tensor t's value (the
    op itself, or its getitem; None for an output nobody reads). view_nodes: FX nodes that alias
    a storage and are re-created wherever they are read. fixed_nodes: primals and constants."""

    problem: Problem
    op_nodes: tuple[str, ...]
    tensor_nodes: tuple[str | None, ...]
    view_nodes: frozenset[str]
    fixed_nodes: frozenset[str]
    op_labels: tuple[str, ...] = field(default=())
    variant_sites: tuple = ()  # lower_variants.VariantSite per problem variant
    inplace: tuple[tuple[str, int], ...] = ()  # (add node, the argument it writes into)
    output_tensors: tuple[tuple[int, ...], ...] = ()  # per graph output: the tensors it holds
    # placeholders copied first, and their bytes, fixed memory the problem does not count (the
    # caller adds them to what it takes from the profile directory): NOTE [Buffers the step
    # updates] in monet_opt/updated_buffers.py
    snapshots: tuple[str, ...] = ()
    snapshot_sizes: tuple[int, ...] = ()
    # (random op node, bytes) of the generator states the step may keep, fixed memory only where
    # a schedule recomputes or replays the op: NOTE [States kept only where used] (recompute.py)
    states: tuple[tuple[str, int], ...] = ()

    @property
    def snapshot_bytes(self) -> int:
        return sum(self.snapshot_sizes)

    @property
    def conditional_bytes(self) -> int:
        """Fixed bytes a schedule may not make: the copies and the generator states."""
        return self.snapshot_bytes + sum(size for _, size in self.states)


def is_view_node(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    target = node.target
    if target in _EXTRA_VIEWS:
        return True
    if isinstance(target, torch._ops.OpOverload):
        returns = target._schema.returns
        return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                     for r in returns)
    return False


def lower(joint: fx.GraphModule, num_fwd_outputs: int, name: str = "model") -> Lowered:
    refuse_sparse_made(joint, is_view_node)  # NOTE [Sparse inputs] in monet_opt/memory.py
    b = _Builder()
    for node in joint.graph.nodes:
        if node.op == "placeholder":
            b.placeholder(node)
        elif node.op == "get_attr":
            b.fixed(node)
        elif node.op == "call_function":
            b.call(node)
        elif node.op == "output":
            b.output(node, num_fwd_outputs)
        else:
            raise UnsupportedGraphError(f"monet_opt: unexpected FX node kind {node.op!r} "
                                        f"({node.format_node()})")
    inplace = b.accumulate_in_place(joint)
    snapshots = updated_buffers.snapshots(joint, is_view_node)  # NOTE [Buffers the step updates]
    problem = Problem(ops=tuple(b.ops), tensors=tuple(b.tensors), fixed_bytes=b.fixed_bytes,
                      forward_outputs=tuple(b.forward_outputs),
                      backward_outputs=tuple(b.backward_outputs), name=name)
    return Lowered(problem=problem, op_nodes=tuple(b.op_nodes), tensor_nodes=tuple(b.tensor_nodes),
                   view_nodes=frozenset(b.views), fixed_nodes=frozenset(b.fixed_names),
                   op_labels=tuple(b.labels), inplace=inplace,
                   output_tensors=tuple(b.output_tensors),
                   snapshots=tuple(node.name for node in snapshots),
                   snapshot_sizes=tuple(storage_bytes(node.meta.get("val")) for node in snapshots))


# NOTE [Copies of a whole storage]
#   copy (functionalized copy_) and the *_scatter ops return a copy of their first argument's
#   whole storage, viewed with its sizes, strides and offset (ATen's clone_preserve_strides):
#   a scatter into a slice of an 8x16 matrix allocates the matrix. The fake tensors AOTAutograd
#   records for them do not always say so: a model writing in place into column slices
#   (h[:, :4] *= 2) traced some copies at 464 B (the slice's extent) and others, from the same
#   code, at 512 B, and measured 48 B over its predicted peak. Their bytes are taken from the
#   first argument's storage, as ATen allocates them.
_COPIES_SELF_STORAGE = {torch.ops.aten.copy.default, torch.ops.aten.slice_scatter.default,
                        torch.ops.aten.select_scatter.default,
                        torch.ops.aten.diagonal_scatter.default,
                        torch.ops.aten.as_strided_scatter.default}


def _copy_bytes(self_val: object) -> int | None:
    """The bytes an op of _COPIES_SELF_STORAGE allocates given its first argument, or None
    where ATen allocates otherwise (an empty storage; a self overlapping itself, which it
    clones densely) and the fake tensor's size stands."""
    if not isinstance(self_val, torch.Tensor) or _nbytes(self_val) == 0 or \
            torch._debug_has_internal_overlap(self_val) == 1:
        return None
    return storage_bytes(self_val)


def storage_bytes(val: object) -> int:
    """What a tensor takes on its device (NOTE [CUDA blocks] in monet_opt/memory.py)."""
    return allocated_bytes(_nbytes(val), val.device) if isinstance(val, torch.Tensor) else 0


def _nbytes(val: object) -> int:
    if not isinstance(val, torch.Tensor):
        return 0
    # a sparse tensor holds its indices and values, an efficient zero tensor nothing
    if val.layout != torch.strided or val._is_zerotensor():
        return sum(_nbytes(part) for part in dense_parts(val) if part is not val)
    try:
        return int(val.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001 - some tensor subclasses have no storage; size from shape
        return int(val.numel() * val.element_size())


class _Builder:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.tensors: list[Tensor] = []
        self.op_nodes: list[str] = []
        self.tensor_nodes: list[str | None] = []
        self.labels: list[str] = []
        self.views: set[str] = set()
        self.fixed_names: set[str] = set()
        self.fixed_bytes = 0
        self.seed_counted = False  # NOTE [The loss scalar]: its seed gradient counted once
        self.storage: dict[str, tuple[int, ...]] = {}   # node name -> the tensors it reads as
        self.multi: dict[str, tuple[int, ...]] = {}     # multi-output op -> its output tensors
        self.forward_outputs: list[int] = []
        self.backward_outputs: list[int] = []
        self.output_tensors: list[tuple[int, ...]] = []

    def fixed(self, node: fx.Node) -> None:
        self.fixed_names.add(node.name)
        self.fixed_bytes += storage_bytes(node.meta.get("val"))
        self.storage[node.name] = ()

    def placeholder(self, node: fx.Node) -> None:
        if not node.name.startswith("tangents"):
            return self.fixed(node)
        val = node.meta.get("val")
        t = self._tensor(node.name, val, NO_PRODUCER)
        if node.meta.get(mutation_tangents.NEVER_HANDED):  # NOTE [Gradients of parameters
            self.tensors[t] = dataclasses.replace(self.tensors[t], bytes=0)  # updated in place]
        elif isinstance(val, torch.Tensor) and val.dim() == 0 and not self.seed_counted:
            # NOTE [The loss scalar]: the fixed memory holds the loss's seed gradient (counted
            # here too, a plan peaking before its last read measured 4 B under its prediction)
            self.tensors[t] = dataclasses.replace(self.tensors[t], bytes=0)
            self.seed_counted = True
        self.storage[node.name] = (t,)

    def call(self, node: fx.Node) -> None:
        if node.target is operator.getitem and node.args[0].name in self.multi:
            outs = self.multi[node.args[0].name]
            t = outs[node.args[1]]
            self.tensor_nodes[t] = node.name
            self.storage[node.name] = (t,)
            return
        if node.target is operator.getitem or is_view_node(node):
            self.views.add(node.name)
            self.storage[node.name] = self._reads(node)
            return
        self._op(node)

    def _op(self, node: fx.Node) -> None:
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            raise UnsupportedGraphError(
                f"monet_opt: the joint graph mutates a tensor in place ({node.format_node()}); "
                "only functional graphs can be scheduled. Please report the model.")
        i = len(self.ops)
        val = node.meta.get("val")
        vals = list(val) if isinstance(val, (tuple, list)) else [val]
        outs = tuple(self._tensor(f"{node.name}.{k}" if len(vals) > 1 else node.name, v, i)
                     for k, v in enumerate(vals) if isinstance(v, torch.Tensor))
        if target in _COPIES_SELF_STORAGE and len(outs) == 1:
            nbytes = _copy_bytes(node.args[0].meta.get("val"))
            if nbytes is not None:
                self.tensors[outs[0]] = dataclasses.replace(self.tensors[outs[0]], bytes=nbytes)
        for k in node.meta.get(MARK, ()):  # NOTE [Statistics updated in place]: the buffers
            self.tensors[outs[k]] = dataclasses.replace(self.tensors[outs[k]], bytes=0)
        if isinstance(val, (tuple, list)):
            self.multi[node.name] = tuple(self._index_map(vals, outs))
            for t in outs:
                self.tensor_nodes[t] = None
        self.storage[node.name] = outs
        is_backward = phase.in_backward(node)
        self.ops.append(Op(name=node.name, is_backward=is_backward, time_s=0.0,
                           inputs=self._reads(node), outputs=outs,
                           is_random=recompute.is_random(node),
                           workspace_bytes=bn_split.workspace_bytes(node)
                           if node.target is bn_split.apply_stats
                           else conv_split.unasked_weight_bytes(node),
                           overwrites=self._overwritable(node, is_backward)))
        self.op_nodes.append(node.name)
        self.labels.append(_label(node))

    @staticmethod
    def _index_map(vals, outs):
        it = iter(outs)
        return [next(it) if isinstance(v, torch.Tensor) else -1 for v in vals]

    def _tensor(self, name: str, val: object, producer: int) -> int:
        self.tensors.append(Tensor(name=name, bytes=storage_bytes(val), producer=producer))
        self.tensor_nodes.append(name)
        return len(self.tensors) - 1

    def _overwritable(self, node: fx.Node, is_backward: bool) -> tuple[int, ...]:
        """NOTE [Writing into a dying input] (solvers/simulate.py): the forward tensors an
        elementwise op with an in-place form could write its output into: an argument that is
        a forward op's output itself (not a view of one), laid out exactly as the output; in the
        backward, at grad_in_place's arguments (NOTE [Elementwise backward ops in place])."""
        if is_backward:
            at = grad_in_place.may_write(node) if node.target in grad_in_place.OUT_FORMS else ()
        elif node.target not in OVERWRITING or node.kwargs.get("alpha", 1) != 1:
            return ()
        else:
            at = range(len(node.args))
        found = []
        for k in (k for k in at if k < len(node.args) and isinstance(node.args[k], fx.Node)):
            arg = node.args[k]
            reads = self.storage.get(arg.name, ())
            t = reads[0] if len(reads) == 1 else None
            others = [a for j, a in enumerate(node.args) if j != k and isinstance(a, fx.Node)]
            # x + x, or x + x.t(): nothing to gain, or a wrong sum
            if t is None or any(t in self.storage.get(a.name, ()) for a in others) or \
                    self.tensor_nodes[t] != arg.name or \
                    self.tensors[t].producer == NO_PRODUCER or \
                    self.ops[self.tensors[t].producer].is_backward or \
                    not same_layout(arg.meta.get("val"), node.meta.get("val")):
                continue
            found.append(t)
        return tuple(found)

    def _reads(self, node: fx.Node) -> tuple[int, ...]:
        reads: dict[int, None] = {}
        for arg in recompute.tensor_args(node):
            for t in self.storage[arg.name]:
                reads[t] = None
        return tuple(reads)

    def accumulate_in_place(self, joint: fx.GraphModule) -> tuple[tuple[str, int], ...]:
        """NOTE [In-place accumulation] (solvers/problem.py): each backward `add` of two
        same-dtype tensors (alpha 1) that can write into one of its arguments: a tensor a
        backward op made, read by no later op and not returned, laid out exactly as the sum
        (so the result is the sum bitwise, where it would be, with the sum's strides); and each
        backward op of grad_in_place.TARGETS that can write its result into an argument so
        (NOTEs [BatchNorm's gradient in place], [Elementwise backward ops in place], [Dropout's
        gradient in place] in monet_opt/grad_in_place.py). Marks the op's `inplace_bytes`;
        returns (node, argument) pairs for the executor."""
        last = last_readers(self.ops)
        returned = set(self.forward_outputs) | set(self.backward_outputs)
        index = {name: i for i, name in enumerate(self.op_nodes)}
        found = []
        for node in (n for target in (_ADD, *grad_in_place.TARGETS)
                     for n in joint.graph.find_nodes(op="call_function", target=target)):
            k = self._written_into(node, index, last, returned)
            if k is not None:
                found.append((node.name, k))
        return tuple(found)

    def _written_into(self, node: fx.Node, index: dict[str, int], last: dict[int, int],
                      returned: set[int]) -> int | None:
        """The argument backward op `node` writes its result into (NOTEs [In-place
        accumulation], [Elementwise backward ops in place] in monet_opt/grad_in_place.py),
        marking its `inplace_bytes`; or None."""
        i = index[node.name]
        if not self.ops[i].is_backward:
            return None
        val = node.meta.get("val")
        result = val[0] if isinstance(val, (tuple, list)) else val
        dx = self.multi[node.name][0] if node.name in self.multi else self.ops[i].outputs[0]
        at = [k for k, a in enumerate(node.args) if can_add_into(node, a)] \
            if node.target is _ADD else grad_in_place.may_write(node)
        for k in at:
            arg = node.args[k] if k < len(node.args) else None
            if not isinstance(arg, fx.Node) or not same_layout(arg.meta.get("val"), result):
                continue
            t = self._dying_grad(arg, i, last, returned)
            others = [a for j, a in enumerate(node.args) if j != k and isinstance(a, fx.Node)]
            if t is None or self.tensors[t].bytes != self.tensors[dx].bytes or \
                    any(t in self.storage[a.name] for a in others):
                continue
            self.ops[i] = dataclasses.replace(self.ops[i], inplace_bytes=self.tensors[t].bytes,
                                              overwrites=())
            return k
        return None

    def _dying_grad(self, arg: fx.Node, i: int, last: dict[int, int], returned: set[int]
                    ) -> int | None:
        """The tensor `arg` reads, where a backward op made it, op `i` is the last to read it
        and it is not returned: op `i` may write into it."""
        reads = self.storage[arg.name]
        t = reads[0] if len(reads) == 1 else None
        if t is None or last.get(t) != i or t in returned:
            return None
        producer = self.tensors[t].producer
        return t if producer != NO_PRODUCER and self.ops[producer].is_backward else None

    def output(self, node: fx.Node, num_fwd_outputs: int) -> None:
        outs = list(node.args[0])
        for k, arg in enumerate(outs):
            self.output_tensors.append(tuple(self.storage[arg.name])
                                       if isinstance(arg, fx.Node) else ())
            if not isinstance(arg, fx.Node):
                continue
            target = self.forward_outputs if k < num_fwd_outputs else self.backward_outputs
            target.extend(t for t in self.storage[arg.name] if t not in target)


_ADD = torch.ops.aten.add.Tensor
# Elementwise ops whose in-place form gives the same result bitwise, for `Op.overwrites`.
OVERWRITING = {torch.ops.aten.relu.default: torch.ops.aten.relu_.default,
               torch.ops.aten.hardtanh.default: torch.ops.aten.hardtanh_.default,
               _ADD: torch.ops.aten.add_.Tensor}


def can_add_into(add: fx.Node, arg: fx.Node) -> bool:
    """The graph's half of NOTE [In-place accumulation] (solvers/problem.py): `add` adds two
    nodes with alpha 1, and `arg`, one of them, is laid out exactly as their sum."""
    out = add.meta.get("val")
    return add.target is _ADD and add.kwargs.get("alpha", 1) == 1 and len(add.args) == 2 and \
        all(isinstance(a, fx.Node) for a in add.args) and arg in add.args and \
        isinstance(out, torch.Tensor) and same_layout(arg.meta.get("val"), out)


def same_layout(a: object, b: torch.Tensor) -> bool:
    """a is a tensor of b's dtype, shape and strides at offset 0, filling its storage."""
    return isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
        a.stride() == b.stride() and a.storage_offset() == 0 == b.storage_offset() and \
        _nbytes(a) == _nbytes(b)


def _label(node: fx.Node) -> str:
    target = node.target
    op = target.__name__ if hasattr(target, "__name__") else str(target)
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    where = ""
    if stack:
        path, _ = list(stack.values())[-1]
        where = f" in {path}" if path else ""
    return f"{op}{where}"
