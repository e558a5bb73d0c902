"""A compiled step called without AOTAutograd's flattening of its arguments.

NOTE [Arguments flattened once]
  aot_function's function flattens its arguments with torch's pytree at every call, then calls
  the compiled function it cached at the first one with that flat list. A step's arguments are
  flat already (the parameters, buffers, tensor attributes and inputs, each a tensor), and the
  flattening visits each one in Python: 0.26 ms a step on DenseNet-121's 728 tensors on the
  2-core CPU machine, time a GPU waits through. So once the first call has compiled, the step
  calls the cached function itself with the list, as aot_function would, and unflattens its
  outputs the same way. Where aot_function keeps its cache otherwise than this torch does (in
  its closure, `cached_res` = (compiled function, output spec)), or an argument is not a
  tensor (pytree drops a None), the step calls aot_function as before.
"""
from __future__ import annotations

from itertools import repeat
from typing import Any, Callable

import torch


class FlatCall:
    """`compiled(*flat)`, for aot_function's `compiled`, calling its cache directly."""

    def __init__(self, compiled: Callable) -> None:
        self._compiled = compiled
        code = getattr(compiled, "__code__", None)
        names = code.co_freevars if code is not None else ()
        self._cell = compiled.__closure__[names.index("cached_res")] \
            if "cached_res" in names else None
        self._cached: tuple[Callable, Any] | None = None

    def __call__(self, *flat: Any) -> Any:
        cached = self._cached or self._cache()
        if cached is None or not all(map(isinstance, flat, repeat(torch.Tensor))):
            return self._compiled(*flat)
        function, out_spec = cached
        return out_spec.unflatten(function(list(flat)))

    def __deepcopy__(self, memo: dict) -> FlatCall:
        return self  # compiled code, shared by copies as functions are

    def _cache(self) -> tuple[Callable, Any] | None:
        """aot_function's (compiled function, output spec), once it has compiled."""
        try:
            cached = self._cell.cell_contents if self._cell is not None else None
        except ValueError:  # an empty cell
            return None
        if isinstance(cached, tuple) and len(cached) == 2 and callable(cached[0]) \
                and hasattr(cached[1], "unflatten"):
            self._cached = cached
            return cached
        return None
