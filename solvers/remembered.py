"""Least-peak schedules found before, so that a least budget once reported is met again.

NOTE [Least peaks remembered]
  `min_feasible_bytes` promises a budget the caller can ask for next. Where that least peak
  comes from a search a clock cuts short (the MILP's memory-centric program, the lower-set DP),
  a second call can stop elsewhere and end above the first: a budget the first call named is
  then refused (gpt2_tiny did this in CI: 1329416 B reached, 1299976 B named the call before).
  So such solvers return the schedule that reached their least peak (`floor_schedule`), the
  caller keeps it (the profile directory does: monet_opt/cache.py), and hands it back as
  `known` on the next solve of the same problem. `with_known` makes the answer no worse for
  it: the least peak reported is at most a known schedule's, and a budget no solver met this
  time but a known schedule fits is answered with that schedule. The MILP's memory-centric
  program also reports no more than the lowest known schedule (MilpOptions.least_start), so
  what it reaches only goes down from call to call (it searches from Chen's schedules: NOTE
  [The least peak where store-all fits] in solvers/least.py). Schedules that do not run on
  the problem (made for another graph) are ignored: the simulator decides.

NOTE [Least peaks recalled in the process]
  Without a profile directory, two optimize() calls of one model profile it twice: the
  problems differ in their measured times only, so the second did not know the first's least
  schedule, and a least budget the first reported could be refused by the second (GPT-2 with
  labels in tests/test_loss_memory.py, on a loaded machine: 1,245,064 B named, 1,285,772 B
  reached). A schedule's peak depends on the problem's memory alone, so optimize() keeps each
  solve's schedules in the process (`recall`: its plan's and its least peak's, by the solver
  and the problem's memory structure, for the last RECALLED of those) and offers them to the
  next solve by the same solver of a problem of the same structure as known ones
  (`recalled`). By the same solver only, as `known` is meant (solvers.solve): `monet-opt
  bench` runs several solvers on one model in one process, and its Checkmate, timed out,
  answered with the DP's plans, its DP's least peak was the MILP's (2026-11-30, gpt2_narrow;
  that run was not kept). The solvers themselves keep nothing between calls: their answer
  depends on their arguments alone.

NOTE [Schedules found for the step without gradients in place]
  A step planned with gradients in place (monet_opt/accumulate.py's `in_place_problem`) runs
  the same ops as the step planned without them, so every schedule of that one runs on it,
  peaking at most by the gradients in place and their -0.0 scalars higher. Its least peak is
  searched anew, and a clock cuts that search: in CI one such search ended 2,240 B above the
  plan the module already ran plus its gradients (small_cnn, tests/test_resident_grads.py),
  where the same search alone here reached 196,532 B. So its solve is also offered what was
  recalled for the problem without gradients in place (`recalled(problem, before)`): its
  least peak and its plan are then never worse than the plan before plus the gradients in
  place.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Iterable

from solvers.errors import InvalidScheduleError
from solvers.problem import Problem
from solvers.schedule import Schedule, SolveResult, Status, gap_of
from solvers.simulate import Simulation, simulate


def floor_of(candidates: Iterable[tuple[int | None, Schedule | None]]
             ) -> tuple[int | None, Schedule | None]:
    """The least (peak, schedule) of `candidates`; on a tie in peak, one with a schedule."""
    best: tuple[int | None, Schedule | None] = (None, None)
    for peak, schedule in candidates:
        if peak is None:
            continue
        if best[0] is None or peak < best[0] or (peak == best[0] and best[1] is None):
            best = (peak, schedule)
    return best


RECALLED = 16  # problems
PER_PROBLEM = 8  # schedules of each, its least peak's among them
_recalled: collections.OrderedDict[int, tuple[int | None, list[Schedule]]] = \
    collections.OrderedDict()
_plans: collections.OrderedDict[int, list[_Named]] = collections.OrderedDict()  # by graph
REPLAN_SHARE = 1 / 6  # of time_limit_s, for a step another shape's plan fits
REPLAN_MIN_S = 2.0


def _memory_of(solver: str, problem: Problem) -> int:
    """A hash of `solver` and what a schedule's simulated peak depends on (not the times)."""
    return hash((solver,
                 tuple((o.is_backward, o.inputs, o.outputs, o.workspace_bytes, o.inplace_bytes,
                        o.overwrites, o.first_workspace_bytes, o.captured_workspace_bytes,
                        o.state_bytes)
                       for o in problem.ops),
                 tuple((t.bytes, t.producer) for t in problem.tensors), problem.fixed_bytes,
                 problem.forward_outputs, problem.backward_outputs,
                 tuple((v.op, v.replaces, v.reads, v.encode_ops, v.extra_workspace_bytes,
                        v.replays) for v in problem.variants)))


