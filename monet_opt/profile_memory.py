"""The profiler's pass kept within the memory limit.

NOTE [Profiling within the limit]
  The profiler runs the joint graph once, op by op, keeping each value to its last use: the
  memory of eager's step. But the batch a user brings to optimize() is often one whose eager
  step does not fit the device (that is why they came), and then the profiling pass ran out of
  memory before any plan existed. So where the limit is given in bytes, the pass keeps within
  it: before each op, while what it holds plus what the op will make would pass the limit, it
  drops a value (whose storage nothing the op reads shares), and when a dropped value is read
  again it is made again from its inputs, those made again first where dropped too (in graph
  order, keeping room for what the op to come will make; what is made so is held like
  anything else, and what was made only on the way is dropped once used). The value dropped
  is the one read furthest ahead, but boundaries go last: a boundary is a forward value that,
  once made, is the only one later forward ops read of those made before it from the graph's
  inputs (a transformer's residual stream between blocks, a ResNet's between bottlenecks; a
  constant such as a causal mask is made from no input), so the forward can be made again
  from it onwards. Of boundaries, the one whose held neighbours are closest goes first: those
  held stay spread along the forward, and making a value again runs back to the nearest.
  Dropped by the furthest read alone, the forward of a transformer dropped its first blocks,
  boundaries too, and the backward made each block again from the start (quadratic in
  blocks; figures below). Only forward values that ops without side effects make from the
  graph's inputs and such values are dropped: never the inputs and parameters themselves,
  what an op with effects (with_effects) made, or what the output gradients flow into
  (making a gradient again would rerun the backward). A value whose only reader left is
  the graph's output (a parameter's gradient) is dropped as soon as it is made: the pass
  returns nothing. What the op will make counts its outputs once, twice where its
  recomputation is timed beside its value (a split BatchNorm's), three times where variants
  run beside it, four where one draws its op's forward again (a dropout's mask from its
  generator state), and its scratch (NOTE [An op's scratch in the bounded pass]); the limit
  is less the generator states held beside the pass (NOTE [Generator states beside the pass]
  in monet_opt/profiler.py), the buffers it runs on clones of (NOTE [Originals beside the
  pass] in monet_opt/memory.py) and the gradients in place of a step planned with them (the
  pass of an accumulation's second micro-batch measured 26,992 B over a CNN's limit,
  2026-12-06). Every op still runs in its place, on inputs of the same shapes, timed as
  before (an input
  made again just before is read warm, as the executor's recomputation reads it); what is
  made again runs untimed. A random op made again (dropout) draws anew: the pass runs under
  fork_rng, and a variant is compared with its op on the same inputs. Where nothing can be
  dropped the pass goes on over the limit (the graph's own order may need more than a plan,
  which reorders and uses variants): a LoRA MLP 12 % over, near its least peak; a
  two-convolution net asked for its store-all peak 29 % over, a ReLU backward's result, its
  bool-mask variant's and the mask held beside its inputs (probes, 2026-12-06). A limit given
  as a share of the step is not known before the step is profiled: such a pass is eager's. A
  limit below what the step's sizes alone show no plan can reach (NOTE [A least peak from
  sizes] in solvers/peak_bound.py) is raised
  to that bound for the pass (`pass_limit`): no plan will run below it, and held far below it
  the pass remakes nearly every value before every op (a small MobileNetV2, batch 2 at 64²
  on the CPU, asked for 1 byte: 328 s of profiling, where its pass takes 0.4 s).
  CPU, docs/benchmarks/profile_memory.md (profiling s, made again; before boundaries and the
  room kept -> now): GPT-2 narrow b12 (eager's pass 7.8 s) at 10 % of its activations 31.4 s,
  6130 -> 11.9 s, 2460, at 5 % 65.1 s, 12788 -> 35.7 s, 13416 (the pass held 151.4 MiB under
  144.3: making a value again took the room of the op to come; now 144.2); ResNet-50 b16,
  128² (eager's 5.5-5.8 s) at half, a third and a fifth of its activations 7.4-9.7 s,
  449-572 -> 5.8-6.5 s, 90-277.

NOTE [An op's scratch in the bounded pass]
  The room made before an op counted its outputs, not what it takes while it runs: oneDNN's
  convolution on the CPU reorders its input into scratch as large (2.1 MB beside a 2 MB
  output), its backward takes 4.2 MB, and cuDNN's algorithms take workspace. And the timed
  pass held each new signature's value from its first run while its timed calls made their
  outputs beside it. So optimize() of a small CNN without BatchNorm at 60 % of its eager
  step peaked 207,719 B over the limit (13,078,568 B against 12,870,849), where its plan
  measured 11,012,056. Now the room counts each op's scratch (`Scratch`): the untimed pass
  takes it at the first run of each op on inputs of its traced shapes, strides and dtypes
  (one allocation-events window each, about 0.5 ms, NOTE [Allocation events]; on a GPU at a
  second run, after cuDNN's benchmark search, not tried on a GPU yet), guessing it
  there at the bytes of the op's inputs and outputs, and the timed pass knows it for every
  op. And the timed pass makes a new signature's value last, by the run that takes its
  workspace, so one copy of its outputs is held at a time. The same optimize() now peaks at
  11,634,617 B (tests/test_profile_memory.py). A kernel whose first scratch passes the
  guess (an im2col convolution's columns) still passes the limit once.
"""
from __future__ import annotations

