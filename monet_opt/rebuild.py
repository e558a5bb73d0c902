"""The joint graph rebuilt so that its order is the schedule's (monet_opt/rewrite.py says how
the result is cut into the forward and backward graphs)."""
from __future__ import annotations

import copy
import operator

import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _make_graph_module

from monet_opt import grad_in_place, recompute, updated_buffers, variants
from monet_opt.errors import internal_assert
from monet_opt.lower import Lowered
from monet_opt.phase import BACKWARD, FORWARD, TAG, mark_backward
from solvers import Schedule, simulate
from solvers.simulate import captured as captured_ops

_ADD_INPLACE = torch.ops.aten.add_.Tensor
OVERWRITES = "monet_overwrites"  # node meta: (phase, the argument it writes into)


def rebuild_joint(joint: fx.GraphModule, lowered: Lowered, schedule: Schedule,
                  num_fwd_outputs: int, made: frozenset[int] = frozenset()) -> fx.GraphModule:
    nodes = {n.name: n for n in joint.graph.nodes}
    problem = lowered.problem
    overwrites = dict(simulate(problem, schedule).overwrites)
    e = _Emitter(nodes, lowered)
    recomputed = {i for i in schedule.backward if not problem.ops[i].is_backward}
    reread = {i for i in recomputed if problem.ops[i].outputs and  # NOTE [Held tensors made
              set(problem.ops[i].outputs) <= made}  # again] in monet_opt/held_outputs.py
    recomputed -= reread  # read from the forward, not run again
    # NOTEs [The step's generator states], [States kept only where used], [A replay's state]
    captured = {lowered.op_nodes[i] for i in captured_ops(problem, schedule, made)}
    chosen = [lowered.variant_sites[v] for v in schedule.variants]
    encodes = {site.encode_op: site for site in chosen if site.encode_op is not None}
    runs: dict[str, list] = {}  # backward node -> its chosen variants (NOTE [Combining variants])
    for site in chosen:
        runs.setdefault(site.backward_node, []).append(site)
    for n in joint.graph.nodes:
        if n.op in ("placeholder", "get_attr"):
            e.bind(n, e.g.node_copy(n))
    for name in lowered.snapshots:  # NOTE [Buffers the step updates]
        e.snapshots[name] = e.emit_clone(nodes[name])
        e.snapshots[name].meta[updated_buffers.MADE] = name  # NOTE [Copies nothing reads]
    e.make_states([n for n in recompute.random_forward_ops(joint, lowered) if n.name in captured])
    for k, i in enumerate(problem.forward_ops):
        if i in encodes:
            e.emit_encode(encodes[i], lowered.op_nodes[i])
        elif lowered.op_nodes[i] in nodes:  # not an unchosen variant's encode op
            node = nodes[lowered.op_nodes[i]]
            e.emit(node, capture_slot=node.name in captured, overwrite=overwrites.get(k))
    output = next(iter(joint.graph.find_nodes(op="output")))
    outs = list(output.args[0])
    fwd_values = [e.value(a) if isinstance(a, fx.Node) else a for a in outs[:num_fwd_outputs]]
    forward = dict(e.current)
    e.enter_backward(schedule)
    steps = [(k, i) for k, i in enumerate(schedule.backward, start=len(problem.forward_ops))
             if i in encodes or lowered.op_nodes[i] in nodes]  # not an unchosen variant's
    whole = e.whole_reruns(steps, encodes, reread)  # encode op (it makes nothing one reads)
    for k, i in steps:
        if i in encodes:
            e.emit_encode(encodes[i], lowered.op_nodes[i])
            continue
        node = nodes[lowered.op_nodes[i]]
        if i in reread:
            e.reread(node, forward)
            continue
        e.emit(node, rerun=not problem.ops[i].is_backward, variant=runs.get(node.name),
               overwrite=overwrites.get(k), whole=k in whole)
    bwd_values = [e.value(a) if isinstance(a, fx.Node) else a for a in outs[num_fwd_outputs:]]
    e.release_states()
    new_out = e.g.output(tuple(fwd_values + bwd_values))
    new_out.meta = copy.copy(output.meta)
    e.g.lint()
    return _make_graph_module(joint, e.g)  # NOTE [Tracing without the collector]


