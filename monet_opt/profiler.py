"""Measure every operator of the joint graph on the device it will train on.

The joint graph is functional: running it changes no parameter or buffer. It runs on the real
parameters, buffers and sample input, with random output gradients, inside `fork_rng` so the
user's random stream is untouched. Each op is timed on every run after a warm-up; its time is the
median. Values are freed after their last use, so profiling needs no more memory than eager.

Each operator variant is measured where its backward op runs: encode the argument it replaces,
run the replacement, and compare its result with the op's own, bitwise (a variant that differs
is reported and never offered to the solver). Workspace is the peak of what the call allocates
beyond its result: a live-bytes counter on CPU, the allocator's peak on CUDA.
"""
from __future__ import annotations

import functools
import operator
import statistics
import time
from typing import Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from monet_opt import variants
from monet_opt.lower import Lowered
from monet_opt.memory import LiveBytes


class _VariantProbe:
    """Samples for the variants at the backward nodes they replace."""

    def __init__(self, lowered: Lowered) -> None:
        self.at: dict[str, list[int]] = {}
        for v, site in enumerate(lowered.variant_sites):
            self.at.setdefault(site.backward_node, []).append(v)
        self.sites = lowered.variant_sites
        n = len(self.sites)
        self.encode_s: list[list[float]] = [[] for _ in range(n)]
        self.run_s: list[list[float]] = [[] for _ in range(n)]
        self.encode_ws = [0] * n
        self.run_ws = [0] * n
        self.error = [0.0] * n

    def measure(self, node: fx.Node, args, kwargs, result, cuda: bool, timed: bool) -> None:
        for v in self.at.get(node.name, ()):
            site = self.sites[v]
            fam = variants.family(site.family)
            x = args[site.arg]
            replacement = functools.partial(variants.run, (site.family,), (site.params,))
            if fam.encode is None:
                enc, enc_s, enc_ws = site.like, 0.0, 0
            else:
                enc, enc_s, enc_ws = _measured(fam.encode, (x, *site.params), cuda, timed)
            new_args = tuple(enc if k == site.arg else a for k, a in enumerate(args))
            out, run_s, run_ws = _measured(replacement, new_args, cuda, timed)
            if timed:
                self.encode_s[v].append(enc_s)
                self.run_s[v].append(run_s)
            else:
                self.encode_ws[v], self.run_ws[v] = enc_ws, run_ws
                self.error[v] = relative_error(out, result, _used_outputs(node))


def _measured(fn, args, cuda: bool, timed: bool):
    """(result, seconds or 0, workspace bytes or 0): timed runs are not counted, counted
    runs are not timed (the counter slows them)."""
    if timed:
        out, seconds = _call(fn, args, {}, cuda)
        return out, seconds, 0
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn(*args)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        with LiveBytes() as counter:
            out = fn(*args)
        peak = counter.peak
    return out, 0.0, max(0, peak - _nbytes(out))


def _nbytes(out) -> int:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(o.untyped_storage().nbytes() for o in outs if isinstance(o, torch.Tensor))


def _used_outputs(node: fx.Node) -> frozenset[int] | None:
    """Which outputs of a multi-output node the graph reads (None: all). Unread ones may hold
    anything: convolution_backward returns a tensor for a gradient its output_mask declined."""
    val = node.meta.get("val")
    if not isinstance(val, (tuple, list)):
        return None
    return frozenset(u.args[1] for u in node.users if u.target is operator.getitem)


def relative_error(got, want, only: frozenset[int] | None = None) -> float:
    """0.0 when `got` is bitwise `want` (tensors or tuples of them, the outputs in `only`
    if given; NaNs where want has them); else the largest max-abs relative error over the
    outputs; inf when shapes, dtypes or the NaN/inf pattern differ."""
    gots = got if isinstance(got, (tuple, list)) else (got,)
    wants = want if isinstance(want, (tuple, list)) else (want,)
    if len(gots) != len(wants):
        return float("inf")
    worst = 0.0
    for k, (a, b) in enumerate(zip(gots, wants)):
        if only is not None and k not in only:
            continue
        if a is None and b is None:
            continue
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or \
                a.shape != b.shape or a.dtype != b.dtype:
            return float("inf")
        if torch.equal(a, b) or (torch.equal(a.isnan(), b.isnan())
                                 and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))):
            continue
        finite = b.isfinite()
        if not bool(finite.any()):
            return float("inf")
        if not (torch.equal(a.isfinite(), finite) and torch.equal(a[~finite], b[~finite])):
            return float("inf")
        diff = (a[finite].double() - b[finite].double()).abs().max().item()
        worst = max(worst, diff / max(b[finite].double().abs().max().item(), 1e-30))
    return worst


def profile_op_times(joint: fx.GraphModule, lowered: Lowered, primals: Sequence[torch.Tensor],
                     repeats: int = 3) -> tuple[float, ...]:
    """Median time in seconds of each Problem op (in `lowered.problem.ops` order)."""
    return profile(joint, lowered, primals, repeats)[0]


def profile(joint: fx.GraphModule, lowered: Lowered, primals: Sequence[torch.Tensor],
            repeats: int = 3):
    """(op times as profile_op_times gives them, variant costs, variant errors): per problem
    variant, (encode time, encode workspace, run time minus the op's time, run workspace)
    and `relative_error` of its result against the op's (0.0: bitwise equal)."""
    wanted = set(lowered.op_nodes)
    samples: dict[str, list[float]] = {name: [] for name in wanted}
    probe = _VariantProbe(lowered)
    devices = sorted({t.device for t in primals if t.device.type == "cuda"}, key=str)
    with unset_fake_temporarily(), torch.no_grad(), \
            torch.random.fork_rng(devices=devices, enabled=True):
        tangents = [_random_like(n.meta["val"], primals)
                    for n in joint.graph.find_nodes(op="placeholder")
                    if n.name.startswith("tangents")]
        inputs = list(primals) + tangents
        for run in range(repeats + 1):
            _timed_run(joint, inputs, samples if run > 0 else None, wanted, probe)
    med = {name: statistics.median(v) for name, v in samples.items() if v}
    times = tuple(med.get(name, 0.0) for name in lowered.op_nodes)
    costs = []
    for v, site in enumerate(lowered.variant_sites):
        enc = statistics.median(probe.encode_s[v]) if probe.encode_s[v] else 0.0
        run = statistics.median(probe.run_s[v]) if probe.run_s[v] else 0.0
        costs.append((enc, probe.encode_ws[v], run - med.get(site.backward_node, 0.0),
                      probe.run_ws[v]))
    return times, tuple(costs), tuple(probe.error)


def _random_like(val: torch.Tensor, primals: Sequence[torch.Tensor]) -> torch.Tensor:
    device = primals[0].device if primals else val.device
    if val.dtype.is_floating_point or val.dtype.is_complex:
        return torch.randn(tuple(val.shape), dtype=val.dtype, device=device)
    return torch.zeros(tuple(val.shape), dtype=val.dtype, device=device)


def _timed_run(gm: fx.GraphModule, inputs: list[torch.Tensor],
               samples: dict[str, list[float]] | None, wanted: set[str],
               probe: _VariantProbe) -> None:
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
            probe.measure(node, args, kwargs, env[node.name], cuda, timed=samples is not None)
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
