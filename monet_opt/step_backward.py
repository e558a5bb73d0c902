"""What a step's backward node is given as the optimized module returns its outputs."""
from __future__ import annotations

from monet_opt import (absent_grads, autocast_backward, handed_grads, mutation_tangents,
                       output_hooks, retained_graphs)


def hook(returned: list, outputs, feeding: tuple[int, ...]) -> None:
    """Hook the step's backward node, found behind `returned` (the output tensors), for the
    NOTEs [Gradients of parameters updated in place], [Outputs the loss does not read], [Output
    gradients as handed], [Backward under autocast], [Retained graphs, said] and [Hooks on an
    output others are computed from] (`feeding`: those outputs' leaf positions in
    `outputs`)."""
    absent_grads.put_back_hooks()  # any a backward that raised held back
    backward = absent_grads.step_node(returned)
    mutation_tangents.no_zeros(backward)
    for hooked in (absent_grads, handed_grads, autocast_backward, retained_graphs):
        hooked.prehook(backward)
    output_hooks.prehook(backward, outputs, feeding)
