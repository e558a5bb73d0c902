"""The profiler's pass kept within the memory limit.

NOTE [Profiling within the limit]
  The profiler runs the joint graph once, op by op, keeping each value to its last use: the
  memory of eager's step. But the batch a user brings to optimize() is often one whose eager
  step does not fit the device (that is why they came), and then the profiling pass ran out of
  memory before any plan existed. So where the limit is given in bytes, the pass keeps within
  it: before each op, while what it holds plus what the op will make would pass the limit, it
  drops the value read furthest ahead (whose storage nothing the op reads shares), and when a
  dropped value is read again it is made again from its inputs, those made again first where
  dropped too (in graph order; what is made so is held like anything else, and what was made
  only on the way is dropped once used). Only forward values that ops without side effects
  make from the graph's inputs and such values are dropped: never the inputs and parameters
  themselves, what an op with effects (with_effects) made, or what the output gradients flow
  into (making a gradient again would rerun the backward). A value whose only reader left is
  the graph's output (a parameter's gradient) is dropped as soon as it is made: the pass
  returns nothing. What the op will make counts its outputs once in the untimed pass, and in
  the timed pass twice (its value and a timed call's), three times where variants run beside
  it. Every op still runs in its place, on inputs of the same shapes, timed as before (an input
  made again just before is read warm, as the executor's recomputation reads it); what is
  made again runs untimed. A random op made again (dropout) draws anew: the pass runs under
  fork_rng, and a variant is compared with its op on the same inputs. Where nothing can be
  dropped the pass goes on over the limit (the graph's own order may need more than a plan,
  which reorders and uses variants). A limit given as a share of the step is not known before
  the step is profiled: such a pass is eager's. A limit below what the step's sizes alone
  show no plan can reach (NOTE [A least peak from sizes] in solvers/peak_bound.py) is raised
  to that bound for the pass (`pass_limit`): no plan will run below it, and held far below it
  the pass remakes nearly every value before every op (a small MobileNetV2, batch 2 at 64²
  on the CPU, asked for 1 byte: 328 s of profiling, where its pass takes 0.4 s).
  CPU ResNet-50 (b16, 128²; docs/benchmarks/profile_memory.md): eager's pass 579.9 MiB; with
  limits of 384.1, 320.9 and 272.6 MiB (half, a third and a fifth of the activations) it held
  383.9, 321.3 and 272.8 MiB, made 449-572 values again, and took 11.5-13.2 s against 8.4 s.
"""
from __future__ import annotations

import bisect
import operator
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from monet_opt import cudnn_bn
from monet_opt.lower import is_view_node
from monet_opt.memory import allocated_bytes
import solvers
from solvers.peak_bound import least_peak_bound


INF = float("inf")


def pass_limit(limit: int | None, problem: solvers.Problem) -> int | None:
    """What the profiling pass may hold for a step planned within `limit` bytes (None: no
    limit): the limit, or where it is below every schedule's peak as the traced sizes of
    `problem` bound it, that bound (NOTE [Profiling within the limit])."""
    return None if limit is None else max(limit, least_peak_bound(problem).bytes)


