"""Parameters and buffers the forward assigns through `.data`, made updates of the step.

NOTE [Parameters assigned through .data]
  MoCo's forward moves its key encoder toward its query encoder with
  `param_k.data = param_k.data * m + param_q.data * (1 - m)` under torch.no_grad(). Traced, that
  assignment swaps the tracing tensor's data and leaves no op in the graph, so no step ever
  made it: the key encoder stayed as it was at optimize(), and every parameter drifted from
  eager's from the first step, silently (a MoCo of two small conv encoders with a queue). An
  update in place (`param_k.mul_(m).add_(param_q, alpha=1 - m)`, or `.data.mul_(...)`) was in
  the step already. So while the forward is traced, a `.data` assignment to one of the step's
  parameters or buffers is an update in place: the new values are copied into it, which the
  graph records and the step repeats at every call, as eager's assignment does; other tensors'
  `.data` is set as usual. One of another shape, dtype or device cannot be: CaptureError.
  The same MoCo now trains bitwise like eager at its least plan (tests/test_data_assigned.py).
"""
from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch

from monet_opt.errors import CaptureError

_DATA = torch._C.TensorBase.data


@contextlib.contextmanager
def as_updates(state: Iterable[torch.Tensor], names: Iterable[str]) -> Iterator[None]:
    """While in it, `t.data = new` for `t` in `state` (named `names`) copies `new` into `t`."""
    held = {id(t): name for t, name in zip(state, names)}

    def assign(tensor: torch.Tensor, value: torch.Tensor) -> None:
        name = held.get(id(tensor))
        if name is None:
            _DATA.__set__(tensor, value)
            return
        if (value.shape, value.dtype, value.device) != \
                (tensor.shape, tensor.dtype, tensor.device):
            raise CaptureError(
                f"monet_opt.optimize: the forward assigns a {value.dtype} {list(value.shape)} "
                f"tensor to '{name}'.data ({tensor.dtype} {list(tensor.shape)}), which a traced "
                "step cannot repeat. Keep its shape, dtype and device, or update it in place "
                f"under torch.no_grad() ({name.rsplit('.', 1)[-1]}.copy_(...)).")
        with torch.no_grad():
            tensor.copy_(value)

    torch.Tensor.data = property(lambda t: _DATA.__get__(t, type(t)), assign)
    try:
        yield
    finally:
        del torch.Tensor.data
