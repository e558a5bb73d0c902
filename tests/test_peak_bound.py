"""NOTE [A least peak from sizes] (solvers/peak_bound.py): below the peak of every schedule,
whatever it keeps, recomputes or chooses among variants; exact where one op sets the least
peak. No torch."""
from __future__ import annotations

import gzip
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from solvers import Op, Problem, Schedule, Tensor, schedule_from_kept, simulate, solve
from solvers.peak_bound import least_peak_bound
from tests.problems import autodiff_problem, chain, with_masks, with_overwrites

SOLVERS = ("auto", "milp", "dp", "evict", "remat", "chen", "checkmate")


def test_a_chain_by_hand():
    # chain(4): fixed 100, 10-byte activations, gradients and tangent. The first backward op
    # reads the tangent and a2 and makes g3: 100 + 30, and no schedule does with less.
    p = chain(4)
    bound = least_peak_bound(p)
    assert (bound.bytes, bound.op) == (130, "b3")
    assert solve(p, 130, "milp").feasible and not solve(p, 129, "milp").feasible


def test_gradients_made_before_are_held():
    # b1 makes the 50-byte gradient w1 (returned), then b0 reads its other output g1 with a0
    # and makes w0: while b0 runs, w1 is alive whatever the order.
    tensors = (Tensor("a0", 10, 0), Tensor("a1", 10, 1), Tensor("tangent", 10, -1),
               Tensor("g1", 10, 2), Tensor("w1", 50, 2), Tensor("w0", 50, 3))
    ops = (Op("f0", False, 1.0, (), (0,)), Op("f1", False, 1.0, (0,), (1,)),
           Op("b1", True, 1.0, (2, 0), (3, 4)), Op("b0", True, 1.0, (3,), (5,)))
    p = Problem(ops, tensors, fixed_bytes=100, forward_outputs=(1,), backward_outputs=(4, 5))
    bound = least_peak_bound(p)
    assert (bound.bytes, bound.op) == (100 + 10 + 50 + 50, "b0")
    assert simulate(p, Schedule(frozenset({0}), (2, 3))).peak_bytes == bound.bytes


def test_accumulating_in_place_is_counted_as_the_simulator_does():
    # tests/test_solvers.py's _accumulating: acc(g1, g2) written into g2 holds 80 + 40 - 40;
    # b2 alone (it need not follow b1) 10 + 40; the least peak, 190, has both.
    tensors = (Tensor("a0", 10, 0), Tensor("tangent", 10, -1), Tensor("g1", 40, 1),
               Tensor("g2", 40, 2), Tensor("s", 40, 3))
    ops = (Op("f0", False, 1.0, (), (0,)), Op("b1", True, 1.0, (1, 0), (2,)),
           Op("b2", True, 1.0, (1,), (3,)), Op("acc", True, 1.0, (2, 3), (4,), inplace_bytes=40))
    p = Problem(ops, tensors, fixed_bytes=100, forward_outputs=(0,), backward_outputs=(4,))
    assert least_peak_bound(p).bytes == 180
    assert least_peak_bound(replace(p, ops=ops[:3] + (replace(ops[3], inplace_bytes=0),))
                            ).bytes == 220


def _random_problem(seed: int) -> Problem:
    """A random step with variants, inputs written into, and several gradients returned."""
    rng = random.Random(seed)
    p = autodiff_problem(rng.randint(1, 16), rng, fixed=rng.randint(0, 500), name=f"pb{seed}")
    if rng.random() < 0.5:
        p = with_overwrites(p, rng)[0]
    made = [t for i in p.backward_ops for t in p.ops[i].outputs]
    p = replace(p, backward_outputs=tuple(sorted(set(p.backward_outputs) | set(
        rng.sample(made, rng.randint(0, len(made)))))))
    return with_masks(p, rng) if rng.random() < 0.6 else p


@pytest.mark.parametrize("seed", range(40))
def test_no_schedule_peaks_below_it(seed):
    p = _random_problem(seed)
    bound = least_peak_bound(p).bytes
    rng = random.Random(seed)
    forward = list(p.forward_tensors)
    for _ in range(8):  # schedules keeping anything, with any variants
        kept = frozenset(rng.sample(forward, rng.randint(0, len(forward))))
        chosen = {}
        for v, var in enumerate(p.variants):
            if rng.random() < 0.5:
                chosen.setdefault(var.group, v)
        plain = p.with_variants(frozenset(chosen.values()))
        schedule = replace(schedule_from_kept(plain, kept), variants=frozenset(chosen.values()))
        assert simulate(p, schedule).peak_bytes >= bound
    reported = []
    for solver in SOLVERS:  # each solver's least peak, asked for below everything
        r = solve(p, p.fixed_bytes, solver, time_limit_s=2)
        # under load a time-limited solver may end with no least peak to report (None: a
        # fresh-clone CI run beside a benchmark); one it reports is above the bound
        assert r.min_feasible_bytes is None or r.min_feasible_bytes >= bound, (solver, bound)
        reported.append(r.min_feasible_bytes is not None)
    assert all(reported[SOLVERS.index(s)] for s in ("evict", "remat", "chen"))  # no time limit


def test_the_profiled_problems_least_peaks_are_above_it():
    """GoogLeNet (b32 128²) and ResNet-50 (b16 128²) as profiled on the CPU: the bound sees
    more than the floor (parameters, inputs and gradients), and auto's least peak is above (in
    30 s alone: 160.0 and 278.9 MB against bounds of 155.9 and 249.9; in 5 s beside other
    tests it has ended at 340.7 MB on ResNet-50, so no closeness is asserted)."""
    path = Path(__file__).resolve().parents[1] / "docs/benchmarks/problems_cpu.json.gz"
    with gzip.open(path, "rt") as f:
        saved = json.load(f)["problems"]
    for key in saved:
        p = Problem.from_json(saved[key]["problem"])
        floor = p.fixed_bytes + sum(p.tensors[t].bytes for t in set(p.backward_outputs))
        bound = least_peak_bound(p)
        least = solve(p, floor, "auto", time_limit_s=5).min_feasible_bytes
        assert floor < bound.bytes <= least, key