def _graph_of(solver: str, problem: Problem) -> int:
    """A hash of `solver` and the problem's graph by names, its sizes and its ops' order left
    out: the same for a step traced at another batch size or sequence length, whose backward
    may be lowered in another order, not for one that holds other outputs to its end (a step
    with gradients in place: NOTE [Plans for other shapes])."""
    names = [t.name for t in problem.tensors]
    return hash((solver, frozenset((o.name, o.is_backward, tuple(names[t] for t in o.inputs),
                                    tuple(names[t] for t in o.outputs)) for o in problem.ops),
                 frozenset(v.name for v in problem.variants),
                 frozenset(names[t] for t in problem.forward_outputs + problem.backward_outputs)))


@dataclasses.dataclass(frozen=True)
class _Named:
    """A schedule by its ops', tensors' and variants' names, for a problem of the same graph."""

    kept: frozenset[str]
    backward: tuple[str, ...]
    variants: frozenset[str]

    @staticmethod
    def of(problem: Problem, schedule: Schedule) -> _Named:
        return _Named(frozenset(problem.tensors[t].name for t in schedule.kept),
                      tuple(problem.ops[i].name for i in schedule.backward),
                      frozenset(problem.variants[v].name for v in schedule.variants))

    def on(self, problem: Problem) -> Schedule | None:
        """This schedule on `problem`; None where a name is not there once."""
        ids = [{x.name: i for i, x in enumerate(xs)} for xs in
               (problem.tensors, problem.ops, problem.variants)]
        if any(len(m) != len(xs) for m, xs in zip(ids, (problem.tensors, problem.ops,
                                                        problem.variants))):
            return None
        try:
            return Schedule(frozenset(ids[0][n] for n in self.kept),
                            tuple(ids[1][n] for n in self.backward),
                            frozenset(ids[2][n] for n in self.variants))
        except KeyError:
            return None


def recalled(solver: str, problem: Problem, *like: Problem) -> tuple[Schedule, ...]:
    """The schedules `solver` found in this process for a problem of `problem`'s memory
    structure, or of one of `like` (problems whose schedules run on it: NOTEs [Least peaks
    recalled in the process], [Schedules found for the step without gradients in place])."""
    found = (_recalled.get(_memory_of(solver, p), (None, []))[1] for p in (problem, *like))
    return tuple(dict.fromkeys(s for schedules in found for s in schedules))


def recall(solver: str, problem: Problem, result: SolveResult) -> None:
    """Keep `result`'s least-peak schedule and its plan's, found by `solver`, for `recalled`:
    the least peak's while none lower is found, the others PER_PROBLEM - 1 at most, the
    latest."""
    key = _memory_of(solver, problem)
    least, schedules = _recalled.pop(key, (None, []))
    peak, floor = result.min_feasible_bytes, result.floor_schedule
    if floor is not None and peak is not None and (least is None or peak < least):
        least, schedules = peak, [floor] + [s for s in schedules if s != floor]
    if result.schedule is not None and result.schedule not in schedules:
        schedules.append(result.schedule)
    while len(schedules) > PER_PROBLEM:
        del schedules[1 if least is not None else 0]  # the oldest plan's
    _recalled[key] = (least, schedules)
    while len(_recalled) > RECALLED:
        _recalled.popitem(last=False)
    found = [_Named.of(problem, s) for s in (floor, result.schedule) if s is not None]
    if found:  # NOTE [Plans for other shapes]
        key = _graph_of(solver, problem)
        plans = [s for s in _plans.pop(key, []) if s not in found]
        _plans[key] = plans[len(plans) + len(found) - PER_PROBLEM:] + found
        while len(_plans) > RECALLED:
            _plans.popitem(last=False)


def replanned(solver: str, problem: Problem, budget_bytes: int,
              time_limit_s: float) -> tuple[float, tuple[Schedule, ...], bool]:
    """NOTE [Plans for other shapes]
      A training loop meets inputs of other shapes: a smaller last batch, and with dynamic
      padding (a collator padding each batch to its longest, HF's default for many tasks) a new
      sequence length batch after batch, each a step planned at its first call (NOTE [New input
      shapes] in monet_opt/module.py): "auto" took its whole time_limit_s on each length that
      store-all did not fit (GPT-2 narrow: 31 s at 240 and 224 tokens,
      docs/benchmarks/close_enough.md). Such a step has the graph of the one planned before
      with tensors of other sizes, so that step's schedule runs on it (matched by the names of
      its ops, tensors and variants: the backward may be lowered in another order), and where
      no size is larger (a shorter length, a smaller batch) it fits the same limit. Run as it
      is, it is slow there: GPT-2 narrow's 256-token schedule at 60 % of store-all predicts
      +4.34 % at 240 tokens and +5.15 % at 192, where auto's own plans predict +2.47 / +0.72 %
      in 3 s and +2.40 / +0.72 % in 30 s: a short search from it is about as good as a long one.
      So the plans and least-peak schedules found in this process for problems of this graph
      (`recall`) are offered to a step planned after the module's first, as known schedules
      (its least peak is no higher than theirs) and as auto's candidates (those that fit join
      its own, polished and pruned like them); and where one fits, auto gets REPLAN_SHARE of
      time_limit_s (at least REPLAN_MIN_S) and, where store-all fits, runs no least-peak
      program (on tests/models.py's GPT-2 at 36 tokens that program took 3.3 of auto's 4.0 s
      and reached 2.18 MB where the heuristics reached 1.64). Its plan is then no slower than
      the one that fits. Five new lengths of GPT-2 narrow, 240 to 128 tokens, were planned in
      61.4 s where they took 108.6 s, plans within 0.1 point (docs/benchmarks/new_lengths.md).
      Where none fits (a longer length), the step gets the whole time_limit_s as before, and
      the step optimize() plans itself always does. A step with gradients in place (NOTE
      [Gradients resident at the start] in monet_opt/accumulate.py) holds other outputs to its
      end, so it is not of the same graph as the step without them: offered that step's plans,
      it fit its least-peak schedule and found +7.74 % in its sixth of the time where the whole
      time found +6.22 % (CPU ResNet-50 b16 128² at half its activations, one run each), on a
      step that runs at every micro-batch. Returns the time limit, the schedules and
      whether auto is to run its least-peak program."""
    on = (s.on(problem) for s in _plans.get(_graph_of(solver, problem), ()))
    others = tuple(s for s in on if s is not None)
    if solver != "auto" or not fitting(problem, budget_bytes, others):
        return time_limit_s, others, True
    return max(min(time_limit_s, REPLAN_MIN_S), time_limit_s * REPLAN_SHARE), others, False


