"""How much profiling fits in `optimize(..., profile_time_limit_s=...)`, and the estimates for
the ops it leaves unmeasured.

NOTE [The profiling time limit]
  With `time_limit_s`, each op gets the most repeats (from `repeats` down to one) that the
  projected rest of the pass (ops left x (1 + repeats) x the mean measured call) still fits in
  the time left; when not even one does, the op's value-making call is its only, cold,
  measurement. When the time is up the pass stops: every op not reached gets an estimate
  proportional to its output bytes, at the time-per-byte of the ops of the same ATen target
  measured already, else of all ops measured (an op without output bytes: the median time of
  those ops). Variants not reached are not measured and not offered to the solver. A
  `ProfileTimeLimitWarning` says how many ops were estimated. The ops not reached still run
  once and their workspace (a kernel's scratch, NOTE [Workspace] in monet_opt/memory.py) is
  measured: it was left 0, and a CNN's plan under `profile_time_limit_s=0.05` predicted
  3,331,104 B and measured 4,379,680 B, 714,727 B over its limit (2026-12-04).
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

PROGRESS_AFTER_S = 2.0   # print progress lines on stderr once profiling has taken this long
PROGRESS_EVERY_S = 5.0
FIRST_REPEATS = 3  # the first op's timed runs under a time limit, before any mean is known


class Budget:
    """How many repeats the next op gets under the time limit; progress lines on stderr."""

    def __init__(self, repeats: int, time_limit_s: float | None, total: int, name: str) -> None:
        self.repeats, self.limit_s, self.total, self.name = repeats, time_limit_s, total, name
        self.start = time.perf_counter()
        self.done = 0
        self.call_s = 0.0
        self.calls = 0
        self.reduced = 0
        self.last_report = self.start + PROGRESS_AFTER_S - PROGRESS_EVERY_S
        self.reported = False

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def over(self) -> bool:
        """The time limit is up (never before the first op is measured)."""
        return self.limit_s is not None and self.done > 0 and self.elapsed_s() >= self.limit_s

    def repeats_now(self) -> int:
        """Timed runs for the next op after its warm-up; 0: one timed run, no warm-up."""
        if self.limit_s is None:
            return self.repeats
        if self.calls == 0:  # nothing timed yet to project from: a few (100,000 repeats of
            return min(self.repeats, FIRST_REPEATS)  # the first op ran past 300 s of a 1 s limit)
        mean = self.call_s / self.calls
        left_s = self.limit_s - self.elapsed_s()
        ops_left = max(1, self.total - self.done)
        for r in range(self.repeats, 0, -1):
            if ops_left * (1 + r) * mean <= left_s:
                return r
        return 0

    def timed(self, seconds: float) -> None:
        self.call_s += seconds
        self.calls += 1

    def op_done(self, repeats: int) -> None:
        self.done += 1
        self.reduced += repeats < self.repeats
        now = time.perf_counter()
        if now - self.last_report >= PROGRESS_EVERY_S:
            self.last_report = now
            self.reported = True
            print(f"monet_opt: profiling {self.name}: {self.done}/{self.total} ops, "
                  f"{now - self.start:.0f} s", file=sys.stderr, flush=True)

    def finish(self, estimated: int) -> None:
        if self.reported:
            more = f", {estimated} estimated" if estimated else ""
            print(f"monet_opt: profiled {self.name}: {self.done} ops in "
                  f"{self.elapsed_s():.0f} s{more}", file=sys.stderr, flush=True)


def estimates(missing: list[fx.Node], done: list[fx.Node],
               measured: dict[str, float]) -> dict[str, float]:
    """NOTE [The profiling time limit]: times for the ops not reached, from output bytes."""
    if not missing:
        return {}
    by_target: dict[str, list[fx.Node]] = {}
    for node in done:
        by_target.setdefault(str(node.target), []).append(node)
    out = {}
    for node in missing:
        peers = by_target.get(str(node.target)) or done
        size = _output_bytes(node)
        peer_bytes = sum(_output_bytes(p) for p in peers)
        if size and peer_bytes:
            out[node.name] = sum(measured[p.name] for p in peers) / peer_bytes * size
        else:
            out[node.name] = statistics.median(measured[p.name] for p in peers) if peers else 0.0
    return out


def _output_bytes(node: fx.Node) -> int:
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(node.meta.get("val"))
               if isinstance(t, torch.Tensor))
