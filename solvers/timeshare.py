"""A time limit shared by heuristics run one after another.

NOTE [Heuristics in their time]
  "auto" ran its heuristics to their end before its shares of the limit began, which on the
  bench's models takes a second or two, but on a graph of thousands of ops far longer: an
  LSTM cell unrolled over 256 steps (9,731 ops) took 18 s in them (eviction's least peak
  11.5 s, Chen's greedy sweep 3.6 s), a window of fine windows 13 s to build, and auto asked
  for 30 s took 46 s. The heuristics that search now share AUTO_CHEAP_SHARE (in
  solvers/registry.py) of the limit by weight (WEIGHTS, below; the greedy sweep coarse to
  fine, eviction's rankings in half its time), keep what they found with the problem
  (problem.memo: the MILP's own warm start and a later solve go on from there), the MILP's
  limit is cut to what the phases after it leave (less a grace of AUTO_CHEAP_GRACE of the
  limit, which keeps the bench's models as they were), and the DP's sets and a window's
  program stop at their deadlines. On that
  LSTM at 60 % of eager's peak: 46.2 s -> 30.0 s (predicted step 0.2729 -> 0.2782 s; given
  46 s, 0.2725 s); at half its activations, where nothing fits, 52.7 -> 37.7 s (the MILP's
  own preparation). GoogLeNet and ResNet-50 (docs/benchmarks/problems_cpu.json.gz) at half
  and a third of their activations: the same least peaks, +6.57/+17.12 -> +6.49/+18.58 % and
  +4.05/+10.58 -> +4.05/+9.98 % predicted (an earlier run of the old code: +19.77 % at a
  third on GoogLeNet), each in 27-28 s as before.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterator, Sequence

# the heuristics that search, and their weights in sharing the time (eviction's least-peak
# search takes several times the greedy sweep's time); the others run one simulation
WEIGHTS = {"chen_greedy": 1.0, "evict": 3.0, "remat": 3.0}


def limits(names: Sequence[str], deadline: float) -> Iterator[float | None]:
    """For each of `names` in turn, read as it starts: its time limit (its weight's part of
    the time left to `deadline`, over the weights of those still to run), or None for one
    that does not search."""
    for k, name in enumerate(names):
        weight = WEIGHTS.get(name)
        if weight is None:
            yield None
            continue
        left = sum(WEIGHTS.get(n, 0.0) for n in names[k:])
        yield max(0.0, deadline - time.perf_counter()) * weight / left


# NOTE [Short limits]
#   Each program auto solves (the least-peak programs, the MILP, polishing) was given at least a
#   second however short the limit, so below about 10 s the limit did not hold: a 2-layer
#   GPT-2 (195 ops) at half its activations took 5.1-6.5 s asked for 0.5-5 s (docs probe,
#   2026-12-05; solver="milp" asked for 2 s took 4.5 s). That least time is now a tenth of the
#   limit, at most a second (the same from 10 s up): auto's limit, or the MILP's own.
def program_floor(limit_s: float) -> float:
    """The least time each of auto's programs gets under a limit of `limit_s` (NOTE [Short
    limits])."""
    return min(1.0, limit_s / 10)


def with_floor(options):
    """MilpOptions `options` with min_program_s given: program_floor of its time_limit_s where
    it is None (the MILP asked for alone; auto gives its own)."""
    if options.min_program_s is not None:
        return options
    return dataclasses.replace(options, min_program_s=program_floor(options.time_limit_s))
