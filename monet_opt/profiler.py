"""Measure every operator of the joint graph on the device it will train on.

The joint graph is functional: running it changes no parameter or buffer. It runs once, op by op,
on the real parameters, buffers and sample input, with random output gradients, inside
`fork_rng` so the user's random stream is untouched. Each op that the problem schedules is run
once for its value (the warm-up), then timed `repeats` more times back to back; its time is the
median. Before that pass, the whole graph runs once untimed (NOTE [Warm allocator]). Values
are freed after their last use, so profiling needs no more memory than eager; given the limit
in bytes, no more than it (NOTE [Profiling within the limit] in monet_opt/profile_memory.py).

Identical calls are measured once: an op whose signature (ATen target, every tensor argument's
dtype, shape, stride and device, every other argument's value) was timed already reuses that
time and runs once, for its value. A variant reuses the times of the same variant at an
identical signature; its error check and workspace are still taken at every site (one run).

Each operator variant is measured where its backward op runs: encode the argument it replaces,
run the replacement (`variants.run`), and report its result's `relative_error` against the
op's own (0.0: bitwise equal; the caller decides what is acceptable). Its time is the difference
from its op's, timed beside it (NOTE [Variants timed beside their op] in
monet_opt/variant_probe.py). Workspace is the peak of what the call allocates beyond its
result: a live-bytes counter on CPU, the allocator's peak on CUDA.

The time limit: NOTE [The profiling time limit] in monet_opt/profile_budget.py.
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _pytree as pytree

from monet_opt import (alloc_events, conv_split, cudnn_bn, output_bytes, pass_inputs,
                       recompute)
from monet_opt.lower import Lowered
from monet_opt.placeholders import is_effect_token
from monet_opt.misread_layouts import Layouts
from monet_opt.memory import counted, cuda_devices, sparse_copies
from monet_opt.profile_budget import Budget, estimates
from monet_opt.profile_memory import Scratch
from monet_opt.tangents import tangent_like
from monet_opt.profile_walk import walk as _walk
from monet_opt.variant_probe import VariantProbe, timed_call as _call

# What a profile holds, in the profile directory's keys: a profile an older profiler made is
# not served to this one (each revision and what it changed: profiles/README.md). Raise it
# when what the profiler measures changes meaning.
PROFILER_REVISION = 24


class ProfileTimeLimitWarning(RuntimeWarning):
    """The profiling time limit was reached: some op times are estimates."""


@dataclass(frozen=True)
class ProfileResult:
    """op_time_s: per problem op (encode ops 0: their cost is in variant_costs). op_rerun_s:
    per problem op, its recomputation's time where that runs otherwise (recompute.rerun_args),
    else None.
    variant_costs[v]: (encode time s, encode workspace bytes, run time minus the op's time s,
    run workspace bytes). variant_error[v]: `relative_error` of its result against the op's
    (0.0: bitwise equal; inf if not measured). variant_measured[v]: reached before the time
    limit. estimated_ops: ops given an estimate;
    reduced_ops: ops timed with fewer repeats than asked; timed_signatures: distinct op
    signatures timed."""

    op_time_s: tuple[float, ...]
    variant_costs: tuple[tuple[float, int, float, int], ...]
    variant_error: tuple[float, ...]
    variant_measured: tuple[bool, ...]
    estimated_ops: int = 0
    reduced_ops: int = 0
    timed_signatures: int = 0
    op_rerun_s: tuple[float | None, ...] = ()  # recomputation's time where it differs
    op_workspace_bytes: tuple[int, ...] = ()  # per op (NOTE [Workspace] in monet_opt/memory.py)
    # per op, its forward run's where less (NOTE [A first run's workspace] in solvers/simulate.py)
    op_first_workspace_bytes: tuple[int | None, ...] = ()
    # per random op, its forward run's with its generator state captured (NOTE [The capture's
    # copy] in monet_opt/recompute.py)
    op_captured_workspace_bytes: tuple[int | None, ...] = ()
    # per op, what its tensor outputs' storages hold (NOTE [Outputs larger than their shapes])
    op_output_bytes: tuple[tuple[int, ...] | None, ...] = ()
    made_again: int = 0  # values dropped and made again to keep within the memory limit
    # nodes whose real output is laid out otherwise than traced (NOTE [Writing into a tensor
    # laid out otherwise than traced] in monet_opt/misread_layouts.py)
    relaid: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (node, its real strides)


def profile(joint: fx.GraphModule, lowered: Lowered, primals: Sequence[torch.Tensor],
            repeats: int = 3, time_limit_s: float | None = None,
            memory_limit: int | None = None) -> ProfileResult:
    """Time every op and variant of `lowered` (see the module docstring and NOTE [The profiling
    time limit]); warns with `ProfileTimeLimitWarning` when ops had to be estimated.
    memory_limit: the bytes the pass may hold (NOTE [Profiling within the limit] in
    monet_opt/profile_memory.py); None: each value to its last use, as eager."""
    nodes = {n.name: n for n in joint.graph.nodes if n.op == "call_function"}
    wanted = [name for name in lowered.op_nodes if name in nodes]
    probe = VariantProbe(lowered)
    budget = Budget(repeats, time_limit_s, len(wanted), lowered.problem.name or "model")
    devices = cuda_devices(primals)
    if alloc_events.unmeasured() and not devices:  # NOTE [Plans made inside a profiler]
        warnings.warn("monet_opt: profiled inside a running torch.profiler, which allocation "
                      "events cannot be taken beside: kernels' scratch is not counted in this "
                      "plan; steps run outside the profiler are planned again counting it",
                      RuntimeWarning, stacklevel=3)
    # the model's GPU the current one: CUDA events and the allocator's counters read the
    # current device (a DDP rank's model.to(rank) without set_device timed GPU 0's idle stream)
    on_device = torch.cuda.device(devices[0]) if devices else contextlib.nullcontext()
    with unset_fake_temporarily(), torch.no_grad(), recompute.kept_generators(joint), \
            torch.random.fork_rng(devices=devices, enabled=True), on_device, \
            pass_inputs.unwritten(primals):
        given, copied = iter(primals), pass_inputs.written(joint)  # NOTE [Buffers the pass
        #                                                            reads]: none, or copies
        inputs = [torch.empty(0) if is_effect_token(n) else
                  functools.partial(tangent_like, n.meta["val"], primals)  # NOTE [Output
                  if n.name.startswith("tangents") else  # gradients to their last use]
                  _copied(next(given), n.name in copied)
                  for n in joint.graph.find_nodes(op="placeholder")]
        scratch = Scratch()  # NOTE [An op's scratch in the bounded pass]
        memory_limit = _beside_states(memory_limit, devices)
        held = _warm_up(joint, inputs, memory_limit, scratch)  # NOTE [Warm allocator]
        measured, reruns, signatures, workspace, made_again, relaid = _run(
            joint, inputs, set(wanted), probe, budget, memory_limit, scratch)
    missing = [name for name in wanted if name not in measured]
    op_time = {**measured, **estimates([nodes[n] for n in missing],
                                        [nodes[n] for n in measured], measured)}
    budget.finish(len(missing))
    if missing:
        unmeasured = sum(t is None for t in probe.times)
        warnings.warn(
            f"monet_opt profiler: the profiling time limit ({time_limit_s} s) was reached after "
            f"{budget.done} of {len(wanted)} ops; {len(missing)} op times are estimates (from "
            f"output bytes) and {unmeasured} operator variant(s) were not measured and are not "
            "offered. Raise profile_time_limit_s (or leave it None) for a complete profile.",
            ProfileTimeLimitWarning, stacklevel=2)
    return ProfileResult(
        op_time_s=tuple(op_time.get(name, 0.0) for name in lowered.op_nodes),
        variant_costs=probe.costs(), variant_error=tuple(probe.error),
        variant_measured=tuple(t is not None for t in probe.times),
        estimated_ops=len(missing), reduced_ops=budget.reduced, timed_signatures=signatures,
        op_rerun_s=tuple(reruns.get(name) for name in lowered.op_nodes),
        op_workspace_bytes=tuple(workspace.get(name, (0,))[0] for name in lowered.op_nodes),
        op_first_workspace_bytes=tuple(workspace.get(name, (0, None))[1]
                                       for name in lowered.op_nodes),
        op_captured_workspace_bytes=tuple(workspace.get(name, (0, None, None))[2]
                                          for name in lowered.op_nodes),
        op_output_bytes=tuple(held.get(name) for name in lowered.op_nodes),
        made_again=made_again, relaid=tuple(relaid.items()))



def _beside_states(memory_limit: int | None, devices: list) -> int | None:
    """NOTE [Generator states beside the pass]
      While optimize() profiles a CPU step, three copies of the CPU generator's state (5,056 B
      each) are held beside the pass's values: profile()'s fork_rng, optimize()'s around the
      trace, and dynamo's preserve_rng_state around the export that calls the profiler (found
      by gc). A 6-block MLP with dropout peaked at a LayerNorm of the untimed pass 15,168 B
      above what the pass counted; so the pass keeps within the limit less them. A GPU's
      states are CPU tensors, not in its memory."""
    if memory_limit is None or devices:
        return memory_limit
    return memory_limit - 3 * torch.get_rng_state().untyped_storage().nbytes()


def _copied(t: torch.Tensor, copy: bool) -> torch.Tensor:
    return t.clone() if copy else t


def signature(target: Any, args: tuple, kwargs: dict) -> tuple:
    """What an op's time depends on: its target, each tensor argument's dtype, shape, stride
    and device, every other argument's value."""
    def describe(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return ("tensor", str(a.dtype), tuple(a.shape), tuple(a.stride()), str(a.device))
        return repr(a)
    return (str(target), repr(pytree.tree_map(describe, (args, kwargs))))


def _run(gm: fx.GraphModule, inputs: list[torch.Tensor], wanted: set[str],
         probe: VariantProbe, budget: Budget, memory_limit: int | None, scratch: Scratch
         ) -> tuple[dict[str, float], dict[str, float], int, dict[str, tuple], int, dict]:
    """One pass over `gm`: {op node: median seconds} of the ops reached before the time limit,
    the same of their recomputations where those run otherwise, how many distinct signatures
    were timed, {op node: (workspace bytes, first run's or None)}, how many values were made
    again to keep within `memory_limit` and {node: real strides} where not the trace's."""
    measured: dict[str, tuple] = {}  # op node -> its signature
    reruns: dict[str, tuple] = {}
    seen: dict[tuple, list[float]] = {}  # signature -> its samples (NOTE [Noisy samples])
    # signature -> its workspace bytes (NOTE [Workspace]) and its first run's where it differs
    workspace: dict[tuple, tuple[int, int | None]] = {}
    cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
    # beside an op's value: a timed recomputation's outputs, or a variant's and the op's
    # (NOTE [Profiling within the limit])
    copies = lambda node: 4 if probe.draws_at(node.name) else 3 if node.name in probe.at else \
        2 if recompute.reruns_otherwise(node) else 1  # noqa: E731
    sized: dict[str, tuple] = {}  # op node -> its signature, past the time limit

    def visit(node, args, kwargs, env) -> None:
        if not budget.over():
            return _measure_node(node, args, kwargs, env, measured, seen, wanted, probe,
                                 budget, cuda, reruns, workspace)
        target = cudnn_bn.kernel(node)  # NOTE [The profiling time limit]: memory still
        sig = signature(target, args, kwargs)
        if node.name in wanted and (cuda or alloc_events.enabled()) and sig not in workspace:
            env[node.name], workspace[sig] = _workspaces(node, target, args, kwargs, env, cuda)
        else:
            env[node.name] = target(*args, **kwargs)
        sized[node.name] = sig
    layouts = Layouts()  # NOTE [Writing into a tensor laid out otherwise than traced]
    try:
        made_again = _walk(gm, inputs, visit, keep_until=probe.keep_until(),
                           memory_limit=memory_limit, copies=copies, scratch=scratch,
                           layouts=layouts)
    finally:
        _flush.clear()  # held for the pass only (NOTE [Recomputation reads a cold input])
    median = {sig: statistics.median(samples) for sig, samples in seen.items()}
    return ({name: median[sig] for name, sig in measured.items()},
            {name: median[key] for name, key in reruns.items()},
            sum(k[-1] != _RERUN for k in seen),
            {name: workspace[sig] for name, sig in {**sized, **measured}.items()
             if sig in workspace}, made_again, layouts.relaid)


def _warm_up(gm: fx.GraphModule, inputs: list[torch.Tensor], memory_limit: int | None = None,
             scratch: Scratch | None = None) -> dict[str, tuple[int, ...]]:
    """NOTE [Warm allocator]
      The first pass over a graph in a process meets a cold allocator: on CPU, glibc maps
      fresh pages for large blocks until its thresholds adapt, and a page fault costs more than
      a memory-bound op itself (a 16 MiB add: 23 ms into fresh pages, 1.5 ms into reused ones,
      measured here). Training runs warm after its first step, so the profiler first runs the
      graph once untimed; then a ResNet-50's profiled adds measured 9 ms in every run, where
      a cold first profile measured 72-76 ms and later ones 9 ms.
      Returns {op node: the bytes each of its tensor outputs' storages holds} (NOTE [Outputs
      larger than their shapes] in monet_opt/output_bytes.py)."""
    held: dict[str, tuple[int, ...]] = {}

    cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)

    def run(node, args, kwargs, env):
        call = functools.partial(cudnn_bn.kernel(node), *args, **kwargs)
        # NOTE [An op's scratch in the bounded pass] in monet_opt/profile_memory.py
        out = env[node.name] = call() if memory_limit is None else \
            env.scratch.run(node, call, (args, kwargs), cuda)
        held[node.name] = output_bytes.held(out, (args, kwargs), node)
    _walk(gm, inputs, run, memory_limit=memory_limit, scratch=scratch)
    return held