class _Emitter:
    """Copies nodes into a new graph, tracking which copy of each value is current."""

    def __init__(self, nodes: dict[str, fx.Node], lowered: Lowered) -> None:
        self.g = fx.Graph()
        self.nodes = nodes
        self.lowered = lowered
        self.current: dict[str, fx.Node] = {}   # old value name -> its readable copy
        self.views: dict[str, fx.Node] = {}     # old view name -> copy made in this phase
        self.slots: dict[str, fx.Node] = {}  # NOTE [The step's generator states]
        self.slot_state: dict[str, fx.Node] = {}  # old random op -> its slot, captured
        self.tag = FORWARD
        self.inplace = dict(lowered.inplace)
        self.getitems: dict[str, list[fx.Node]] = {}
        self.snapshots: dict[str, fx.Node] = {}  # NOTE [Buffers the step updates]
        for n in nodes.values():
            if n.op == "call_function" and n.target is operator.getitem \
                    and n.name not in lowered.view_nodes:
                self.getitems.setdefault(n.args[0].name, []).append(n)

    def bind(self, old: fx.Node, new: fx.Node) -> None:
        self.current[old.name] = new

    def value(self, old: fx.Node) -> fx.Node:
        if old.name in self.current:
            return self.current[old.name]
        if old.name in self.views:
            return self.views[old.name]
        internal_assert(old.name in self.lowered.view_nodes,
                        f"{old.name} is read where the schedule has no copy of it")
        new = self._copy(old, old.args, old.kwargs)
        self.views[old.name] = new
        return new

    def _read(self, node: fx.Node) -> fx.Node:
        """An arg of a node being emitted: a node of the new graph as is, an old one mapped."""
        return node if node.graph is self.g else self.value(node)

    def _copy(self, old: fx.Node, args, kwargs, target=None) -> fx.Node:
        new = self.g.call_function(target or old.target, fx.node.map_arg(args, self._read),
                                   fx.node.map_arg(kwargs, self._read))
        new.meta = copy.copy(old.meta)
        new.meta[TAG] = self.tag
        return new

    def emit_clone(self, old: fx.Node) -> fx.Node:
        """A copy of `old`'s value as it is now."""
        return self._copy(old, (old,), {}, target=torch.ops.aten.clone.default)

    def emit_encode(self, site, name: str) -> None:
        """A chosen variant's encode op: the smaller form of the argument it replaces (for a
        replaying family, the slot its producer's state was captured into before it ran: NOTE
        [A replay's state] in monet_opt/recompute.py)."""
        arg = self.nodes[site.backward_node].args[site.arg]
        if variants.family(site.family).draw is not None:
            self.current[name] = self.slot_state[_producer(arg)]
            return
        new = self.g.call_function(variants.encode, (site.family, self._read(arg), *site.params))
        val = arg.meta["val"]
        with val.fake_mode:
            new.meta["val"] = variants.family(site.family).encode(val, *site.params)
        new.meta[TAG] = self.tag
        self.current[name] = new

    def make_states(self, random_ops: list[fx.Node]) -> None:
        """NOTE [The step's generator states]: a slot for each random op's, made first."""
        for op in random_ops:
            self.slots[op.name] = self._state_node(recompute.new_state, None, op)
            self.slots[op.name].meta[recompute.SLOT_OF] = op.name

    def release_states(self) -> None:
        if self.slots:
            held = [self.slot_state.get(name, slot) for name, slot in self.slots.items()]
            mark_backward(self.g.call_function(recompute.release_states, tuple(held)))

    def _state_node(self, target, args, op: fx.Node) -> fx.Node:
        """A forward node making a generator state of random op `op`'s device (host memory;
        its value faked as `op`'s are); args None: the state's bytes."""
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            nbytes = recompute.rng_state_nbytes(recompute.device_of(op))
        node = self.g.call_function(target, (nbytes,) if args is None else args)
        with recompute.first_tensor(op).fake_mode:
            node.meta["val"] = torch.empty(nbytes, dtype=torch.uint8)
        node.meta[TAG] = FORWARD
        return node

    def emit(self, old: fx.Node, rerun: bool = False,
             capture_slot: bool = False, variant: list | None = None,
             overwrite: int | None = None, whole: bool = False) -> None:
        """Run `old` here: its op node and the getitems of its outputs. With chosen variants
        (sites), the library's replacement runs on their encoded arguments instead. overwrite:
        the tensor the simulator has it write into (NOTE [Writing into a dying input]).
        capture_slot: copy the generator state before it into the op's slot, for its
        recomputation or a replaying variant (NOTEs [The step's generator states], [A replay's
        state] in monet_opt/recompute.py). whole: a recomputed training BatchNorm as the
        forward ran it (NOTE [Recomputing BatchNorm] 4 there)."""
        n_keep = None
        if capture_slot:
            self._capture_slot(old)
        if variant:
            args, kwargs = recompute.effective_args(old)
            enc = {site.arg: _stand_in(site, self) for site in variant}
            args = tuple(enc.get(k, a) for k, a in enumerate(args))
            names = tuple(site.family for site in variant)
            params = tuple(site.params for site in variant)
            into = old.name in self.inplace and variants.writes_into(names)  # NOTE [A ReLU's
            new = self._copy(old, (names, params, *args), kwargs,  # mask and its gradient ...]
                             target=variants.run_into if into else variants.run)
        elif rerun:
            target, args, kwargs, n_keep = recompute.recompute_form(old, whole)
            if recompute.is_random(old):
                device = str(recompute.first_tensor(old).device)
                op_name = recompute.op_qualname(target)
                args, target = (self.slot_state[old.name], device, op_name, *args), \
                    recompute.rng_replay
                if kwargs.get("generator") is not None:  # NOTE [Generators given to ops]
                    kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
                    target = recompute.rng_replay_given
            new = self._copy(old, args, kwargs, target=target)
            if n_keep is not None:
                new.meta["val"] = tuple(old.meta["val"][:n_keep])
            self.views.clear()  # views of the old copies must be re-made from the new ones
        elif old.target in grad_in_place.TARGETS and old.name in self.inplace:
            # NOTEs [BatchNorm's gradient in place], [Elementwise backward ops in place]
            args, kwargs = recompute.effective_args(old)
            new = self._copy(old, args, kwargs,
                             target=grad_in_place.into(old.target, self.inplace[old.name]))
        elif old.name in self.inplace:
            # NOTE [In-place accumulation]: a + b as b += a (IEEE addition commutes bitwise)
            k = self.inplace[old.name]
            new = self._copy(old, (old.args[k], old.args[1 - k]), {}, target=_ADD_INPLACE)
        else:  # the forward runs each op as traced (a split BatchNorm's pass-through reads
            # the training op's output: NOTE [BatchNorm recomputed from its statistics])
            args, kwargs = (old.args, old.kwargs) if self.tag == FORWARD else \
                recompute.effective_args(old)
            new = self._copy(old, args, kwargs)
        if overwrite is not None:
            held = self.lowered.tensor_nodes[overwrite]
            k = next((k for k, a in enumerate(old.args)
                      if isinstance(a, fx.Node) and a.name == held), None)
            internal_assert(k is not None and new.target is old.target and not variant,
                            f"{old.name} was to write into {held}, which it does not read")
            new.meta[OVERWRITES] = (self.tag, k)
        self.current[old.name] = new
        for gi in self.getitems.get(old.name, []):
            if n_keep is not None and gi.args[1] >= n_keep:
                self.current.pop(gi.name, None)
                continue
            self.current[gi.name] = self._copy(gi, (old, gi.args[1]), {})

    def whole_reruns(self, steps: list[tuple[int, int]], encodes: dict,
                     reread: set[int]) -> set[int]:
        """The positions of the backward's (position, op) `steps` that recompute a training
        BatchNorm whose new running statistics a later step reads (NOTE [Recomputing BatchNorm]
        4 in monet_opt/recompute.py): a scan from the end, reads taken through the views the
        step makes again from what they view."""
        read: set[str] = set()  # what later steps read from earlier ones
        whole: set[int] = set()
        for k, i in reversed(steps):
            name = self.lowered.op_nodes[i]
            if i in encodes:
                site = encodes[i]
                made = {name}
                reads = () if variants.family(site.family).draw is not None else \
                    self.nodes[site.backward_node].args[site.arg]
            else:
                node = self.nodes[name]
                made = {name, *(gi.name for gi in self.getitems.get(name, []))}
                rerun = not self.lowered.problem.ops[i].is_backward
                if rerun and {gi.name for gi in recompute.new_stats(node)} & read:
                    whole.add(k)
                reads = () if i in reread else recompute.recompute_form(node, k in whole)[1:3] \
                    if rerun else recompute.effective_args(node)
            read -= made
            read |= self._through_views(reads)
        return whole

    def _through_views(self, args) -> set[str]:
        """The names of the nodes `args` read, a view's being what it views."""
        found: set[str] = set()
        stack: list[fx.Node] = []
        fx.node.map_arg(args, stack.append)
        while stack:
            node = stack.pop()
            if node.name in self.lowered.view_nodes:
                fx.node.map_arg((node.args, node.kwargs), stack.append)
            else:
                found.add(node.name)
        return found

    def reread(self, old: fx.Node, forward: dict[str, fx.Node]) -> None:
        """`old`'s outputs, recomputed, read from their copies in the forward (`forward`)."""
        for name in (old.name, *(gi.name for gi in self.getitems.get(old.name, []))):
            self.current[name] = forward[name]
        self.views.clear()

    def _capture_slot(self, old: fx.Node) -> None:
        given = old.kwargs.get("generator")  # NOTE [Generators given to ops]
        args = (self.slots[old.name], recompute.device_of(old))
        self.slot_state[old.name] = self._state_node(
            recompute.capture_state, args if given is None else (*args, self.value(given)), old)

    def enter_backward(self, schedule: Schedule) -> None:
        """Only kept forward values (and resident ones) survive into the backward, where a
        buffer the step updates is read as the copy made of it first (NOTE [Buffers the step
        updates] in monet_opt/updated_buffers.py)."""
        problem, lowered = self.lowered.problem, self.lowered
        keep = {lowered.tensor_nodes[t] for t in schedule.kept}
        forward_values = {lowered.op_nodes[i] for i in problem.forward_ops}
        forward_values |= {lowered.tensor_nodes[t] for t in problem.forward_tensors}
        for name in list(self.current):
            if name in forward_values and name not in keep:
                del self.current[name]
        self.views.clear()
        self.current.update(self.snapshots)
        self.tag = BACKWARD


def _stand_in(site, e: _Emitter):
    """What a chosen variant's op reads in the replaced argument's place: its encoded form, the
    forward node the family reads instead, or (keeping nothing) its (shape, dtype, device)."""
    if site.encode_op is not None:
        return e.current[e.lowered.op_nodes[site.encode_op]]
    if site.reads is not None:
        return e.nodes[site.reads]
    return site.like


def _producer(arg: fx.Node) -> str:
    """The op node whose output `arg` (a getitem of it) is."""
    internal_assert(arg.target is operator.getitem, f"{arg.name} is not an op's output")
    return arg.args[0].name
