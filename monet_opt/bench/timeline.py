"""Predicted against measured memory over one step of one schedule (CPU: the running sum of the
allocator's events, as monet_opt.measure_peak counts them, after every event where allocation
events are on (NOTE [Allocation events] in monet_opt/alloc_events.py), else the live-bytes
counter sampled after every ATen op; CUDA: the caching allocator's peak over every ATen op, the
device synchronized around each)."""
from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from monet_opt import alloc_events
from monet_opt.bench.measure import Runner
from monet_opt.bench.results import Timeline
from monet_opt.memory import LiveBytes, resident_bytes
from monet_opt.plan import Plan

MAX_SAMPLES = 1500


class _Recorder(LiveBytes):
    """The live-bytes counter, remembering for every op when it started and the bytes live
    once its outputs exist (its inputs are still alive then: the most it holds)."""

    def __init__(self, resident) -> None:
        super().__init__(resident)
        self.samples: list[tuple[float, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.samples.append((start, self.live))
        return out


class _CudaRecorder(TorchDispatchMode):
    """For every op: when it started, and the most allocated while it ran (workspace included)
    as bytes above what was allocated before the step, plus `resident` (as measure_peak
    counts)."""

    def __init__(self, resident, device: torch.device) -> None:
        super().__init__()
        self.device = device
        torch.cuda.synchronize(device)
        self.base = torch.cuda.memory_allocated(device) - resident_bytes(resident)
        self.samples: list[tuple[float, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        torch.cuda.synchronize(self.device)
        self.samples.append((start, torch.cuda.max_memory_allocated(self.device) - self.base))
        return out


def _recorder(runner: Runner, device: torch.device):
    return _CudaRecorder(runner.resident, device) if device.type == "cuda" \
        else _Recorder(runner.resident)


def record(runner: Runner, x: Any, plan: Plan, method: str, setting: str,
           device: torch.device = torch.device("cpu")) -> Timeline | None:
    """One step of `runner` under the recorder, beside `plan`'s predicted timeline. None where
    the plan carries no timeline."""
    if plan.timeline is None or not plan.timeline.live_bytes:
        return None
    runner.clear_grads()
    if device.type == "cpu" and alloc_events.enabled() and alloc_events.available():
        clock = time.time_ns  # the events' clock
        rec = alloc_events.Allocations(runner.resident, trace=True)
    else:
        clock, rec = time.perf_counter, _recorder(runner, device)
    with rec:
        start = clock()
        loss = runner.forward(x).sum()
        backward_at = clock()
        loss.backward()
        end = clock()
    runner.clear_grads()
    span = max(end - start, 1e-12)
    samples = rec.samples
    if isinstance(rec, alloc_events.Allocations):  # as measure_peak counts: resident first
        base = resident_bytes(runner.resident)
        samples = [(t, base + b) for t, b in samples]
    measured = [((t - start) / span, b) for t, b in samples]
    pt = plan.timeline
    total = sum(pt.op_time_s) or 1.0
    predicted, clock = [], 0.0
    for dt, b in zip(pt.op_time_s, pt.live_bytes):
        predicted.append((clock / total, b))   # op k holds b bytes from its start on
        clock += dt
    predicted_backward = sum(pt.op_time_s[:pt.backward_start]) / total
    return Timeline(method=method, setting=setting, limit_bytes=plan.memory_limit_bytes,
                    predicted=_thin(predicted), measured=_thin(measured),
                    predicted_backward_at=predicted_backward,
                    measured_backward_at=(backward_at - start) / span)


def _thin(samples: list[tuple[float, int]]) -> tuple[tuple[float, int], ...]:
    """At most MAX_SAMPLES points; each kept point is the largest of its run (peaks survive)."""
    if len(samples) <= MAX_SAMPLES:
        return tuple(samples)
    size = -(-len(samples) // MAX_SAMPLES)
    return tuple(max(samples[k:k + size], key=lambda s: s[1])
                 for k in range(0, len(samples), size))


def available(device: torch.device) -> bool:
    return device.type in ("cpu", "cuda")
