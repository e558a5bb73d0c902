"""A time limit shared by heuristics run one after another (NOTE [Heuristics in their time] in
solvers/registry.py)."""
from __future__ import annotations

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
