"""Buffers the step updates, copied first where a recomputation may read them.

NOTE [Buffers the step updates]
  A forward that updates a buffer in place (spectral_norm's power iteration writes its vectors
  u and v with out=; quantization-aware training's observers their scales and ranges) is traced
  as a functional graph, and AOTAutograd copies the new values into the buffer once the forward
  has run. An op that read the buffer's old value would, recomputed in the backward, read the
  new one: autograd's version check caught it ("modified by an inplace operation"), so a
  spectral-normed CNN at its least limit failed at its first backward (torch.nn.utils.
  spectral_norm and parametrizations.spectral_norm alike). So each such buffer that an op a
  schedule could recompute reads (a forward ancestor of what the backward reads) is copied as
  the forward begins, the backward reads that copy in its place, and the copy's bytes are
  fixed memory of the step; a copy nothing reads is not made (NOTE [Copies nothing reads]).
  Where the update is an op's whole output (MoCo moving its key encoder toward its query
  encoder), the copy is of weights: two small conv encoders, 5.6 KB of a 320 KB step
  (docs/benchmarks/updated_buffers.md). Reading the
  buffer itself in the backward wherever it would read the buffer's new value (it holds it once
  the forward is done), so that only ops reading the old value need a copy, failed autograd's
  version check on the buffer the forward saved: tried and dropped.
  BatchNorm's running statistics need none of this (NOTE [Recomputing BatchNorm] in
  monet_opt/recompute.py: its recomputation does not read them), nor its num_batches_tracked
  count, which feeds nothing the backward reads. An op that reads the old value, pinned
  instead (its outputs fixed memory, never recomputed), over-counted quantization-aware
  training's every fake-quantized activation for the whole step.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch.fx as fx

import solvers
from solvers import baselines
from solvers.baselines import BaselineOptions
from monet_opt import kept_states, phase, recompute
from solvers import Problem, Schedule, SolveResult, Status, simulate

# NOTE [Copies nothing reads]
#   A copy of an updated buffer is read only by what the schedule runs in the backward on the
#   buffer's old value: recomputations of ops that read it, and backward ops that do. Under a
#   schedule that runs none (store-all, and most plans that recompute little), nothing reads
#   the copy and the forward graph's dead code pass drops it, so the step never makes it; the
#   plan counted its bytes as fixed memory for the whole step all the same, a predicted peak
#   over the measured one by the copies' bytes (a conv net whose forward changes two weights
#   in place under no_grad, `mul_(0.99)` and `add_(0.01)`: 2,304 B over 64,152; a max-norm
#   embedding of 200 x 16: 12,800 B over 40,664). The copies the partitioned forward still
#   makes are the ones the plan now counts (both of those exact); the solver counted them all,
#   so the plan is within the limit either way. A copy that is made is still counted to the
#   step's end, where the backward frees it after its last read: where the step peaks after
#   that, the prediction stays over by its bytes.
MADE = "monet_snapshot"  # node meta: the placeholder whose copy this forward node is


def as_made(problem: Problem, result: SolveResult, forward: fx.GraphModule,
            lowered) -> tuple[Problem, SolveResult]:
    """`problem` and `result` with the fixed bytes of the copies `forward` does not make (NOTE
    [Copies nothing reads]); as they are where it makes every one. The generator states the
    step makes are the simulator's to tell (NOTE [States kept only where used] in
    monet_opt/recompute.py). Its least peak is at most its own."""
    made = {node.meta[MADE] for node in forward.graph.nodes if MADE in node.meta}
    unmade = sum(size for name, size in zip(lowered.snapshots, lowered.snapshot_sizes)
                 if name not in made)
    problem = dataclasses.replace(problem, fixed_bytes=problem.fixed_bytes - unmade)
    peak = simulate(problem, result.schedule).peak_bytes  # less than counted, where unmade
    least = result.min_feasible_bytes
    return problem, dataclasses.replace(result, peak_bytes=peak, min_feasible_bytes=peak
                                        if least is None else min(least, peak))


def uncopied(problem: Problem, lowered) -> Problem:
    """`problem` without the copies' fixed bytes: the store-all step, which makes none, that a
    share of the activations is of, and what bounds every schedule's peak from below (NOTE
    [Copies counted as made])."""
    lighter = problem.stateless()
    return dataclasses.replace(lighter, fixed_bytes=lighter.fixed_bytes - lowered.snapshot_bytes)


# NOTE [Copies counted as made]
#   The solver counts every copy as fixed memory (it cannot tell which a schedule reads), so a
#   limit between store-all's peak with the copies and without them was refused, with a least
#   peak over store-all's by the copies' bytes, though store-all makes none (an Embedding with
#   max_norm: its whole table; a 32x64 buffer updated in place: least 55,464 B where store-all
#   measured 49,040 B; layer zoo and aliasing hunts, 2026-12-02). Where no schedule fits with
#   every copy counted, the problem is solved again without them, and its schedule is taken if
#   it fits with the copies its forward does make (NOTE [Copies nothing reads]); where none
#   fits either, the least peak reported is the lesser of the two solves' (the second's least
#   schedule with the copies it makes): an input dropped out in place (its copy counted) was
#   refused with a least of 70,940 B where a plan at a larger limit measured 54,520 (fuzz).
#   Store-all, which makes no copy, is among them (and taken where it fits): a forward that
#   clamps a weight in place, whose every recomputing schedule makes its copy, was refused
#   below 55,560 B, where store-all measured 53,640 B (ops probe, 2026-12-05).
#   A share of the activations, and the bound from sizes the error gives (NOTE [A least peak
#   from sizes] in solvers/peak_bound.py), are of the step without copies too: with them, an
#   Embedding with max_norm (its table copied) was refused at 1 B saying "the step's sizes
#   alone need 125.80 KiB" and to raise the limit "to at least 97.07 KiB", which then planned
#   and measured 97.07 KiB; and "10% of activations" of an EmbeddingBag with max_norm came to
#   57,915 B, above its store-all step (53,000 B), so every share planned store-all.
def may_fit(lowered, result: SolveResult, limit: int) -> bool:
    """Whether an infeasible `result` is worth solving again without the fixed bytes a schedule
    may not make (NOTE [Copies counted as made]): where there are copies, or where the least
    peak less the generator states (NOTE [States kept only where used] in recompute.py) is
    within the limit (they are on every CPU step with dropout: a second solve each time an
    infeasible limit is asked for, as largest_batch asks, only where it can help)."""
    least = result.min_feasible_bytes
    return bool(lowered.snapshot_bytes) or bool(lowered.states) and least is not None and \
        least - lowered.conditional_bytes <= limit


def store_all_if_fits(problem: Problem, limit: int, lowered,
                      result: SolveResult) -> SolveResult:
    """Store-all where it fits `limit` without the fixed bytes a schedule may not make (it
    makes none of them) and `result` is auto's and recomputes, or found nothing: the fastest
    schedule, which the solvers, counting every copy and state, refused or passed over (auto
    recomputed 4 ops, 4.5 % slower, at store-all's own peak; fuzz, 2026-12-06); and its peak
    among the least peaks an infeasible `result` reports (it reported one over store-all's by
    a state)."""
    if not lowered.conditional_bytes or result.feasible and (
            not result.solver.startswith("auto") or not result.schedule.variants and
            all(problem.ops[i].is_backward for i in result.schedule.backward)):
        return result  # a solver named is answered with its own schedule
    store_all = baselines.store_all(uncopied(problem, lowered), 2**62, BaselineOptions())
    least, floor = _least_of(result, [(store_all.peak_bytes, store_all.schedule)])
    # as the solvers saw it: every state counted
    counted = simulate(kept_states.all_counted(problem), store_all.schedule).peak_bytes
    if store_all.peak_bytes <= limit < counted:  # refused only for what it does not make
        return dataclasses.replace(store_all, min_feasible_bytes=least, peak_bytes=counted,
                                   solver=f"{result.solver.split(':')[0]}:store_all",
                                   floor_schedule=floor)
    if result.feasible or result.min_feasible_bytes is None:  # none found: said so
        return result
    return dataclasses.replace(result, min_feasible_bytes=least, floor_schedule=floor)


def _least_of(result: SolveResult, found: list[tuple[int, Schedule]]
              ) -> tuple[int, Schedule | None]:
    """The least of `result`'s least peak and `found` (peak, schedule) pairs, with the
    schedule that meets it (None: `result`'s, unknown), so that a later call at it is met
    (NOTE [Least peaks recalled in the process] in solvers/remembered.py; a retry's least was
    said without it, and a call at it refused again: state accounting probe, 2026-12-06)."""
    if result.min_feasible_bytes is not None:  # ties go to it
        found = [(result.min_feasible_bytes, result.floor_schedule), *found]
    return min(found, key=lambda pair: pair[0])


def retried(problem: Problem, limit: int, lowered, result: SolveResult,
            solve: Callable[[Problem], SolveResult],
            partition: Callable[[Schedule], tuple[fx.GraphModule, fx.GraphModule]]
            ) -> SolveResult:
    """`result`, or where it is infeasible a schedule solved without the copies that fits
    `limit` with those it makes, or store-all where it fits (NOTE [Copies counted as made])."""
    def made_peak(schedule: Schedule) -> int:  # with the copies its forward makes
        made, _ = as_made(problem, dataclasses.replace(result, schedule=schedule),
                          partition(schedule)[0], lowered)
        return simulate(made, schedule).peak_bytes

    again = solve(uncopied(problem, lowered))
    store_all = solvers.solve(problem, 2**62, "store_all")  # it makes no copy
    store_all = as_made(problem, store_all, partition(store_all.schedule)[0], lowered)[1]
    found = [(store_all.peak_bytes, store_all.schedule)]
    if again.feasible:
        peak = made_peak(again.schedule)
        least, floor = _least_of(result, found + [(peak, again.schedule)])
        if peak <= limit:
            return dataclasses.replace(again, peak_bytes=peak, min_feasible_bytes=least,
                                       floor_schedule=floor)
        found.append((peak, again.schedule))
    # the least-peak schedules, with the copies they make: `result`'s may be one a call at a
    # lower limit found and recalled, which the retry's least-peak search tied with another
    # making more copies (a call at the least an error named was refused: buffers fuzz)
    found += [(made_peak(s), s) for s in {again.floor_schedule, result.floor_schedule} - {None}]
    least, floor = _least_of(result, found)
    if store_all.peak_bytes <= limit:
        return dataclasses.replace(store_all, min_feasible_bytes=least, floor_schedule=floor)
    if floor is not None and least <= limit:  # a call at the least this names (QAT, 2026-12-06)
        return dataclasses.replace(result, status=Status.FEASIBLE, schedule=floor,
                                   objective_s=simulate(problem, floor).time_s, peak_bytes=least,
                                   bound_s=None, gap=None, min_feasible_bytes=least,
                                   floor_schedule=floor, solver=f"{result.solver}:least")
    return dataclasses.replace(result, min_feasible_bytes=least, floor_schedule=floor)


def snapshots(joint: fx.GraphModule, is_view) -> list[fx.Node]:
    """The placeholders of buffers the step updates that an op a schedule could recompute
    reads, directly or through views (`is_view(node)`: it aliases its first argument)."""
    updated = updated_inputs(joint)
    if not updated:
        return []

    def base(node: fx.Node) -> fx.Node:
        while node.op == "call_function" and is_view(node) and isinstance(node.args[0], fx.Node):
            node = node.args[0]  # not a view of a number (`1j`'s conjugate)
        return node

    read = {base(a) for n in _rerunnable(joint) for a in rerun_reads(n)}
    return [n for n in joint.graph.find_nodes(op="placeholder") if n in updated and n in read]


def rerun_reads(node: fx.Node) -> list[fx.Node]:
    """The nodes a recomputation of `node` may read (BatchNorm's drops its running statistics
    where nothing else reads the new ones: NOTE [Recomputing BatchNorm] 4)."""
    _, args, kwargs, _ = recompute.recompute_form(node, whole=recompute.stats_read_on(node))
    found: list[fx.Node] = []
    fx.node.map_arg((args, kwargs), found.append)
    return found


def updated_inputs(joint: fx.GraphModule) -> set[fx.Node]:
    """The placeholders whose tensors the step updates in place (AOTAutograd's output
    descriptors name them)."""
    output = next(iter(joint.graph.find_nodes(op="output")))
    updated = [d.mutated_input for d in output.meta.get("desc") or ()
               if type(d).__name__ == "InputMutationAOTOutput"]
    return {n for n in joint.graph.find_nodes(op="placeholder")
            if n.meta.get("desc") is not None and n.meta["desc"] in updated}


def _rerunnable(joint: fx.GraphModule) -> set[fx.Node]:
    """The forward call nodes a schedule could recompute: ancestors, through forward nodes,
    of the forward values backward nodes read, by the reads the solver sees (an op's forward
    arguments): an InstanceNorm's BatchNorm, recomputed, reads none of the running statistics
    it is given, but the solver, seeing it read their `repeat`s, recomputed those from the
    buffers the forward had updated, and a tracked InstanceNorm's least plan failed autograd's
    version check at its first backward (2026-12-04)."""
    forward = lambda n: n.op == "call_function" and not phase.in_backward(n)  # noqa: E731
    stack = [a for n in joint.graph.nodes if n.op == "call_function" and not forward(n)
             for a in recompute.tensor_args(n) if forward(a)]
    seen: set[fx.Node] = set()
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(a for a in recompute.tensor_args(node) if forward(a))
    return seen
