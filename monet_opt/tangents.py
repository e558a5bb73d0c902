"""The output gradients the profiler hands a step's backward."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as dense_layout


def tangent_like(val: torch.Tensor, primals: Sequence[torch.Tensor]) -> torch.Tensor:
    """An output gradient laid out as the trace's: the backward of a transposed output views
    its gradient as the trace's strides allow (a contiguous one failed `view`: "view size is
    not compatible with input tensor's size and stride"). A scalar's is 1, as backward() seeds
    a loss's: matrix_exp's backward sizes its scratch by its gradient's norm, and an
    orthogonal parametrization under WithLoss, profiled with a random draw there, measured
    18.7 % over its plan at most seeds (parametrizations probe, 2026-12-06)."""
    device = primals[0].device if primals else val.device
    strides = tuple(val.stride()) if dense_layout(val) else None
    out = torch.empty_strided(tuple(val.shape), strides, dtype=val.dtype, device=device) \
        if strides else torch.empty(tuple(val.shape), dtype=val.dtype, device=device)
    if not (val.dtype.is_floating_point or val.dtype.is_complex):
        return out.zero_()
    return out.fill_(1) if val.dim() == 0 else out.normal_()
