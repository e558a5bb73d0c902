"""BatchNorm's running statistics and its batch count updated in place, as eager updates them.

NOTE [Statistics updated in place]
  AOTAutograd traces a training BatchNorm functionally: `_native_batch_norm_legit_functional`
  clones the running mean and variance, updates the clones and returns them, and the count of
  batches seen is `add(num_batches_tracked, 1)`; once the forward has run, AOTAutograd copies
  each new value into its buffer. Per BatchNorm that is two clones, three copies and an add
  where eager runs one kernel that updates both statistics in place and one `add_`: DenseNet-121
  (121 BatchNorms) ran 3,433 ATen calls a step against eager's 2,792 on this CPU, 364 of them
  those copies. On a GPU each is a kernel launch, and on DenseNet-121 at batch 128 an H200 ran
  our store-all step 23.6 % slower than eager while predicting no loss (docs/benchmarks/gpu/).
  So where a statistic's buffer is read by its BatchNorm alone and its new value only by the
  copy into the buffer (AOTAutograd's output descriptors say which output updates which
  input), the forward runs the in-place kernel on the buffer itself (cuDNN's where eager's is:
  NOTE [cuDNN's BatchNorm]) and hands the buffer back as the new value, whose copy into itself
  ATen skips; the count is `add_`. The numbers are the same: the functional op is the in-place
  kernel run on clones. The problem gives those new values no bytes (they are the buffers,
  fixed memory), so the simulator's peaks stay the measured ones to the byte.
  Only the forward is rewritten: a recomputation of a BatchNorm in the backward reads no
  running statistics (NOTE [Recomputing BatchNorm] in monet_opt/recompute.py), training
  BatchNorm backwards ignore theirs (the joint graph hands them None, so the backward is not
  handed the buffers), and the profiler times the functional op on data of its own. Each
  buffer handed back leaves the autograd Function as a view of itself (a call, no kernel): on
  this CPU the step took as long as before (a small DenseNet, 1,575 ops: 54.9 ms in place,
  55.8 ms functional, the least of 20 interleaved rounds); on CUDA five kernels per BatchNorm
  are gone: on an H200, DenseNet-121 at batch 128 took 86.2 ms a step against eager's 85.1,
  and 94.6 ms with the statistics updated functionally (605 more launches a step;
  docs/benchmarks/gpu/step_gap.py, h200/step_gap_densenet121.txt).

NOTE [The statistics' versions]
  Eager's BatchNorm updates its running statistics without counting a write in their version
  counters (native_batch_norm's and cudnn_batch_norm's schemas do not mark them written); the
  step counted one, AOTAutograd copying each new value into its buffer (into itself, where the
  kernel ran in place). So a graph that saved those buffers (a gradient penalty through
  `opt.model`, as DoubleBackwardError advises, or `opt.model(x)` and `opt(x)` in one loss)
  failed in its backward once a step ran before it ("modified by an inplace operation ... is
  at version 3; expected version 2"), where eager runs it (higher-order probe, 2026-12-06).
  The step now leaves the counters of its training BatchNorms' statistics as it found them
  (`versions_kept`); the batch count's `add_` is counted, as eager's is.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.autograd.grad_mode import _unsafe_preserve_version_counter
from torch.nn.modules.batchnorm import _BatchNorm

from monet_opt import cudnn_bn, updated_buffers

aten = torch.ops.aten
MARK = "monet_updates_in_place"  # node meta: the outputs that are its buffers' new values
_STATS = (3, 4)  # the functional BatchNorm's new running mean and variance
_UPDATES = (cudnn_bn.TRAIN, aten.add.Tensor)  # what may update a buffer in place


def mark(joint: fx.GraphModule) -> int:
    """Mark the joint graph's BatchNorms and count updates that can run in place (meta MARK:
    the positions of their outputs that are new buffer values); returns how many."""
    updated = updated_buffers.updated_inputs(joint)
    output = next(iter(joint.graph.find_nodes(op="output")))
    slots = _mutation_slots(output)
    count = 0
    for node in joint.graph.nodes:
        if node.op != "call_function" or node.target not in _UPDATES:
            continue
        if node.target is cudnn_bn.TRAIN:
            pairs = [(node.args[k], _getitem(node, k)) for k in _STATS]
        else:
            pairs = [(node.args[0], node)] if node.args[1] == 1 and not node.kwargs else []
        if pairs and all(_only_update(buffer, new, node, updated, slots, output)
                         for buffer, new in pairs):
            node.meta[MARK] = _STATS if node.target is cudnn_bn.TRAIN else (0,)
            count += 1
            for buffer, new in pairs:  # they read neither: so none of the two
                for user in [u for u in (*buffer.users, *new.users) if _ignores_stats(u)]:
                    user.args = tuple(None if a is buffer or a is new else a for a in user.args)
    if count:
        joint.recompile()
    return count


def apply(fw: fx.GraphModule) -> int:
    """Run the marked nodes of a forward graph in place (NOTE [Statistics updated in place]);
    returns how many. Before cudnn_bn.use_cudnn; call recompile() after."""
    count = 0
    for node in list(fw.graph.nodes):
        if node.op != "call_function" or MARK not in node.meta or node.target not in _UPDATES:
            continue
        if node.target is cudnn_bn.TRAIN:
            run = cudnn_bn.in_place_kernel(node)
            for k in _STATS:
                got = _getitem(node, k)
                if got is not None:
                    got.replace_all_uses_with(node.args[k])
                    fw.graph.erase_node(got)
            node.meta["val"] = tuple(node.meta["val"][:3])
            node.target = run
        else:
            node.target = aten.add_.Tensor
        count += 1
    return count


def _getitem(node: fx.Node, k: int) -> fx.Node | None:
    return next((u for u in node.users if u.target is operator.getitem and u.args[1] == k), None)


def _mutation_slots(output: fx.Node) -> dict[str, object]:
    """Output node name -> the descriptor of the input whose new value it is."""
    descs = output.meta.get("desc") or ()
    return {arg.name: d.mutated_input for arg, d in zip(output.args[0], descs)
            if isinstance(arg, fx.Node) and type(d).__name__ == "InputMutationAOTOutput"}


def _only_update(buffer, new, node: fx.Node, updated: set[fx.Node], slots: dict,
                 output: fx.Node) -> bool:
    """`buffer` is an updated input read by `node` alone (and by training BatchNorm backwards,
    which do not read running statistics), and `new` its new value, read by nothing but the
    copy into it."""
    return isinstance(buffer, fx.Node) and buffer in updated \
        and all(u is node or _ignores_stats(u) for u in buffer.users) and new is not None \
        and all(u is output or _ignores_stats(u) for u in new.users) \
        and slots.get(new.name) == buffer.meta.get("desc") \
        and sum(a is new for a in output.args[0]) == 1


def _ignores_stats(node: fx.Node) -> bool:
    return node.target is cudnn_bn.BACKWARD and node.args[7] is True  # train=True


def versions_kept(modules: list[torch.nn.Module]) -> _unsafe_preserve_version_counter:
    """A context that leaves the version counters of the running statistics of `modules`'
    training BatchNorms as it found them (NOTE [The statistics' versions])."""
    stats = tuple(t for m in modules if isinstance(m, _BatchNorm) and m.training
                  for t in (m.running_mean, m.running_var) if t is not None)
    return _unsafe_preserve_version_counter(stats)
