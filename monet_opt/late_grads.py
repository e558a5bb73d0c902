"""Make a backward op's result as late as it can be made, where that holds less (a rewrite of the
joint graph's order).

NOTE [Results made late]
  A joint graph's backward runs in the order autograd built it: each layer's weight gradient is
  made as soon as the layer's output gradient is, and then held to the end of the step. Where
  the weight is larger than what its gradient is made from (a fully connected layer: VGG-16's
  first one has a 392 MiB weight, made from a 0.8 MiB input and a 0.1 MiB output gradient at
  batch 8), the rest of the backward runs beside a gradient nobody reads yet. Made at the end,
  it is only the input and output gradient that wait.

  So each backward op with one result, read only later, moves to just before its first reader
  (the graph's output, for a gradient) where its result's bytes are at least GAIN times the
  bytes it would keep alive longer: each storage it reads that no op at or after its new place
  reads (parameters, buffers and inputs are resident anyway and cost nothing). Then every
  moment between the old place and the new one holds (result - kept) bytes less, and the
  moment it runs holds the kept bytes more; so a move that raises the store-all step's peak
  (counted over the graph, each result alive from its node to its last reader) is undone: in
  BERT at batch 2 the step peaks at its end, where the moved gradients' inputs would wait.
  Ops moved before the same reader run the one keeping the most first. Ops are taken from the
  last to the first, so an op whose reader moved late can follow it. Random ops and
  multi-result ops stay in place; the views of a moved result move with it. The op computes
  what it did, from the same values: bitwise the same.

  Measured (docs/benchmarks/late_grads.md, simulated and measured alike): over the floor,
  VGG-16 b8 112² store-all 125.1 -> 0.2 MiB, least 73.5 -> 0.2; GPT-2 b1×256 store-all 148.0
  -> 26.1, least 148.0 -> 3.0; ResNet-50 b16 128² least 95.7 -> 88.1 (its 8 MiB classifier
  gradient); no bench model's peak rose.
"""
from __future__ import annotations

import operator

import numpy as np
import torch
import torch.fx as fx

from monet_opt import phase, recompute
from monet_opt.lower import can_add_into, is_view_node, storage_bytes

# A result moves only where its bytes are at least GAIN times those it keeps alive longer: the
# moment it then runs at holds those bytes more, and that moment may be a recomputing plan's
# peak where it is not the store-all plan's (NOTE [Results made late]).
GAIN = 2


def make_results_late(gm: fx.GraphModule) -> int:
    """NOTE [Results made late], in place; returns how many ops moved."""
    graph = gm.graph
    moved: dict[fx.Node, list[tuple[int, fx.Node]]] = {}  # reader -> (kept, op) moved before it
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    readers = {n: _readers(n) for n in nodes if _is_storage(n)}  # moves change no edges
    lives = _Lives(readers, nodes)
    peak = lives.store_all_peak(nodes)
    for node in reversed([n for n in nodes if _movable(n)]):
        first = min((order[r] for r in readers[node]), default=None)
        if first is None or first <= order[node] + 1:
            continue
        kept = _kept_bytes(node, first, order, readers)
        if storage_bytes(node.meta["val"]) < GAIN * max(kept, 1):
            continue
        group = moved.setdefault(nodes[first], [])  # in graph order, the most kept first
        at = next((i for i, (k, _) in enumerate(group) if k < kept), len(group))
        before = group[at][1] if at < len(group) else nodes[first]
        going = [(n, n.prev) for n in [node, *sorted(_views_of(node), key=order.get)]]
        for n, _ in going:
            before.prepend(n)
        nodes = list(graph.nodes)
        order = {n: i for i, n in enumerate(nodes)}
        new_peak = lives.store_all_peak(nodes)
        if new_peak > peak:
            for n, prev in going:
                prev.append(n)
            nodes = list(graph.nodes)
            order = {n: i for i, n in enumerate(nodes)}
            continue
        peak = new_peak
        group.insert(at, (kept, node))
    count = sum(len(g) for g in moved.values())
    if count:
        graph.lint()
        gm.recompile()
    return count


