"""Operator variants measured where their backward op runs, and how far a result is from another.

NOTE [Variants timed beside their op]
  A variant's cost to the plan is its time minus its op's. The op's time is the median over
  the profiling pass: its first calls back to back, then one run at every later op of its
  signature, each in its place in the step, where what it reads has long left the cache (NOTE
  [Noisy samples] in monet_opt/profiler.py). The variant was timed only back to back, right
  after encoding, its inputs warm. So the difference favoured every variant: on DenseNet-121 at
  batch 2 x 32² (CPU), 40 ReLUs' threshold_backward, one signature, took 7.6 us by the pass's
  median against 2.9 us back to back, and their 1-bit-sign-as-bool variant (an `le` in the
  forward, a `where` in the backward) 3.5 + 2.7 us: predicted 1.4 us faster each, all 40 were
  chosen at an unlimited budget, and the step measured 1 ms slower than without them (46.8
  against 45.8 ms, least of 40 interleaved rounds; `where` alone took 14.8 us against
  threshold_backward's 2.9 at that shape, timeit). Now the op is timed again beside its
  variant, the three calls interleaved (op, encode, variant) at the same site, and the
  variant's extra time is the difference of those medians: like against like.

NOTE [Workspace written into]
  Where the step runs a variant writing its op's result into the op's dying first argument
  (NOTE [A ReLU's mask and its gradient in place] in monet_opt/variants_bits.py), its
  workspace is measured so, on a copy of that argument: what the variant makes beside its
  result is not what it makes with none. A dropout's 1-bit mask is unpacked before the
  multiplication: made anew, the step held the unpacked mask beside dx (a workspace of one
  byte per element), but written into dy it held the unpacking's two temporaries (two bytes
  per element) with no dx. The plan, priced with the first, measured over its prediction
  (an RNN with dropout, tests/test_eager_kernels.py: 22,496 B for 21,912 B; one full test
  run measured it over its limit, likely so); a ReLU's 1-bit mask the same (ResNet-18's stem
  ReLU at batch 16, 112²: 3 MiB).
"""
from __future__ import annotations

import functools
import operator
import statistics
import time

import torch
import torch.fx as fx

from monet_opt import variants
from monet_opt.errors import VariantGuardError
from monet_opt.lower import Lowered
from monet_opt.memory import counted
from monet_opt.profile_budget import Budget


class VariantProbe:
    """Samples for the variants at the backward nodes they replace."""

    def __init__(self, lowered: Lowered) -> None:
        self.at: dict[str, list[int]] = {}
        for v, site in enumerate(lowered.variant_sites):
            self.at.setdefault(site.backward_node, []).append(v)
        self.sites = lowered.variant_sites
        self.written_into = dict(lowered.inplace)  # NOTE [Workspace written into]
        n = len(self.sites)
        self.times: list[tuple[float, float] | None] = [None] * n  # (encode, extra s)
        self.workspace = [(0, 0)] * n
        self.error = [float("inf")] * n  # inf: not measured
        self.seen: dict[tuple, tuple[float, float]] = {}

    def draws_at(self, name: str) -> bool:
        """Whether a variant at node `name` draws its op's forward again (NOTE [Generator-state
        replay]): the pass holds that draw's result beside the variant's and the op's."""
        return any(variants.family(self.sites[v].family).draw is not None
                   for v in self.at.get(name, ()))

    def keep_until(self) -> dict[str, str]:
        """Forward values a family reads in its op's argument's place -> the backward node
        they must live until."""
        return {site.reads: site.backward_node for site in self.sites if site.reads is not None}

    def measure(self, node: fx.Node, target, args, kwargs, result, sig: tuple, cuda: bool,
                budget: Budget, env: dict) -> None:
        for v in self.at.get(node.name, ()):
            site = self.sites[v]
            fam = variants.family(site.family)
            x = args[site.arg]
            replacement = functools.partial(variants.run, (site.family,), (site.params,))
            enc_fn = None if fam.encode is None else \
                functools.partial(fam.encode, x, *site.params)
            # one counted run: workspace and the relative error (also the warm-up)
            enc, enc_ws = counted(enc_fn, cuda, (x, site.params)) if enc_fn else \
                (site.like if site.reads is None else env[site.reads], 0)
            want = result
            if fam.draw is not None:  # NOTE [Generator-state replay]: the state's own draw
                drawn = fam.draw(*site.params)
                want = node.target(*(drawn if k == site.arg else a for k, a in enumerate(args)),
                                   **kwargs)
            new_args = tuple(enc if k == site.arg else a for k, a in enumerate(args))
            try:
                out, run_ws = counted(functools.partial(replacement, *new_args, **kwargs), cuda,
                                      (new_args, kwargs))
            except VariantGuardError:  # e.g. NOTE [BatchNorm from its output]
                continue
            self.error[v] = relative_error(out, want, used_outputs(node))
            del out
            if variants.writes_into((site.family,)) and self._writes(node, args, result):
                run_ws = _workspace_written_into(site, new_args, kwargs, cuda)
            self.workspace[v] = (enc_ws, run_ws)
            key = (site.family, repr(site.params), sig)
            if key not in self.seen:  # NOTE [Variants timed beside their op]
                n = max(1, budget.repeats_now())
                enc_s, run_s, op_s = [], [], []
                for _ in range(n):
                    op_s.append(timed_call(target, args, kwargs, cuda)[1])
                    enc_s.append(timed_call(enc_fn, (), {}, cuda)[1] if enc_fn else 0.0)
                    run_s.append(timed_call(replacement, new_args, kwargs, cuda)[1])
                self.seen[key] = (statistics.median(enc_s),
                                  statistics.median(run_s) - statistics.median(op_s))
            self.times[v] = self.seen[key]

    def _writes(self, node: fx.Node, args: tuple, result) -> bool:
        """Whether the step writes `node`'s result into its argument: where the lowering said
        so and the real layouts agree (NOTE [Writing into a tensor laid out otherwise than
        traced] in monet_opt/misread_layouts.py)."""
        k = self.written_into.get(node.name)
        return k is not None and isinstance(result, torch.Tensor) and \
            result.stride() == args[k].stride()  # NOTE [Strides along a dimension of 1]

    def costs(self) -> tuple[tuple[float, int, float, int], ...]:
        """Per variant: (encode s, encode workspace, run minus its op's time s, run workspace);
        zeros where not measured."""
        zero = (0.0, 0.0)
        return tuple((enc_s, enc_ws, extra_s, run_ws) for (enc_s, extra_s), (enc_ws, run_ws)
                     in zip((t or zero for t in self.times), self.workspace))


