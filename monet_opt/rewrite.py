"""Turn a Schedule into the forward and backward graphs AOTAutograd runs.

The joint graph is rebuilt so that its order *is* the schedule: every forward op once (in its
original order), then the backward phase as the schedule lists it, with a fresh copy of each
recomputed forward op (tagged backward). torch's own `default_partition` then cuts it: forward
values read by backward-tagged nodes become the saved tensors, and these are exactly the
schedule's kept tensors (plus parameters, which are resident anyway). FX frees every value after
its last use, and the boxed calling convention lets the backward free saved tensors as it goes,
so values live exactly as long as the simulator says (NOTE [Lifetimes] in solvers/simulate.py).
"""
from __future__ import annotations

import copy
import operator

import torch
import torch.fx as fx
from functorch.compile import default_partition
from torch.fx._lazy_graph_module import _make_graph_module

from monet_opt import (absent_grads, cudnn_bn, direct_calls, grad_in_place, handed_grads,
                       recompute, stats_in_place, updated_buffers, variants)
from monet_opt.accumulate import GradientSlots, add_accumulation
from monet_opt.errors import internal_assert
from monet_opt.lower import OVERWRITING, Lowered
from monet_opt.phase import BACKWARD, FORWARD, TAG, in_backward, mark_backward
from solvers import Schedule, simulate

_ADD_INPLACE = torch.ops.aten.add_.Tensor
_OVERWRITES = "monet_overwrites"  # node meta: (phase, the argument it writes into)