class _Lives:
    """Each storage's life but its place (moves change no edges, so this is worked out once), as
    arrays over the graph's nodes: a storage is alive from its node (an output gradient: from
    its first reader) to its last reader (one before it, where that reader adds into it)."""

    def __init__(self, readers: dict[fx.Node, list[fx.Node]], nodes: list[fx.Node]) -> None:
        self.ids = {n: k for k, n in enumerate(nodes)}
        self.node = np.array([self.ids[n] for n in readers], dtype=np.int64)
        self.bytes = np.array([storage_bytes(n.meta.get("val")) for n in readers],
                              dtype=np.int64)
        self.early = np.array([n.op == "placeholder" for n in readers], dtype=bool)
        self.adds = np.array([len(r) == 1 and _adds_into(r[0], n) for n, r in readers.items()],
                             dtype=np.int64)
        # the readers, flat: storage k's are read[first[k]:first[k] + count[k]]
        self.count = np.array([len(r) for r in readers.values()], dtype=np.int64)
        self.read = np.array([self.ids[r] for rs in readers.values() for r in rs],
                             dtype=np.int64)
        self.first = np.cumsum(self.count) - self.count

    def store_all_peak(self, nodes: list[fx.Node]) -> int:
        """The most bytes of op results and output gradients alive at once with nothing
        recomputed, in the order `nodes` (the graph's, as lowered)."""
        pos = np.empty(len(nodes), dtype=np.int64)
        pos[[self.ids[n] for n in nodes]] = np.arange(len(nodes))
        own = pos[self.node]
        start, end = own.copy(), own.copy()
        read = self.count > 0
        if self.read.size:
            at = pos[self.read]
            end[read] = np.maximum.reduceat(at, self.first[read])
            first_read = np.minimum.reduceat(at, self.first[read])
            early = read & self.early
            start[early] = first_read[early[read]]
        end = np.maximum(end - self.adds, start)
        delta = np.zeros(len(nodes) + 1, dtype=np.int64)
        np.add.at(delta, start, self.bytes)
        np.add.at(delta, end + 1, -self.bytes)
        return int(max(0, np.cumsum(delta).max(initial=0)))


def _adds_into(add: fx.Node, arg: fx.Node) -> bool:
    """Whether the executor runs `add` in place into `arg`, its only reader (NOTE [In-place
    accumulation] in solvers/problem.py, as lowering finds it)."""
    return phase.in_backward(add) and phase.in_backward(arg) and can_add_into(add, arg)


def _is_storage(node: fx.Node) -> bool:
    if node.op == "placeholder":
        return node.name.startswith("tangents")
    return node.op == "call_function" and not _is_view(node) and \
        isinstance(node.meta.get("val"), torch.Tensor)


def _movable(node: fx.Node) -> bool:
    """A backward op's own result (not one of a multi-result op's), drawn from no generator."""
    return _is_storage(node) and node.op == "call_function" \
        and node.target is not operator.getitem \
        and phase.in_backward(node) and not recompute.is_random(node)


def _views_of(node: fx.Node) -> list[fx.Node]:
    """The view nodes reading `node`'s storage, directly or through other views."""
    found: dict[fx.Node, None] = {}
    todo = [node]
    while todo:
        for user in todo.pop().users:
            if _is_view(user) and user not in found:
                found[user] = None
                todo.append(user)
    return list(found)


def _readers(node: fx.Node) -> list[fx.Node]:
    """The nodes that read `node`'s storage and are no views of it."""
    return [u for u in (node, *_views_of(node)) for u in u.users if not _is_view(u)]


def _is_view(node: fx.Node) -> bool:
    """A view of another node's storage (a getitem of a multi-result op is that result, as
    lowering has it)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return _is_view(node.args[0])
    return is_view_node(node)


def _kept_bytes(node: fx.Node, until: int, order: dict[fx.Node, int],
                readers: dict[fx.Node, list[fx.Node]]) -> int:
    """The bytes of the storages `node` reads that nothing at or after position `until` reads
    (they would be held to there): ops' results and output gradients, not resident tensors."""
    kept = 0
    for base in {_base(a) for a in recompute.tensor_args(node)}:
        if base not in readers:
            continue
        if all(order[r] < until for r in readers[base] if r is not node):
            kept += storage_bytes(base.meta.get("val"))
    return kept


def _base(node: fx.Node) -> fx.Node:
    """The node whose storage `node` views (a view of a Python number, as the backward of a
    product with `1j` conjugates it, is its own: complex ops probe, 2026-12-06)."""
    while _is_view(node) and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node