def lowest(problem: Problem, known: Iterable[Schedule]) -> Schedule | None:
    """The schedule of `known` with the least peak on `problem`, of those that run on it."""
    return floor_of((sim.peak_bytes, s) for s, sim in _simulated(problem, known))[1]


def _simulated(problem: Problem, known: Iterable[Schedule]
               ) -> list[tuple[Schedule, Simulation]]:
    runs = []
    for schedule in known:
        try:
            runs.append((schedule, simulate(problem, schedule)))
        except (InvalidScheduleError, IndexError):
            continue
    return runs


def with_known(problem: Problem, budget_bytes: int, result: SolveResult,
               known: Iterable[Schedule]) -> SolveResult:
    """`result` with the schedules in `known` taken into account (NOTE [Least peaks
    remembered]), and its own schedule: a least peak above it is lowered to it (the MILP's
    came from its memory-centric program alone, at times above the schedule it returned:
    23,312 B said beside a 21,712 B schedule; solver probe, 2026-12-06)."""
    if result.feasible and result.min_feasible_bytes is not None and \
            result.peak_bytes < result.min_feasible_bytes:
        result = dataclasses.replace(result, min_feasible_bytes=result.peak_bytes,
                                     floor_schedule=result.schedule)
    runs = _simulated(problem, known)
    if not runs:
        return result
    peak, floor = floor_of([(result.min_feasible_bytes, result.floor_schedule)] +
                           [(sim.peak_bytes, s) for s, sim in runs])
    result = dataclasses.replace(result, min_feasible_bytes=peak, floor_schedule=floor)
    fits = [(s, sim) for s, sim in runs if sim.peak_bytes <= budget_bytes]
    if result.feasible or not fits:
        return result
    schedule, sim = min(fits, key=lambda r: (r[1].time_s, r[1].peak_bytes))
    bound = result.bound_s
    gap = gap_of(sim.time_s, bound)
    note = "a least-peak schedule remembered from an earlier solve of this problem " \
           "(NOTE [Least peaks remembered])"
    return dataclasses.replace(result, status=Status.FEASIBLE, schedule=schedule,
                               objective_s=sim.time_s, peak_bytes=sim.peak_bytes, gap=gap,
                               note=f"{result.note}; {note}" if result.note else note)


def fitting(problem: Problem, budget_bytes: int, candidates: Iterable[Schedule]
            ) -> list[SolveResult]:
    """NOTE [Schedules remembered]
      A schedule that fits a budget fits every larger one, so a profile directory that holds
      schedules of a problem at several limits (a zoo: `monet-opt precompute`) knows good
      schedules for a new limit before any search: "auto" takes those that fit as candidates
      beside its own (polished, refined and pruned like them), so its answer is never slower
      than one it gave at a smaller limit of the same problem, where a clock cut the search
      short at one limit and not at the other (DenseNet-121 at 50 % of its activations came
      out slower than at 40 %: docs/benchmarks/solvers.md). Candidates that do not run on the
      problem are ignored: the simulator decides."""
    return [SolveResult(solver="remembered", status=Status.FEASIBLE, schedule=s,
                        objective_s=sim.time_s, peak_bytes=sim.peak_bytes, bound_s=None,
                        gap=None, solve_time_s=0.0, min_feasible_bytes=sim.peak_bytes,
                        note="a schedule the profile directory held for this problem at "
                             "another limit (NOTE [Schedules remembered])")
            for s, sim in _simulated(problem, candidates) if sim.peak_bytes <= budget_bytes]
