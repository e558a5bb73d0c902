"""Buffers the step updates, copied first where a recomputation may read them.

NOTE [Buffers the step updates]
  A forward that updates a buffer in place (spectral_norm's power iteration writes its vectors
  u and v with out=; quantization-aware training's observers their scales and ranges) is traced
  as a functional graph, and AOTAutograd copies the new values into the buffer once the forward
  has run. An op that read the buffer's old value would, recomputed in the backward, read the
  new one: autograd's version check caught it ("modified by an inplace operation"), so a
  spectral-normed CNN at its least limit failed at its first backward (torch.nn.utils.
  spectral_norm and parametrizations.spectral_norm alike). So each such buffer that an op a
  schedule could recompute reads (a forward ancestor of what the backward reads) is copied as
  the forward begins, the backward reads that copy in its place, and the copy's bytes are
  fixed memory of the step. The copy is freed after its last read, or at once where nothing
  recomputes a reader, so the measured peak can be under the prediction by its bytes (for
  spectral_norm, vectors as long as a weight's rows and columns; observers' scales), and the
  forward a clone of the buffer. Where the update is an op's whole output (MoCo moving its key
  encoder toward its query encoder), the copy is of weights: two small conv encoders, 5.6 KB
  of a 320 KB step, counted whether or not a plan recomputes the update
  (docs/benchmarks/updated_buffers.md). Reading the
  buffer itself in the backward wherever it would read the buffer's new value (it holds it once
  the forward is done), so that only ops reading the old value need a copy, failed autograd's
  version check on the buffer the forward saved: tried and dropped.
  BatchNorm's running statistics need none of this (NOTE [Recomputing BatchNorm] in
  monet_opt/recompute.py: its recomputation does not read them), nor its num_batches_tracked
  count, which feeds nothing the backward reads. An op that reads the old value, pinned
  instead (its outputs fixed memory, never recomputed), over-counted quantization-aware
  training's every fake-quantized activation for the whole step.
"""
from __future__ import annotations

import torch.fx as fx

from monet_opt import recompute


def snapshots(joint: fx.GraphModule, is_view) -> list[fx.Node]:
    """The placeholders of buffers the step updates that an op a schedule could recompute
    reads, directly or through views (`is_view(node)`: it aliases its first argument)."""
    updated = updated_inputs(joint)
    if not updated:
        return []

    def base(node: fx.Node) -> fx.Node:
        while node.op == "call_function" and is_view(node):
            node = node.args[0]
        return node

    read = {base(a) for n in _rerunnable(joint) for a in rerun_reads(n)}
    return [n for n in joint.graph.find_nodes(op="placeholder") if n in updated and n in read]


def rerun_reads(node: fx.Node) -> list[fx.Node]:
    """The nodes a recomputation of `node` reads (BatchNorm's drops its running statistics)."""
    _, args, kwargs, _ = recompute.recompute_form(node)
    found: list[fx.Node] = []
    fx.node.map_arg((args, kwargs), found.append)
    return found


def updated_inputs(joint: fx.GraphModule) -> set[fx.Node]:
    """The placeholders whose tensors the step updates in place (AOTAutograd's output
    descriptors name them)."""
    output = next(iter(joint.graph.find_nodes(op="output")))
    updated = [d.mutated_input for d in output.meta.get("desc") or ()
               if type(d).__name__ == "InputMutationAOTOutput"]
    return {n for n in joint.graph.find_nodes(op="placeholder")
            if n.meta.get("desc") is not None and n.meta["desc"] in updated}


def _rerunnable(joint: fx.GraphModule) -> set[fx.Node]:
    """The forward call nodes a schedule could recompute: ancestors, through forward nodes,
    of the forward values backward nodes read."""
    forward = lambda n: n.op == "call_function" and \
        n.meta.get("partitioner_tag") != "is_backward"  # noqa: E731
    stack = [a for n in joint.graph.nodes if n.op == "call_function" and not forward(n)
             for a in recompute.tensor_args(n) if forward(a)]
    seen: set[fx.Node] = set()
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(a for a in rerun_reads(node) if forward(a))
    return seen
