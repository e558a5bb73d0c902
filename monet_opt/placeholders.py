"""The joint graph's placeholders: the step's primal tensors, and AOTAutograd's effect tokens."""
from __future__ import annotations

import torch.fx as fx


def is_effect_token(node: fx.Node) -> bool:
    """A placeholder AOTAutograd adds to order ops with side effects (`with_effects`: the error
    check of torch.linalg.solve, inv and cholesky), which no caller passes in."""
    return type(node.meta.get("desc")).__name__ in ("ForwardTokenAOTInput",
                                                     "BackwardTokenAOTInput")


def primal_placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    """`gm`'s primal placeholders in order, one per tensor of the step (effect tokens left out)."""
    return [n for n in gm.graph.find_nodes(op="placeholder")
            if n.name.startswith("primals") and not is_effect_token(n)]