import bisect
import operator
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from monet_opt import cudnn_bn, phase
from monet_opt.lower import is_view_node
from monet_opt.memory import allocated_bytes, counted
import solvers
from solvers.peak_bound import least_peak_bound


INF = float("inf")


def pass_limit(limit: int | None, problem: solvers.Problem) -> int | None:
    """What the profiling pass may hold for a step planned within `limit` bytes (None: no
    limit): the limit, or where it is below every schedule's peak as the traced sizes of
    `problem` bound it, that bound (NOTE [Profiling within the limit])."""
    return None if limit is None else max(limit, least_peak_bound(problem).bytes)


class Scratch:
    """What each op takes while it runs beyond its outputs (its workspace: oneDNN's reorders,
    cuDNN's scratch), by the op and its inputs' traced shapes, strides and dtypes: measured at
    the first run of each in the bounded pass, and until then guessed at its inputs' and
    outputs' bytes (NOTE [An op's scratch in the bounded pass])."""

    def __init__(self) -> None:
        self.known: dict[tuple, int] = {}

    def of(self, node: fx.Node) -> int:
        """The room `node` takes while it runs beside its outputs."""
        known = self.known.get(_key(node))
        if known is not None:
            return known
        if is_view_node(node) or node.target is operator.getitem:
            return 0
        return _coming_bytes(node) + sum(_coming_bytes(a) for a in node.all_input_nodes)

    def run(self, node: fx.Node, call: Callable[[], Any], inputs: Any, cuda: bool) -> Any:
        """call(), `node`'s op on `inputs`, its scratch measured where not known yet (on a GPU
        at a second call: cuDNN's benchmark search, at the first, tries every algorithm's
        workspace; NOTE [Workspace] in monet_opt/memory.py)."""
        key = _key(node)
        if key in self.known:
            return call()
        if cuda:
            call()
        out, self.known[key] = counted(call, cuda, inputs)
        return out


