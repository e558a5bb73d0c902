"""How every method of the benchmark is measured, the same way for all of them.

A *step* is forward, `out.sum()`, backward, starting with every gradient unset. The *peak* is
the most memory the step holds on the device, everything counted: parameters, buffers, the
input, activations, workspace and the gradients it creates.

- CPU, every method, with allocation events on (the default): the
  allocator's events as `monet_opt.measure_peak` reads them, kernels' scratch included (NOTE
  [Allocation events] in monet_opt/alloc_events.py): the instrument our plans are now made for
  and held against. Measured by the live-bytes counter instead, our executor's peaks were 5 %
  off plans that count scratch (tiny_cnn, its peak at a BatchNorm backward with 64 KiB of it).
- CPU with them off (MONET_OPT_CPU_SCRATCH=0): eager-mode code (eager,
  torch.utils.checkpoint, our executor) by the live-bytes counter (`monet_opt.LiveBytes`,
  exact to the byte), torch.compile'd code by the profiler's allocation events. An active
  TorchDispatchMode (the counter) silently makes compiled code run eager
  (research/anchors-cpu.md), so it cannot be used there. The most
  they held above the tensors alive at entry, plus those, is the peak (read by the same
  window as measure_peak's). Taken for every method as a cross-check (`profiler_peak`, the
  figure methods are compared by).
- CUDA: `max_memory_allocated` above what was allocated before the step, plus the method's own
  parameters, buffers and input (so other models alive on the device do not count).
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from monet_opt import alloc_events
from monet_opt.memory import LiveBytes, measure_peak, resident_bytes

LIVE_BYTES = "live-bytes counter"
PROFILER = "profiler allocation events"
EVENTS = "allocation events (monet_opt.measure_peak)"
CUDA_ALLOCATOR = "cuda max_memory_allocated"
GRAD_SEED = 1234


@dataclass(frozen=True)
class Runner:
    """One method under test: `module` runs the model, `params` are its parameters in the order
    of the original model's `named_parameters()` (where its gradients appear), `resident` the
    tensors alive before a step (parameters, buffers, input)."""

    name: str
    module: Callable[..., Any]
    params: tuple[torch.Tensor, ...]
    resident: tuple[torch.Tensor, ...]

    def step(self, x: Any) -> None:
        """NOTE [The output is not held]: the output is dropped once the loss is computed, as
        in `loss_fn(model(x)).backward()`; a plan counts only the loss scalar into the
        backward (monet_opt.api, NOTE [The loss scalar]); a loop that holds it through the
        backward gets a plan that holds it (NOTE [Outputs held through the backward])."""
        self.forward(x).sum().backward()

    def forward(self, x: Any) -> Any:
        return self.module(**x) if isinstance(x, dict) else self.module(x)

    def clear_grads(self) -> None:
        for p in self.params:
            p.grad = None


def runner_for(name: str, module: Callable[..., Any], owner: nn.Module, x: Any,
               params: Sequence[torch.Tensor] | None = None) -> Runner:
    """A Runner whose parameters and buffers are `owner`'s (or `params`, aligned with the
    original model's, when the owner's names differ)."""
    params = tuple(params) if params is not None else tuple(owner.parameters())
    resident: list[torch.Tensor] = list(owner.parameters()) + list(owner.buffers())
    tree_map_only(torch.Tensor, resident.append, x)
    return Runner(name, module, params, tuple(resident))


def first_step(runner: Runner, x: Any, device: torch.device
               ) -> tuple[list[torch.Tensor | None], float]:
    """One step with the random stream seeded (the same dropout masks for every method that
    draws like eager): its gradients, copied to the CPU, and its wall time (for a compiled
    runner, compilation included)."""
    runner.clear_grads()
    torch.manual_seed(GRAD_SEED)
    elapsed = _timed(runner, x, device)
    grads = [None if p.grad is None else p.grad.detach().to("cpu", copy=True)
             for p in runner.params]
    runner.clear_grads()
    return grads, elapsed


def grad_rel_diff(grads: list[torch.Tensor | None], ref: list[torch.Tensor | None]) -> float:
    """max |g - g_ref| over all parameters, divided by max |g_ref| (a missing gradient is 0)."""
    worst, scale = 0.0, 0.0
    for g, r in zip(grads, ref, strict=True):
        r64 = torch.zeros(()) if r is None else r.double()
        g64 = torch.zeros(()) if g is None else g.double()
        worst = max(worst, float((g64 - r64).abs().max()))
        scale = max(scale, float(r64.abs().max()))
    return worst / scale if scale else worst


def peak_bytes(runner: Runner, x: Any, device: torch.device, compiled: bool) -> tuple[int, str]:
    """The measured peak of one step and the instrument that measured it."""
    runner.clear_grads()
    try:
        if device.type == "cuda":
            return _cuda_peak(runner, x, device), CUDA_ALLOCATOR
        if alloc_events.enabled() and alloc_events.available():  # what our plans count
            return measure_peak(lambda: runner.step(x), runner.resident, device), EVENTS
        if compiled:
            return profiler_peak(runner, x), PROFILER
        with LiveBytes(runner.resident) as counter:
            runner.step(x)
        return counter.peak, LIVE_BYTES
    finally:
        runner.clear_grads()


def _cuda_peak(runner: Runner, x: Any, device: torch.device) -> int:
    return measure_peak(lambda: runner.step(x), runner.resident, device)


def profiler_peak(runner: Runner, x: Any) -> int:
    """CPU peak from the allocator's events, whatever the switch: the tensors alive at entry
    plus the most one step held above them (an `alloc_events.Allocations` window: NOTE
    [Allocation events] in monet_opt/alloc_events.py)."""
    runner.clear_grads()
    with alloc_events.Allocations(runner.resident) as events:
        runner.step(x)
    runner.clear_grads()
    return resident_bytes(runner.resident) + events.peak


def interleaved_times(runners: Sequence[Runner], x: Any, rounds: int, device: torch.device,
                      warmup: int = 1) -> dict[str, float]:
    """Median step time of each runner: `warmup` untimed steps each, then `rounds` rounds in
    which every runner steps once, in an order shuffled afresh each round (seeded). A rotating
    order kept each runner's predecessor fixed, and with it whatever state that one leaves (heap
    layout, caches): at 2d6858b four runners of one and the same ResNet-50 schedule came out
    +2.0 to +6.8 % over eager, where eager and its repeat, always neighbours, were 1.6 % apart."""
    times: dict[str, list[float]] = {r.name: [] for r in runners}
    shuffle = random.Random(0).shuffle
    for rnd in range(warmup + rounds):
        order = list(runners)
        shuffle(order)
        for runner in order:
            runner.clear_grads()
            elapsed = _timed(runner, x, device)
            if rnd >= warmup:
                times[runner.name].append(elapsed)
    for r in runners:
        r.clear_grads()
    return {name: statistics.median(ts) for name, ts in times.items()}


def _timed(runner: Runner, x: Any, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    runner.step(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
