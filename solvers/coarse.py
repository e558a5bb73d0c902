"""A coarser joint program, searched aside while the MILP searches its own.

NOTE [A coarser program aside]
  Near the least peak no heuristic schedule fits and the LP's roundings do not either, so HiGHS
  starts the whole program from nothing, and what it finds first it barely improves: on
  ResNet-50 (b16 128², 27 stages, make bench's problem in docs/benchmarks/problems_cpu.json.gz)
  at its least peak and 5/10/20 % above it, 15 s of the whole program found
  +25.0/+22.0/+67.6/+15.4 % (predicted, vs store-all) where the same program with half the held
  variables (15 stages) found +18.6/+10.2/+8.0/+7.5 %; on GoogLeNet (b32 128², 22 stages)
  +28.1/+97.4/+105.0/+89.6 % where half the recompute variables found +31.7/+27.7/+25.9/+22.0 %.
  A smaller program is easier to search, and a coarser one that cannot meet the budget is proved
  so within a second (GoogLeNet's halved and quartered held variables at 0-10 % above its least
  peak: 0.5-1.1 s). Cutting the search's time into a ladder of programs in one process lost more
  than it gained (9 s shared by four programs found nothing at 0/5 % on ResNet-50 and 0/5/10 %
  on GoogLeNet). So where the MILP has no start and the platform can fork, the idle core runs a
  ladder aside for as long as the whole program runs: a quarter of the held variables, then
  half, (then two thirds: NOTE [The ladder's head start]) then half the recompute variables,
  each only when the one before it was proved unable to meet the budget (NOTE [Work aside] in
  solvers/aside.py). The faster of the two schedules goes on (windows of its own program). A
  coarser program searches part of the schedules only: its bound proves nothing and is not used.
  `make bench-near-floor` (auto in 30 s, two solves each, at the least peak and 2/5/10/20 %
  above it), before -> after: ResNet-50 +18.4/+16.0/+15.3/+28.2/+5.4-5.6 % ->
  +16.8/+16.0/+10.2/+10.7/+5.3-5.6 %; GoogLeNet, whose coarser programs cannot meet its least
  peak (155.6 MiB, found by annealing) nor 2 % above it,
  +35.2/+34.9/+22.2-32.3/+27.4/+21.0-28.0 % ->
  +35.2-39.8/+34.9-40.0/+29.9-30.1/+27.4/+26.7-27.6 %: within the 10 points its solves of one
  budget differ by (there annealing and fine windows make the plan, not the MILP).
NOTE [The ladder's head start]
  The ladder began once the MILP knew it had no start: after its bound (solvers/bound.py) and
  its relaxation, which near the least peak find nothing to start from, and took 3.2 + 4.0 s of
  auto's 20 on the H100's ResNet-50 problem (b184 224², docs/benchmarks/gpu/
  problems_gpu.json.gz, solved on the 2-core CPU machine), while the idle core waited. The
  ladder then had 6.5 s, where its half-held rung needs 8-11 s there to find a schedule, so at
  10 % above the least peak auto gave the memory-centric schedule, pruned: +216 % and +230 %
  predicted over two solves, the MILP solver alone +51 %. Whether a heuristic's schedule fits is
  known before the bound, so where none does the ladder now begins there; it is stopped where
  the relaxation's rounding fits. Same problem and budget, auto 20 s: +44.7 %. A rung at two
  thirds of the held variables (16 stages where half gives 12 and the whole program 23) meets
  budgets nearer the least peak that half cannot, given time: at 2 % above it, auto 45 s,
  +101.3 % without it, +64.6 % with it. At 2 and 5 % above, auto in 20 or 30 s still finds
  nothing better than the memory-centric schedule there (+198 to +241 %): the two-thirds rung
  needs 15-20 s to find its first schedule on this machine. `make bench-near-floor` (two solves
  each, at the least peak and 2/5/10/20 % above it), before -> after: ResNet-50
  +18.9/+16.2/+12.5/+12.3/+6.3 % -> +18.9/+14.9-16.2/+12.5/+11.0-12.3/+5.9-6.8 %; GoogLeNet
  +35.3/+34.7/+30.5-31.8/+27.4/+21.8-22.9 % -> +35.3-35.7/+34.7/+31.7-35.4/+27.4/+22.5-25.1 %,
  within its spread.
"""
from __future__ import annotations

import dataclasses
import time

from solvers.aside import Aside, can_fork
from solvers.milp import MilpOptions, Program, build_stages, solve_program
from solvers.problem import Problem
from solvers.schedule import Schedule
from solvers.stages import Stages

# Problems with fewer ops close their whole program or come near in their time: no ladder.
MIN_OPS = 300


def rungs(problem: Problem, options: MilpOptions) -> list[tuple[int, int]]:
    """(max_recompute_vars, max_held_vars) of each coarser program, in the order tried: those
    whose stages differ from the whole program's and from the rungs' before them."""
    whole = build_stages(problem, options.max_recompute_vars, options.max_held_vars)
    held, rv = options.max_held_vars, options.max_recompute_vars
    out, seen = [], [_shape(whole)]
    for limits in ((rv, held // 4), (rv, held // 2), (rv, held * 2 // 3), (rv // 2, held)):
        shape = _shape(build_stages(problem, *limits))
        if shape not in seen:
            out.append(limits)
            seen.append(shape)
    return out


def start(problem: Problem, budget_bytes: int, options: MilpOptions,
          time_limit_s: float) -> Aside | None:
    """The ladder begun aside (None where the platform cannot fork, the problem is small or
    has no coarser program); collect() takes its answer."""
    if not can_fork() or len(problem.ops) < MIN_OPS or not rungs(problem, options):
        return None
    return Aside(ladder, problem, budget_bytes, options, time_limit_s)


def cancel(aside: Aside | None) -> None:
    """The ladder stopped, if begun; its answer is then lost."""
    if aside is not None:
        aside.cancel()


def collect(aside: Aside | None, problem: Problem, budget_bytes: int
            ) -> tuple[Program, Schedule] | None:
    """The ladder's program (built again here) and schedule, if it found one."""
    if aside is None:
        return None
    found = aside.result()
    if found is None:
        return None
    limits, schedule = found
    return Program(build_stages(problem, *limits), budget_bytes), schedule


def ladder(problem: Problem, budget_bytes: int, options: MilpOptions, time_limit_s: float
           ) -> tuple[tuple[int, int], Schedule] | None:
    """Each rung's program from nothing, the next only where it was proved infeasible; the
    first schedule found, with its rung's limits."""
    deadline = time.perf_counter() + time_limit_s
    for limits in rungs(problem, options):
        left = deadline - time.perf_counter()
        if left < 1.0:
            return None
        program = Program(build_stages(problem, *limits), budget_bytes)
        res, schedule = solve_program(
            program, dataclasses.replace(options, time_limit_s=left), None)
        if schedule is not None:
            return limits, schedule
        if res.status != "infeasible":
            return None
    return None


def _shape(stages: Stages) -> tuple:
    return tuple(stages.groups), stages.window


__all__ = ["cancel", "collect", "ladder", "rungs", "start"]