def partition(joint: fx.GraphModule, joint_inputs, lowered: Lowered, schedule: Schedule,
              num_fwd_outputs: int, slots: GradientSlots | None = None,
              made: frozenset[int] = frozenset(), **kwargs):
    """partition_fn for aot_function: (forward GraphModule, backward GraphModule). slots: the
    parameters whose gradients the backward adds in place (NOTE [Accumulating in place]).
    made: the held tensors the step itself makes (NOTE [Held tensors made again] in
    monet_opt/held_outputs.py)."""
    rebuilt = rebuild_joint(joint, lowered, schedule, num_fwd_outputs, made)
    for node in rebuilt.graph.nodes:  # NOTE [Selective checkpointing's tags]
        node.meta = {k: v for k, v in node.meta.items() if k not in _AC_TAGS}
    fw, bw = default_partition(rebuilt, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
    if slots is not None:
        add_accumulation(bw, slots)  # the views it leaves at the end are dead code next
    _drop_dead_code(bw)
    _drop_unread_saved(fw, bw, num_fwd_outputs)
    _drop_backward_ops(fw)
    absent_grads.gate(bw, joint, num_fwd_outputs)  # NOTE [Outputs the loss does not read]
    for gm, phase in ((fw, FORWARD), (bw, BACKWARD)):
        _write_in_place(gm, phase)
        if phase == FORWARD:
            stats_in_place.apply(gm)  # NOTE [Statistics updated in place]
        cudnn_bn.use_cudnn(gm)  # NOTE [cuDNN's BatchNorm]
        if phase == BACKWARD:  # NOTE [Output gradients as handed]
            handed_grads.apply(gm, joint, num_fwd_outputs)
        direct_calls.drop_detaches(gm)  # NOTE [Direct calls]
        gm.graph.set_codegen(direct_calls.DirectCodeGen())
        gm.recompile()
    return fw, bw


# NOTE [Selective checkpointing's tags]
#   torch.utils.checkpoint with a context_fn (selective activation checkpointing: a policy that
#   says which ops to save and which to recompute) tags the traced nodes with its choices, and
#   default_partition hands any graph so tagged to the min-cut partitioner, which applies them
#   itself: on ours (whose order is the schedule, recomputations included) it failed comparing
#   tags that the nodes we add lack (TypeError: '>' not supported between 'NoneType' and
#   'NoneType'). The plan has chosen what to recompute, as for any checkpoint the model makes
#   (NOTE [Reentrant checkpoints] in monet_opt/reentrant.py), so the tags are dropped.
_AC_TAGS = ("recompute", "ac_graph_id")


def _drop_dead_code(gm: fx.GraphModule) -> None:
    """default_partition copies a forward random op into the backward whenever its inputs are
    saved there, and its dead-code pass keeps it (random ops count as impure). Run there, it
    would draw from the generator during every backward, which eager PyTorch does not do, and
    allocate its outputs for nothing. The backward graph is functional, so nothing in it is
    impure; the schedule's own recomputations of random ops go through rng_replay."""
    gm.graph.eliminate_dead_code(is_impure_node=lambda node: node.op in (
        "placeholder", "output") or node.target is recompute.release_states)


def _drop_unread_saved(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> None:
    """NOTE [Saved values the backward does not read]
      default_partition hands the backward every forward value that is an output of the graph
      (the output node counts as a backward user) and that a forward op it copies there reads
      (it copies any whose inputs it has, and keeps a random one alive). Once our dead-code pass
      drops such a copy, a value saved for it alone has no reader, and was held to the
      backward's end, where the simulator had freed it: BART and T5 (sdpa), whose returned
      encoder output fed a copy of the cross-attention's dropout, stopped with an internal
      error ("the backward is handed ['getitem_16'] and reads none of them") under plans that
      recompute part of the decoder. Such a value is no longer saved (tests/
      test_random_schedules.py). Only one the step also returns is so dropped: it lives as long
      as the caller, or the step, holds it, as simulated (the encoder output; a pruned weight
      the prune hook keeps on its module: tests/test_hooks.py); any other was kept for nothing,
      which solvers.without_unread prevents (NOTE [Unread recomputation])."""
    unread = {n.name for n in bw.graph.find_nodes(op="placeholder")
              if not n.users and not n.name.startswith(("primals", "tangents"))}
    if not unread:
        return
    out = next(iter(fw.graph.find_nodes(op="output")))
    values = out.args[0]
    returned = {v.name for v in values[:num_fwd_outputs] if isinstance(v, fx.Node)}
    left = sorted(unread - returned)
    internal_assert(not left, f"the backward is handed {left[:5]} and reads none of them")
    dropped = {k: v.name for k, v in enumerate(values) if k >= num_fwd_outputs and
               isinstance(v, fx.Node) and v.name in unread}
    out.args = (type(values)(v for k, v in enumerate(values) if k not in dropped),)
    for node in list(bw.graph.find_nodes(op="placeholder")):
        if node.name in dropped.values():
            bw.graph.erase_node(node)
    for gm in (fw, bw):
        gm.recompile()


def _drop_backward_ops(fw: fx.GraphModule) -> None:
    """NOTE [Random ops of the backward]
      default_partition's forward keeps every impure node it meets, so a random op of the
      backward that reads forward values alone (a custom Function drawing `randn_like` of a
      saved tensor in its backward) was also run in the forward, its draw dropped: each step
      drew once more than eager before the backward drew, which so drew other numbers, and the
      gradients differed from eager's with nothing said. A node of the backward that the
      forward does not read is not the forward's to run; the forward's own random ops are kept
      (eager draws them even where nothing reads what they drew)."""
    fw.graph.eliminate_dead_code(is_impure_node=lambda node: node.is_impure() and
                                 not in_backward(node))


def _write_in_place(gm: fx.GraphModule, phase: str) -> None:
    """NOTE [Writing into a dying input] (solvers/simulate.py): the steps the simulator runs in
    place run their op's in-place form, writing into the argument that dies there. Checked
    against FX's own frees: that argument is made in this graph, and this op is its last user."""
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        tag = node.meta.get(_OVERWRITES)
        if tag is None or tag[0] != phase or node.op != "call_function":
            continue
        k = tag[1]
        arg = node.args[k]
        internal_assert(isinstance(arg, fx.Node) and arg.op == "call_function" and
                        (node.target in OVERWRITING or node.target in grad_in_place.ELEMENTWISE)
                        and max(order[u] for u in arg.users) == order[node],
                        f"{node.name} was to write into {arg}, which is read after it")
        if node.target in OVERWRITING:
            args = (arg, *node.args[:k], *node.args[k + 1:])  # a + b as b += a, bitwise (IEEE)
            node.target, node.args = OVERWRITING[node.target], args
        else:  # NOTE [Elementwise backward ops in place]: its out= form, into argument k
            node.target = grad_in_place.into(node.target, k)


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
    chosen = [lowered.variant_sites[v] for v in schedule.variants]
    encodes = {site.encode_op: site for site in chosen if site.encode_op is not None}
    runs: dict[str, list] = {}  # backward node -> its chosen variants (NOTE [Combining variants])
    for site in chosen:
        runs.setdefault(site.backward_node, []).append(site)
    # producers whose generator state a chosen variant keeps (NOTE [Generator-state replay])
    replayed = {_producer(nodes[site.backward_node].args[site.arg]) for site in chosen
                if variants.family(site.family).draw is not None}
    for n in joint.graph.nodes:
        if n.op in ("placeholder", "get_attr"):
            e.bind(n, e.g.node_copy(n))
    for name in lowered.snapshots:  # NOTE [Buffers the step updates]
        e.snapshots[name] = e.emit_clone(nodes[name])
        e.snapshots[name].meta[updated_buffers.MADE] = name  # NOTE [Copies nothing reads]
    # NOTE [The step's generator states]
    e.make_states(recompute.random_forward_ops(joint, lowered))
    for k, i in enumerate(problem.forward_ops):
        if i in encodes:
            e.emit_encode(encodes[i], lowered.op_nodes[i])
        elif lowered.op_nodes[i] in nodes:  # not an unchosen variant's encode op
            node = nodes[lowered.op_nodes[i]]
            e.emit(node, capture_slot=node.name in replayed or  # NOTE [A replay's state]
                   (i in recomputed and problem.ops[i].is_random),
                   overwrite=overwrites.get(k))
    output = next(iter(joint.graph.find_nodes(op="output")))
    outs = list(output.args[0])
    fwd_values = [e.value(a) if isinstance(a, fx.Node) else a for a in outs[:num_fwd_outputs]]
    forward = dict(e.current)
    e.enter_backward(schedule)
    for k, i in enumerate(schedule.backward, start=len(problem.forward_ops)):
        if i in encodes:
            e.emit_encode(encodes[i], lowered.op_nodes[i])
            continue
        if lowered.op_nodes[i] not in nodes:
            continue  # an unchosen variant's encode op: it makes nothing anyone reads
        node = nodes[lowered.op_nodes[i]]
        if i in reread:
            e.reread(node, forward)
            continue
        e.emit(node, rerun=not problem.ops[i].is_backward, variant=runs.get(node.name),
               overwrite=overwrites.get(k))
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
             overwrite: int | None = None) -> None:
        """Run `old` here: its op node and the getitems of its outputs. With chosen variants
        (sites), the library's replacement runs on their encoded arguments instead. overwrite:
        the tensor the simulator has it write into (NOTE [Writing into a dying input]).
        capture_slot: copy the generator state before it into the op's slot, for its
        recomputation or a replaying variant (NOTEs [The step's generator states], [A replay's
        state] in monet_opt/recompute.py)."""
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
            target, args, kwargs, n_keep = recompute.recompute_form(old)
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
            new.meta[_OVERWRITES] = (self.tag, k)
        self.current[old.name] = new
        for gi in self.getitems.get(old.name, []):
            if n_keep is not None and gi.args[1] >= n_keep:
                self.current.pop(gi.name, None)
                continue
            self.current[gi.name] = self._copy(gi, (old, gi.args[1]), {})

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