class BoundedEnv(dict):
    """The pass's values by node name, held within `limit` bytes (NOTE [Profiling within the
    limit]); `at(node)` before each call makes room for it."""

    def __init__(self, gm: fx.GraphModule, limit: int, keep_until: dict[str, str],
                 copies: Callable[[fx.Node], int] = lambda node: 1) -> None:
        """copies(node): how many times its outputs' bytes the pass may hold beside what it
        held before it (its timed calls and its variants' results beside its value)."""
        super().__init__()
        self.limit, self.copies = limit, copies
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
        self.now = 0
        self.made_again = 0
        self.peak = 0  # the most held after an op (its outputs made, its inputs not yet freed)
        self.over = 0  # ops before which nothing could be dropped to stay within the limit
        self.rough = 0  # every value's storages summed: at least what is held
        self._sizes: dict[str, int] = {}
        self._keep: set[str] = set()  # what the op to come reads

    def at(self, node: fx.Node) -> None:
        """Make room for `node`'s outputs, keeping what it reads."""
        self.now = self.order[node]
        self._keep = _reads(node)
        self._room(node, self._keep)

    def made(self, node: fx.Node) -> None:
        """After `node` ran: note what is held, its value with it; then drop that value where
        nothing but the output reads it."""
        self._held_now()
        if not self.uses.get(node.name) and node.op == "call_function" and _droppable(node):
            self.pop(node.name, None)  # a parameter's gradient too: the pass returns nothing

    def _held_now(self) -> None:
        """`peak`: the most held after an op, counted exactly where the rough sum passes the
        limit."""
        held = self.rough if self.rough <= self.limit else sum(
            b for b, _ in self._storages().values())
        self.peak = max(self.peak, held)

    def __missing__(self, name: str) -> Any:
        if not self._can_drop(name):
            raise KeyError(name)
        made = self._missing_chain(self.nodes[name])
        for k, n in enumerate(made):
            self._room(n, set().union(self._keep, *map(_reads, made[k:])))
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
        size = _held_bytes(value)
        self.rough += size - self._sizes.pop(name, 0)
        self._sizes[name] = size
        super().__setitem__(name, value)

    def pop(self, name: str, default: Any = None) -> Any:
        """Graph inputs and attributes stay: what is made again may read them."""
        node = self.nodes.get(name)
        if node is not None and node.op in ("placeholder", "get_attr"):
            return default
        self.rough -= self._sizes.pop(name, 0)
        return super().pop(name, default)

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

    def _room(self, node: fx.Node, keep: set[str]) -> None:
        coming = _coming_bytes(node) * self.copies(node)
        if self.rough + coming <= self.limit:  # no need to count storages once
            return
        held = self._storages()
        while sum(b for b, _ in held.values()) + coming > self.limit:
            victim = self._victim(held, keep)
            if victim is None:
                self.over += 1
                break
            for name in held.pop(victim)[1]:
                self.pop(name, None)

    def _storages(self) -> dict[int, tuple[int, list[str]]]:
        """{storage: (its bytes, the names holding it)} of every tensor held."""
        held: dict[int, tuple[int, list[str]]] = {}
        for name, value in self.items():
            for t in pytree.tree_leaves(value):
                if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                    s = t.untyped_storage()
                    b, names = held.setdefault(s.data_ptr(), (
                        allocated_bytes(s.nbytes(), t.device), []))
                    names.append(name)
        return held

    def _victim(self, held: dict[int, tuple[int, list[str]]], keep: set[str]) -> int | None:
        """The storage read furthest ahead (then the largest) that only droppable, unkept
        values hold."""
        best, best_key = None, None
        for ptr, (nbytes, names) in held.items():
            if nbytes == 0 or any(n in keep or not self._can_drop(n) for n in names):
                continue
            key = (min(self._next_use(n) for n in names), nbytes)
            if best_key is None or key > best_key:
                best, best_key = ptr, key
        return best

    def _can_drop(self, name: str) -> bool:
        return name in self.remakeable

    def _next_use(self, name: str) -> float:
        positions = self.uses.get(name, ())
        k = bisect.bisect_right(positions, self.now)
        return positions[k] if k < len(positions) else INF


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


def _held_bytes(value: Any) -> int:
    return sum(allocated_bytes(t.untyped_storage().nbytes(), t.device)
               for t in pytree.tree_leaves(value)
               if isinstance(t, torch.Tensor) and t.layout == torch.strided)


def _coming_bytes(node: fx.Node) -> int:
    """What `node`'s outputs will hold (its traced value's shapes; 0 for a view)."""
    if is_view_node(node) or node.target is operator.getitem:
        return 0
    return sum(allocated_bytes(t.numel() * t.element_size(), t.device)
               for t in pytree.tree_leaves(node.meta.get("val")) if isinstance(t, torch.Tensor))