def _measure_node(node: fx.Node, args, kwargs, env: dict, measured: dict[str, tuple],
                  seen: dict[tuple, list[float]], wanted: set[str], probe: VariantProbe,
                  budget: Budget, cuda: bool, reruns: dict[str, tuple],
                  workspace: dict[tuple, tuple[int, int | None]]) -> None:
    """Run `node` for its value; if the problem schedules it, time it (or, for a signature
    timed already, add this run to its samples) and take its workspace, and time its
    recomputation where that runs otherwise; then its variants. It runs the kernel the
    executor will (NOTE [cuDNN's BatchNorm])."""
    target = cudnn_bn.kernel(node)
    if node.name not in wanted and node.name not in probe.at:
        env[node.name] = target(*args, **kwargs)
        return
    sig = signature(target, args, kwargs)
    repeats = budget.repeats
    if sig in seen:  # warm already: the run for its value is one more sample
        env[node.name], again_s = _call(target, args, kwargs, cuda)
        seen[sig].append(again_s)
    else:
        repeats = budget.repeats_now()
        if repeats > 0:
            target(*args, **kwargs)  # the warm-up
            samples = _samples(target, args, kwargs, cuda, repeats)
        else:
            samples = [_call(target, args, kwargs, cuda)[1]]
        for s in samples:
            budget.timed(s)
        seen[sig] = samples
        # its value made last, after every timed call, so that one is held at a time (NOTE
        # [Profiling within the limit]): by the run that takes its workspace, after the timed
        # calls as cuDNN's benchmark search is over (NOTE [Workspace]; on CPU NOTE [Allocation
        # events])
        if cuda or alloc_events.enabled():
            env[node.name], workspace[sig] = _workspaces(node, target, args, kwargs, env, cuda)
        else:
            env[node.name] = target(*args, **kwargs)
    if node.name in wanted:
        measured[node.name] = sig
        rerun = recompute.rerun_args(node, args)
        if rerun is not None:
            key = (*sig, _RERUN)
            if key not in seen:
                target(*rerun, **kwargs)  # its warm-up: the forward never ran this form
                n = max(1, budget.repeats_now())  # under the time limit too (an op met before)
                seen[key] = _samples(target, rerun, kwargs, cuda, n) if cuda \
                    else _cold_samples(target, rerun, kwargs, n)
            reruns[node.name] = key
        budget.op_done(repeats)
    probe.measure(node, target, args, kwargs, env[node.name], sig, cuda, budget, env)


