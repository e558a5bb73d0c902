"""Measure every operator of the joint graph on the device it will train on.

The joint graph is functional: running it changes no parameter or buffer. It runs on the real
parameters, buffers and sample input, with random output gradients, inside `fork_rng` so the
user's random stream is untouched. Each op is timed on every run after a warm-up; its time is the
median. Values are freed after their last use, so profiling needs no more memory than eager.
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from monet_opt.lower import Lowered


def profile_op_times(joint: fx.GraphModule, lowered: Lowered, primals: Sequence[torch.Tensor],
                     repeats: int = 3) -> tuple[float, ...]:
    """Median time in seconds of each Problem op (in `lowered.problem.ops` order)."""
    wanted = set(lowered.op_nodes)
    samples: dict[str, list[float]] = {name: [] for name in wanted}
    devices = sorted({t.device for t in primals if t.device.type == "cuda"}, key=str)
    with unset_fake_temporarily(), torch.no_grad(), \
            torch.random.fork_rng(devices=devices, enabled=True):
        tangents = [_random_like(n.meta["val"], primals)
                    for n in joint.graph.find_nodes(op="placeholder")
                    if n.name.startswith("tangents")]
        inputs = list(primals) + tangents
        for run in range(repeats + 1):
            _timed_run(joint, inputs, samples if run > 0 else None, wanted)
    return tuple(statistics.median(samples[name]) for name in lowered.op_nodes)


def _random_like(val: torch.Tensor, primals: Sequence[torch.Tensor]) -> torch.Tensor:
    device = primals[0].device if primals else val.device
    if val.dtype.is_floating_point or val.dtype.is_complex:
        return torch.randn(tuple(val.shape), dtype=val.dtype, device=device)
    return torch.zeros(tuple(val.shape), dtype=val.dtype, device=device)


def _timed_run(gm: fx.GraphModule, inputs: list[torch.Tensor],
               samples: dict[str, list[float]] | None, wanted: set[str]) -> None:
    last_use: dict[str, fx.Node] = {}
    for node in gm.graph.nodes:
        fx.node.map_arg((node.args, node.kwargs), lambda a: last_use.__setitem__(a.name, node))
    env: dict[str, object] = {}
    it = iter(inputs)
    cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = next(it)
        elif node.op == "get_attr":
            env[node.name] = getattr(gm, node.target)
        elif node.op == "call_function":
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: env[a.name])
            try:
                env[node.name], seconds = _call(node.target, args, kwargs, cuda)
            except Exception as exc:
                raise RuntimeError(f"monet_opt profiler: {node.format_node()} failed: "
                                   f"{exc}") from exc
            if samples is not None and node.name in wanted:
                samples[node.name].append(seconds)
        elif node.op == "output":
            break
        for name in [a.name for a in node.all_input_nodes if last_use.get(a.name) is node]:
            env.pop(name, None)


def _call(target, args, kwargs, cuda: bool):
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = target(*args, **kwargs)
        end.record()
        end.synchronize()
        return out, start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    out = target(*args, **kwargs)
    return out, time.perf_counter() - t0