class BoundedEnv(dict):
    """The pass's values by node name, held within `limit` bytes (NOTE [Profiling within the
    limit]); `at(node)` before each call makes room for it."""

    def __init__(self, gm: fx.GraphModule, limit: int, keep_until: dict[str, str],
                 copies: Callable[[fx.Node], int] = lambda node: 1,
                 scratch: Scratch | None = None) -> None:
        """copies(node): how many times its outputs' bytes the pass may hold beside what it
        held before it (its timed calls and its variants' results beside its value).
        scratch: what each op takes while it runs, as the passes learn it."""
        super().__init__()
        self.limit, self.copies = limit, copies
        self.scratch = scratch if scratch is not None else Scratch()
        self.nodes = {n.name: n for n in gm.graph.nodes}
        order = {n: k for k, n in enumerate(gm.graph.nodes)}
        self.uses: dict[str, list[int]] = {}
        for node in gm.graph.nodes:
            if node.op == "output":
                continue
            fx.node.map_arg((node.args, node.kwargs),
                            lambda a: self.uses.setdefault(a.name, []).append(order[node]))
        for name, until in keep_until.items():
            self.uses.setdefault(name, []).append(order[self.nodes[until]])
        for positions in self.uses.values():
            positions.sort()
        self.order = order
        # what can be made again: forward values of ops without side effects whose inputs are
        # the graph's inputs or can be made again themselves (not what the output gradients
        # flow into: making a gradient again would rerun the backward)
        self.remakeable: set[str] = set()
        for node in gm.graph.nodes:
            if node.op == "call_function" and _droppable(node) and all(
                    a.name in self.remakeable or (a.op in ("placeholder", "get_attr") and
                                                  not a.name.startswith("tangents"))
                    for a in node.all_input_nodes):
                self.remakeable.add(node.name)
        self.boundaries = _boundaries(gm, self.remakeable, order)
        self.now = 0
        self.made_again = 0
        self.peak = 0  # the most held after an op (its outputs made, its inputs not yet freed)
        self.over = 0  # ops before which nothing could be dropped to stay within the limit
        self.held = 0  # the bytes of every storage held, each counted once
        self._storages: dict[int, tuple[int, set[str]]] = {}  # storage: (bytes, names holding)
        self._holds: dict[str, tuple[int, ...]] = {}  # name: the storages its value holds
        self._keep: set[str] = set()  # what the op to come reads
        self._coming = 0  # what the op to come will make

    def at(self, node: fx.Node) -> None:
        """Make room for `node`'s outputs, keeping what it reads."""
        self.now = self.order[node]
        self._keep = _reads(node)
        self._coming = _coming_bytes(node) * self.copies(node) + self.scratch.of(node)
        self._room(self._coming, self._keep)

    def made(self, node: fx.Node) -> None:
        """After `node` ran: note what is held, its value with it; then drop that value where
        nothing but the output reads it."""
        self._held_now()
        self._coming = 0
        if not self.uses.get(node.name) and node.op == "call_function" and _droppable(node):
            self.pop(node.name, None)  # a parameter's gradient too: the pass returns nothing

    def _held_now(self) -> None:
        self.peak = max(self.peak, self.held)

    def __missing__(self, name: str) -> Any:
        if not self._can_drop(name):
            raise KeyError(name)
        made = self._missing_chain(self.nodes[name])
        keeps = [self._keep]  # what the chain's ops from each on read, with the op to come's
        for n in reversed(made):
            keeps.append(keeps[-1] | _reads(n))
        for n, keep in zip(made, reversed(keeps)):
            # room kept for the op to come
            self._room(_coming_bytes(n) + self.scratch.of(n) + self._coming, keep)
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda a: dict.__getitem__(
                self, a.name))
            self[n.name] = cudnn_bn.kernel(n)(*args, **kwargs)
            self.made_again += 1
            self._held_now()
        value = dict.__getitem__(self, name)
        for n in made:  # what was made only to make `name` again
            if n.name != name and n.name not in self._keep and self._next_use(n.name) == INF:
                self.pop(n.name, None)
        return value

    def __setitem__(self, name: str, value: Any) -> None:
        self._forget(name)
        holds = {}
        for t in pytree.tree_leaves(value):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and \
                    not t._is_zerotensor():  # a zero tensor (_efficientzerotensor) holds none
                s = t.untyped_storage()
                entry = self._storages.get(s.data_ptr())
                if entry is None:
                    entry = self._storages[s.data_ptr()] = (
                        allocated_bytes(s.nbytes(), t.device), set())
                    self.held += entry[0]
                entry[1].add(name)
                holds[s.data_ptr()] = None
        self._holds[name] = tuple(holds)
        super().__setitem__(name, value)

    def pop(self, name: str, default: Any = None) -> Any:
        """Graph inputs and attributes stay: what is made again may read them; output
        gradients, which nothing made again reads, go (NOTE [Output gradients to their last
        use] in monet_opt/profile_walk.py)."""
        node = self.nodes.get(name)
        if node is not None and node.op in ("placeholder", "get_attr") and \
                not name.startswith("tangents"):
            return default
        self._forget(name)
        return super().pop(name, default)

    def _forget(self, name: str) -> None:
        """Stop counting what `name` holds (a storage no other name holds is no longer held:
        while one is held, no other storage can start at its address)."""
        for ptr in self._holds.pop(name, ()):
            nbytes, names = self._storages[ptr]
            names.discard(name)
            if not names:
                del self._storages[ptr]
                self.held -= nbytes

    def _missing_chain(self, node: fx.Node) -> list[fx.Node]:
        """`node` and every dropped value it needs, in graph order."""
        chain, stack = {}, [node]
        while stack:
            n = stack.pop()
            if n.name in chain or dict.__contains__(self, n.name):
                continue
            if not self._can_drop(n.name):
                raise KeyError(n.name)  # an input, a gradient, what effects made: kept
            chain[n.name] = n
            stack.extend(n.all_input_nodes)
        return sorted(chain.values(), key=self.order.__getitem__)

    def _room(self, coming: int, keep: set[str]) -> None:
        """Drop values until `coming` more bytes stay within the limit, keeping `keep`."""
        while self.held + coming > self.limit:
            victim = self._victim(keep)
            if victim is None:
                self.over += 1
                break
            for name in list(self._storages[victim][1]):
                self.pop(name, None)

    def _victim(self, keep: set[str]) -> int | None:
        """Of the storages only droppable, unkept values hold, the one read furthest ahead
        (then the largest); a boundary's only where no other is, the one whose held neighbours
        are closest (NOTE [Profiling within the limit])."""
        best, best_key, spans = None, None, None
        for ptr, (nbytes, names) in self._storages.items():
            if nbytes == 0 or any(n in keep or not self._can_drop(n) for n in names):
                continue
            at = [self.boundaries[n] for n in names if n in self.boundaries]
            if at and best_key is not None and best_key[0]:
                continue
            if at and spans is None:
                spans = self._spans()
            key = (not at, -max(spans[p] for p in at) if at else 0,
                   min(self._next_use(n) for n in names), nbytes)
            if best_key is None or key > best_key:
                best, best_key = ptr, key
        return best

    def _spans(self) -> dict[int, float]:
        """{held boundary's position: from the held boundary before it to the one after}."""
        held = sorted(p for n, p in self.boundaries.items() if dict.__contains__(self, n))
        return {p: (held[k + 1] if k + 1 < len(held) else INF) - (held[k - 1] if k else -1)
                for k, p in enumerate(held)}

    def _can_drop(self, name: str) -> bool:
        return name in self.remakeable

    def _next_use(self, name: str) -> float:
        positions = self.uses.get(name, ())
        k = bisect.bisect_right(positions, self.now)
        return positions[k] if k < len(positions) else INF


