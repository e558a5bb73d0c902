"""Choosing operator variants outside the MILP: the plain problem a variant-blind solver sees,
and the cheap "lightest forms" choice the heuristics are also run with."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from solvers.problem import Problem
from solvers.schedule import SolveResult, Status, gap_of


def lightest(problem: Problem) -> frozenset[int]:
    """Per (op, replaced tensor): the variant whose reads take the fewest bytes, if fewer than
    the tensor it replaces (ties: the faster one)."""
    best: dict[tuple[int, int], tuple[int, float, int]] = {}
    for v, var in enumerate(problem.variants):
        size = sum(problem.tensors[t].bytes for t in var.reads)
        if size >= problem.tensors[var.replaces].bytes:
            continue
        key = (size, problem.variant_time_s(v), v)
        if var.group not in best or key < best[var.group]:
            best[var.group] = key
    return frozenset(k[2] for k in best.values())


def fastest(problem: Problem) -> frozenset[int]:
    """Per (op, replaced tensor): the variant that saves the most time, if any saves time
    (another implementation of an op, NOTE [Other implementations] in monet_opt; an encoding
    whose op runs faster). With them, keeping everything can beat keeping everything plainly."""
    best: dict[tuple[int, int], tuple[float, int]] = {}
    for v, var in enumerate(problem.variants):
        key = (problem.variant_time_s(v), v)
        if key[0] < 0 and (var.group not in best or key < best[var.group]):
            best[var.group] = key
    return frozenset(k[1] for k in best.values())


def useless(problem: Problem) -> frozenset[int]:
    """NOTE [Variants that cannot pay]: variants no faster than their op that read, in place
    of the tensor t they replace, either t itself (another implementation of the op) or
    tensors the forward makes anyway from t, of no fewer bytes, that no other backward op reads
    and the forward does not return (MONeT's output-activated BatchNorm where nothing else
    keeps the output: a ReLU after it keeps its own output). Keeping those instead of t holds
    at least as many bytes from the moment t could go, and the op runs no faster; offered, they
    only widen the search (53 of them on ResNet-50). One whose run needs less workspace than
    its op may pay in memory (NOTE [A variant's workspace below its op's] in
    solvers/variant_checks.py: another convolution backend) and is not among them."""
    read_elsewhere: dict[int, int] = {}
    for i in problem.backward_ops:
        for t in set(problem.ops[i].inputs):
            read_elsewhere[t] = read_elsewhere.get(t, 0) + 1
    out = set()
    for v, var in enumerate(problem.variants):
        if problem.variant_time_s(v) < 0 or var.encode_ops or var.extra_workspace_bytes < 0:
            continue
        if var.reads == (var.replaces,):
            out.add(v)
            continue
        made_from = all(var.replaces in problem.ops[problem.tensors[r].producer].inputs
                        for r in var.reads)
        alone = all(read_elsewhere.get(r, 0) <= (r in problem.ops[var.op].inputs)
                    and r not in problem.forward_outputs for r in var.reads)
        size = sum(problem.tensors[r].bytes for r in var.reads)
        if var.reads and made_from and alone and size >= problem.tensors[var.replaces].bytes:
            out.add(v)
    return frozenset(out)


def run_with(fn: Callable[[Problem, int, Any], SolveResult], problem: Problem, budget_bytes: int,
             options: Any, chosen: frozenset[int] = frozenset()) -> SolveResult:
    """Run a variant-blind solver on the plain problem with `chosen` in use; its schedule then
    names them, so it runs (and simulates the same) on `problem` itself."""
    result = fn(problem.with_variants(chosen), budget_bytes, options)
    if not problem.variants:
        return result
    bound = problem.no_recompute_time_s  # the plain problem's bound ignores other variants
    if result.bound_s is not None:
        bound = min(bound, result.bound_s)
    gap = result.gap
    if result.objective_s:
        gap = gap_of(result.objective_s, bound)
    status = result.status
    if status is Status.OPTIMAL and gap > 0:
        status = Status.FEASIBLE
    schedule, floor = (s if s is None else dataclasses.replace(s, variants=chosen)
                       for s in (result.schedule, result.floor_schedule))
    return dataclasses.replace(result, schedule=schedule, bound_s=bound, gap=gap, status=status,
                               floor_schedule=floor)
