"""NOTE [Parametrizations cached around a trace]
  `torch.nn.utils.parametrize.cached()` makes a parametrized weight (weight_norm,
  spectral_norm, orthogonal) once per block and hands the same tensor to every use. A step
  traced inside such a block (optimize() there, or a new batch shape or gradients in place
  planned there) kept the tensor its trace made in the block's cache, and the next route's
  trace met it as a constant: CaptureError, "Unexpected fake buffer _tensor_constant0", where
  eager ran. Each trace now has a cache of its own, empty, in place of the block's: traced in a
  block, the step makes each parametrized weight once, as eager does there; traced outside,
  once per use, as eager does there. The two differ in rounding where a weight is read twice
  (its two uses' gradients summed before or after the parametrization's backward), so whether
  such a block is open is watched, as a global the forward reads (NOTE [Globals read by the
  forward] in monet_opt/global_reads.py), for models with a parametrization: a step in the
  other case is planned for it (ReplanWarning), with gradients eager's bitwise either way
  (tests/test_wrapping.py).
"""
from __future__ import annotations

import contextlib

from torch import nn
from torch.nn.utils import parametrize


@contextlib.contextmanager
def own_cache():
    """NOTE [Parametrizations cached around a trace]: an empty cache for the trace (the module
    global each parametrized access reads), the block's back after."""
    saved = parametrize._cache
    parametrize._cache = {}
    try:
        yield
    finally:
        parametrize._cache = saved


def parametrized(model: nn.Module) -> bool:
    return any(parametrize.is_parametrized(m) for m in model.modules())
