"""Measure the peak memory of a training step: on CPU a live-tensor-bytes counter, on CUDA the
caching allocator's max_memory_allocated."""
from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of live tensor storages, deduplicated by storage, freed when the storage
    dies. Seed it with the tensors alive at the start (parameters, buffers, inputs). The same
    figure to the byte on every run (DESIGN pitfall 5). It sees what ops return, not scratch
    memory allocated and freed inside a kernel."""

    def __init__(self, resident: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}
        for t in resident:
            self._track(t)

    def _track(self, t: torch.Tensor) -> None:
        if t.device.type != "cpu" or t.is_meta:
            return
        storage = t.untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or key in self._sizes:
            return
        self._sizes[key] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        if self._sizes.pop(key, None) is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self._track, out)
        return out


def resident_tensors(model: torch.nn.Module, inputs: Any = ()) -> list[torch.Tensor]:
    """Parameters, buffers, existing gradients and the tensors in `inputs`."""
    out = list(model.parameters()) + list(model.buffers())
    out += [p.grad for p in model.parameters() if p.grad is not None]
    tree_map_only(torch.Tensor, out.append, inputs)
    return out


def measure_peak(step: Callable[[], Any], resident: Iterable[torch.Tensor] = (),
                 device: torch.device | str | None = None) -> int:
    """Run `step()` once and return its peak memory in bytes, everything counted: the tensors in
    `resident` (pass `resident_tensors(model, inputs)`) plus everything the step allocates.

    CPU: the LiveBytes counter. CUDA: max_memory_allocated after a reset (which counts every
    live allocation on the device, so `resident` is not needed there).
    """
    resident = list(resident)
    device = torch.device(device) if device is not None else _device_of(resident)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    with LiveBytes(resident) as counter:
        step()
    return counter.peak


def _device_of(tensors: Iterable[torch.Tensor]) -> torch.device:
    for t in tensors:
        return t.device
    return torch.device("cpu")