def _workspace_written_into(site, args: tuple, kwargs: dict, cuda: bool) -> int:
    """The workspace of the variant at `site` writing its result into a copy of its op's
    first argument (NOTE [Workspace written into])."""
    args = (args[0].clone(), *args[1:])
    fn = functools.partial(variants.run_into, (site.family,), (site.params,), *args, **kwargs)
    return counted(fn, cuda, (args, kwargs))[1]


def used_outputs(node: fx.Node) -> frozenset[int] | None:
    """Which outputs of a multi-output node the graph reads (None: all). Unread ones may hold
    anything: convolution_backward returns a tensor for a gradient its output_mask declined."""
    val = node.meta.get("val")
    if not isinstance(val, (tuple, list)):
        return None
    return frozenset(u.args[1] for u in node.users if u.target is operator.getitem)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Strides alike but in dimensions of length 1, which no element is laid out by: a
    channels-last squeeze-excitation's [2, 2, 1, 1] ReLU strided (2, 1, 2, 2) by its variant
    and (2, 1, 1, 1) by its op had each of its 1-bit masks refused (RegNet-Y: 32 of them;
    torchvision probe, 2026-12-06)."""
    return all(x == y for n, x, y in zip(a.shape, a.stride(), b.stride()) if n > 1)


def relative_error(got, want, only: frozenset[int] | None = None) -> float:
    """0.0 when `got` is bitwise `want` (tensors or tuples of them, the outputs in `only`
    if given; NaNs where want has them); else the largest max-abs relative error over the
    outputs; inf when shapes, strides (the graph's views of an output expect its layout),
    dtypes or the NaN/inf pattern differ."""
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
                a.shape != b.shape or a.dtype != b.dtype or not _same_layout(a, b):
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


def timed_call(target, args, kwargs, cuda: bool):
    """(target(*args, **kwargs), its time in s: CUDA events on a GPU, else the wall clock, or
    the thread's CPU time where less and torch runs on this thread alone (NOTE [Timed on a
    busy CPU])."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = target(*args, **kwargs)
        end.record()
        end.synchronize()
        return out, start.elapsed_time(end) / 1e3
    alone = torch.get_num_threads() == 1
    c0, t0 = time.thread_time() if alone else 0.0, time.perf_counter()
    out = target(*args, **kwargs)
    wall = time.perf_counter() - t0
    return out, min(wall, time.thread_time() - c0) if alone else wall


# NOTE [Timed on a busy CPU]
#   On a CPU shared with other work, an op longer than the scheduler's slice is preempted, and
#   the wall clock counts the other processes' time as its own: a ViT profiled under a load of
#   4 on 2 cores priced its matmuls at 3.1x what a quiet profile did (mm 168 ms against 66),
#   ops under 0.5 ms at 1.4x, and its store-all step at 404 ms against 157, so a plan's
#   recomputation (mostly small ops) was predicted at +5.4 % where it measured +12.5 % over
#   store-all (timing probe, 2026-12-07). Where torch runs its ops on the calling thread
#   (torch.get_num_threads() == 1, as OMP_NUM_THREADS=1 sets), that thread's CPU time is the
#   op's own, whatever else runs: the lesser of the two is taken. With more threads the op's
#   work is spread over threads this one does not see, and the wall clock stays.
