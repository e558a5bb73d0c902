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

import operator

import torch.fx as fx
from functorch.compile import default_partition

from monet_opt import (absent_grads, cudnn_bn, direct_calls, grad_in_place, handed_grads,
                       mutation_tangents, recompute, stats_in_place)
from monet_opt import unseeded as unseeded_adds
from monet_opt.accumulate import GradientSlots, add_accumulation
from monet_opt.errors import internal_assert
from monet_opt.lower import OVERWRITING, Lowered
from monet_opt.phase import BACKWARD, FORWARD, in_backward
from monet_opt.rebuild import OVERWRITES, rebuild_joint
from solvers import Schedule



def partition(joint: fx.GraphModule, joint_inputs, lowered: Lowered, schedule: Schedule,
              num_fwd_outputs: int, slots: GradientSlots | None = None,
              made: frozenset[int] = frozenset(), unseeded: frozenset[str] = frozenset(),
              **kwargs):
    """partition_fn for aot_function: (forward GraphModule, backward GraphModule). slots: the
    parameters whose gradients the backward adds in place (NOTE [Accumulating in place]).
    made: the held tensors the step itself makes (NOTE [Held tensors made again] in
    monet_opt/held_outputs.py). unseeded: the tangents planned as handed no gradient (NOTE
    [Outputs beside the loss] in monet_opt/unseeded.py)."""
    rebuilt = rebuild_joint(joint, lowered, schedule, num_fwd_outputs, made)
    _read_unread_results(rebuilt)
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
            unseeded_adds.apply(gm, unseeded)  # NOTE [Outputs beside the loss]
            mutation_tangents.materialize(gm)  # NOTE [Gradients of parameters updated in place]
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


def _read_unread_results(gm: fx.GraphModule) -> None:
    """A random op of several results that nothing reads (a dropout in a branch the loss does not
    use: eager draws its mask all the same, and so does the step) is kept with no getitem of
    its results, and default_partition refused the graph ("Expected native_dropout_default to
    be a tensor"; every optimize() of such a model failed: layers probe, 2026-12-06). Each gets
    a getitem of its first result, which nothing reads either: the forward drops it and keeps
    the draw (NOTE [Random ops of the backward])."""
    for node in list(gm.graph.nodes):
        val = node.meta.get("val")
        if node.op == "call_function" and not node.users and isinstance(val, (tuple, list)):
            with gm.graph.inserting_after(node):
                gm.graph.call_function(operator.getitem, (node, 0)).meta["val"] = val[0]


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
        tag = node.meta.get(OVERWRITES)
        if tag is None or tag[0] != phase or node.op != "call_function":
            continue
        k = tag[1]
        arg = node.args[k]
        internal_assert(isinstance(arg, fx.Node) and arg.op == "call_function" and
                        (node.target in OVERWRITING or node.target in grad_in_place.OUT_FORMS)
                        and max(order[u] for u in arg.users) == order[node],
                        f"{node.name} was to write into {arg}, which is read after it")
        if node.target in OVERWRITING:
            args = (arg, *node.args[:k], *node.args[k + 1:])  # a + b as b += a, bitwise (IEEE)
            node.target, node.args = OVERWRITING[node.target], args
        else:  # NOTE [Elementwise backward ops in place]: its out= form, into argument k
            node.target = grad_in_place.into(node.target, k)
