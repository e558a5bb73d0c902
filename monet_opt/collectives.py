"""NOTE [Collectives in the forward]
  A forward that communicates (tensor parallelism's `funcol.all_reduce` of an activation) makes
  collectives ops of its step, and a plan may recompute any forward op. Each rank solves its
  own plan, so two ranks recomputed different numbers of all_reduces, their collectives paired
  up wrongly, and the gradients were off eager's by up to 33 with no error, until gloo closed
  the connection a step later (sharding probe, 2026-12-07). A collective's outputs are now held
  for the whole step, as tensors the caller holds are (NOTE [Held tensors made again] in
  monet_opt/held_outputs.py): a schedule that recomputes one reads its forward's copy, so
  every rank issues its forward's collectives once a step, whatever its plan; the plan counts
  them held. Planning profiles each op, collectives too, on every rank: every rank must call
  optimize() at once (as it calls the forward), not one rank first.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from monet_opt.lower import Lowered

# the namespaces of torch.distributed's traceable collectives
NAMESPACES = frozenset({"_c10d_functional", "c10d_functional", "_c10d_functional_autograd",
                        "c10d", "_dtensor"})


def is_collective(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and \
        node.target.namespace in NAMESPACES


def outputs(joint: fx.GraphModule, lowered: Lowered) -> set[int]:
    """The tensors the forward's collectives make (ids of `lowered`'s problem)."""
    nodes = {n.name: n for n in joint.graph.nodes}
    problem = lowered.problem
    return {t for i in problem.forward_ops if lowered.op_nodes[i] in nodes
            and is_collective(nodes[lowered.op_nodes[i]]) for t in problem.ops[i].outputs}