def _workspaces(node: fx.Node, target, args, kwargs, env: dict, cuda: bool
                ) -> tuple[Any, tuple[int, int | None, int | None]]:
    """`node`'s value, from the run that takes its workspace as the executor recomputes it;
    and that workspace with its forward run's where that differs (NOTE [A first run's
    workspace] in solvers/simulate.py) and that run's with its state captured (NOTE [The
    capture's copy]), else None; each with what a sparse input's transposed copy adds (NOTE
    [Sparse inputs])."""
    inputs = (env[n.name] for n in node.graph.nodes if n.op == "placeholder" and n.name in env)
    copies = sparse_copies(pytree.tree_leaves((args, kwargs)), inputs)
    taken = lambda run: counted(conv_split.as_traced(node, run), cuda,  # noqa: E731
                                (args, kwargs))
    first = captured = None
    if recompute.holds_state(node, kwargs):
        first = taken(functools.partial(target, *args, **kwargs))[1] + copies
        captured = taken(recompute.as_first_run(node, target, args, kwargs))[1] + copies
    value, workspace = taken(recompute.as_run(node, target, args, kwargs))
    return value, (workspace + copies, first, captured)


# NOTE [Noisy samples]
#   One op's time, reused for every op of its signature, was the median of three calls back
#   to back, and on this 2-core machine a burst of other work can slow two of three: ResNet-50
#   (b16, 128²) profiled three times in a row measured its four 2048-channel BatchNorm
#   backwards (one signature) at 5.5, 32.5 and 2.7 ms each, and its store-all step at 929,
#   1138 and 928 ms; inside a real step they took about 3 ms. So a signature's samples are
#   its timed calls plus the run for its value at every later op of that signature (spread
#   over the pass, and warm: the signature ran before), and where its first calls disagree
#   by more than SPREAD, as many again; its time is the median of them all.
SPREAD = 1.5


