"""Which half of the training step a node of the joint graph belongs to.

AOTAutograd's partitioner tags every node it places: node.meta["partitioner_tag"] is
"is_forward" or "is_backward". Passes that add nodes copy or set that tag, and every pass reads
it here, so that the spelling lives in one place.
"""
from __future__ import annotations

from torch import fx

TAG = "partitioner_tag"
FORWARD, BACKWARD = "is_forward", "is_backward"


def in_backward(node: fx.Node) -> bool:
    """Whether the partitioner put `node` in the backward (an untagged node is not)."""
    return node.meta.get(TAG) == BACKWARD


def mark_backward(node: fx.Node) -> fx.Node:
    """Tag a node a pass added to the backward; returns it."""
    node.meta[TAG] = BACKWARD
    return node
