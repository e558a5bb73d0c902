"""The rewrites of the joint graph before it is lowered and planned, in their order (each one's
NOTE is where it lives)."""
from __future__ import annotations

from collections.abc import Collection

import torch
import torch.fx as fx

from monet_opt import (attention_masks, bn_split, conv_split, dropout_scale, grad_layout,
                       grouped_attention, grouped_math, gru_gates, late_grads, mutation_tangents,
                       saved_clones, stats_in_place)


def rewrite(joint: fx.GraphModule, num_fwd_outputs: int, primals: list[torch.Tensor],
            families: Collection[str], grouped: bool = True) -> None:
    """Rewrite `joint` in place: `primals` are the tensors its primal placeholders stand for,
    `families` the variant families offered (two of them rewrite the graph); `grouped` False:
    the model's attention repeats its keys in eager (NOTE [Masks eager builds too])."""
    unmasked = attention_masks.drop_constant_masks(joint)  # NOTE [Constant attention masks]
    if grouped:
        grouped_attention.use_grouped_keys(joint, unmasked)  # NOTE [Grouped-query attention]
    grouped_math.cast_before_repeat(joint)  # NOTE [Grouped keys on the math path]
    saved_clones.drop_saved_clones(joint)  # NOTE [Saved clones]
    dropout_scale.round_dropout_scales(joint)  # NOTE [Dropout's scale]
    dropout_scale.match_kernel_layouts(joint)  # NOTE [Dropout backward's layout]
    grad_layout.match_gradient_layouts(joint, num_fwd_outputs)  # NOTE [Gradients in the
    # parameter's layout]
    devices = {t.device.type for t in primals}
    if conv_split.SPLIT_WITH in families and devices <= conv_split.SPLIT_DEVICES:
        conv_split.split_conv_backward(joint)  # NOTE [Conv backward split]
    if bn_split.NAME in families:
        bn_split.split_batch_norm(joint)  # NOTE [BatchNorm recomputed from its statistics]
    late_grads.make_results_late(joint)  # NOTE [Results made late]
    gru_gates.by_rows(joint)  # NOTE [A GRU's gates by rows]
    stats_in_place.mark(joint)  # NOTE [Statistics updated in place]
    mutation_tangents.drop(joint, primals)  # NOTE [Gradients of parameters updated in place]