def _boundaries(gm: fx.GraphModule, remakeable: set[str], order: dict[fx.Node, int]
                ) -> dict[str, int]:
    """{name: position} of the forward values each of which, once made, is the only value
    that forward ops after it read of those made before it from the graph's inputs (a
    transformer's residual stream between its blocks; a constant such as its causal mask is
    made from no input): all that is needed to make the forward's rest again."""
    constant: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" or node.op == "call_function" and all(
                a.name in constant for a in node.all_input_nodes):
            constant.add(node.name)
    forward = [n for n in gm.graph.nodes if n.name in remakeable  # as lowering tells them
               and not phase.in_backward(n)]
    last: dict[str, int] = {}
    for node in forward:
        for a in node.all_input_nodes:
            if a.name in remakeable and a.name not in constant:
                last[a.name] = order[node]
    ends: dict[int, list[str]] = {}
    for name, k in last.items():
        ends.setdefault(k, []).append(name)
    crossing: set[str] = set()
    found = {}
    for node in forward:
        crossing.difference_update(ends.get(order[node], ()))
        if last.get(node.name, -1) > order[node]:
            crossing.add(node.name)
            if len(crossing) == 1:
                found[node.name] = order[node]
    return found


def _key(node: fx.Node) -> tuple:
    """`node`'s op with its arguments, each node as its traced value's shapes, strides and
    dtypes."""
    def describe(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return (str(a.dtype), tuple(a.shape), tuple(a.stride()))
        return a if a is None or isinstance(a, (bool, int, float, str)) else repr(a)
    traced = fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta.get("val"))
    return (str(node.target), repr(pytree.tree_map(describe, traced)))


def _reads(node: fx.Node) -> set[str]:
    return {a.name for a in node.all_input_nodes}


def _droppable(node: fx.Node) -> bool:
    """Made again by running it: an op without side effects (no mutated argument, no
    higher-order op such as with_effects)."""
    target = node.target
    if isinstance(target, torch._ops.HigherOrderOperator):
        return False
    schema = getattr(target, "_schema", None)
    return schema is None or not schema.is_mutable


def _coming_bytes(node: fx.Node) -> int:
    """What `node`'s outputs will hold (its traced value's shapes; 0 for a view)."""
    if is_view_node(node) or node.target is operator.getitem:
        return 0
    return sum(allocated_bytes(t.numel() * t.element_size(), t.device)
               for t in pytree.tree_leaves(node.meta.get("val")) if isinstance(t, torch.Tensor))