def _samples(target, args, kwargs, cuda: bool, n: int) -> list[float]:
    """n timed calls of target(*args, **kwargs), and n more where they disagree (NOTE [Noisy
    samples])."""
    out = [_call(target, args, kwargs, cuda)[1] for _ in range(n)]
    if n > 1 and max(out) > SPREAD * min(out):
        out += [_call(target, args, kwargs, cuda)[1] for _ in range(n)]
    return out


_RERUN = "recomputed"  # marks the signature of a recomputation's timing


# NOTE [Recomputation reads a cold input]
#   The one recomputation timed apart from its op, a split BatchNorm's normalization from its
#   kept statistics (NOTE [BatchNorm recomputed from its statistics] in bn_split.py), reads the
#   BatchNorm's input, which a plan recomputing it keeps: written in the forward, read in the
#   backward, long out of the cache. Timed back to back it is warm, and on the 2-core CPU
#   machine the same call takes 2.5-6x as long cold (docs/benchmarks/cold_inputs.md): DenseNet-
#   121 at half its activations, 40 such reruns a step, measured +5.6 % where +2.7 % was
#   predicted. So on a CPU each of its samples follows a write of FLUSH_BYTES (twice that
#   machine's 32 MiB L3). A GPU's kernels read device memory either way (its L2 holds a few
#   tens of MiB against activations of hundreds), and cuDNN's rerun is timed as before.
#   bench_ops, DenseNet-121 b16 128² at half its activations, two runs each, measured /
#   predicted over store-all: +4.6/+2.7 % and +5.9/+3.3 % before, +5.0/+4.1 % and
#   +5.1/+5.7 % after (docs/benchmarks/cold_inputs.md). A rerun whose input was itself just
#   recomputed reads it warm and is over-priced; in the plans seen the input is kept. The
#   buffer is written within a byte limit too, beside the pass: sized to the room the pass's
#   count leaves, or left out there, a step planned anew inside a training call stayed within
#   the limit (an LR-ASPP under 31 MB measured 91 MB in that call; torchvision probe,
#   2026-12-06), but profiles made under tight limits then timed these reruns warm, and
#   the plans made from them changed (tests/test_api.py's explain test lost its variants).
FLUSH_BYTES = 64 << 20
_flush: list[torch.Tensor] = []


def _evict_caches() -> None:
    """Write FLUSH_BYTES, so that what the next call reads comes from memory."""
    if not _flush:
        _flush.append(torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device="cpu"))
    _flush[0].fill_(1.0)


def _cold_samples(target, args, kwargs, n: int) -> list[float]:
    """n timed calls of target(*args, **kwargs), each after the caches were flushed (NOTE
    [Recomputation reads a cold input])."""
    out = []
    for _ in range(n):
        _evict_caches()
        out.append(_call(target, args, kwargs, False)[1])
    return out
