"""The memory-centric program: the least budget the joint program can meet, and its schedule.

Run aside (NOTE [Work aside] in solvers/aside.py) where the problem is large: "auto" and the
MILP solver start it first and collect it at their end (NOTE [The least peak within the limit]
in solvers/joint.py).

NOTE [The least peak's time]
  The MILP runs its memory-centric program (this module) for least_time_limit_s of its
  own, cached per problem, on top of its time limit. The first solve of a problem in a
  process, which is every optimize() of a fresh process, thus ran the MILP that much past its
  share, out of the time fine windows were to have: on DenseNet-121 (b16, 128², 40 % of its
  activations) the MILP took 20.6 s of auto's 30 and fine windows none (+17.6 %), where a
  second solve of the same profile, the program cached, gave them 10 s (+14.9 %). So auto
  gives the MILP its share less that time. Where the platform can fork, the program runs
  aside from the start (NOTE [Work aside] in solvers/aside.py), on the core the search
  leaves idle, and the time cut from the MILP (least_time_limit_s) goes to fine windows:
  ResNet-50 (b32, 160², auto 60 s) at 50 / 40 % of its activations went from +6.02-6.35 /
  +7.38 % (gaps 1.9-2.2 / 2.0 %) to +4.99 / +7.08 % (gaps 1.0 / 1.7 %), twice each. The MILP
  is cut by that time limit however the program's answer comes (here, aside or from the
  cache of an earlier solve in the process), so a zoo solved in one process, or the bench,
  shares its time as a lone solve does. (The MILP solver alone begins it aside too: NOTE
  [The least peak within the limit] in solvers/joint.py.)
  The program itself gets what the MILP solver alone gives it at the same limit (a quarter),
  though the MILP is cut by a quarter of its own share only: with a quarter of the MILP's
  share (2.5 s of 30) auto's least peak on ResNet-50 (b16, 128², make bench) was 322.7 MiB
  where the MILP solver's was 293.9 MiB (its coarser program needs about 2.5 s to find it;
  in 1.25 s it ends at its start); with 7.5 s both 293.9 MiB. Aside, the longer program runs
  on the idle core, and what the MILP waits for it comes out of the phases after it.

NOTE [The least peak where store-all fits]
  "auto" reports the least peak it can reach at every budget, and where store-all fits that
  was most of its time: the program had a quarter of the limit (7.5 s of the default 30), to
  answer a question the caller did not ask, on every optimize() whose limit fits, and on each
  step planned anew for a smaller last batch. Where store-all fits it now gets
  AUTO_FITTING_LEAST_SHARE of the limit (1 s of 30; each of its two programs gets at least
  1 s). The least peak said there is then a bound a tighter budget improves on: a budget
  below store-all's peak gets the whole quarter, and the least peak it reports is no higher
  than the lowest schedule known, so it only goes down from call to call. Across calls the
  profile directory keeps that schedule (NOTE [Least peaks remembered] in
  solvers/remembered.py); within a process, without one, least_peak() is given the lowest
  it has found for the same problem, so a budget one call named is met by the next.
  The program itself searches from Chen's schedules every time, not from the known one:
  started from the brief search's schedule, it stayed there (ResNet-50 b16 128², make
  bench-solvers' CPU problem: 324.9 MiB, where from Chen's it reaches 293.9 MiB in the same
  7.5 s; docs/benchmarks/fitting_least.md).
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses

from solvers import baselines, timeshare, variants
from solvers.aside import Aside, can_fork
from solvers.errors import InvalidScheduleError
from solvers.milp import MilpOptions, Program, build_stages, solve_program
from solvers.problem import Problem
from solvers.schedule import Schedule
from solvers.simulate import simulate

# Problems with fewer ops run their least-peak program in the caller, most in well under a
# second; U-Net b4 128² (142 ops) takes its whole 7.5 s, but run aside there (this at 100) it
# changed none of auto's plans at 0-10 % above its least peak (docs/benchmarks/floor_cuts.md).
ASIDE_MIN_OPS = 300
CACHE_SIZE = 8

_done: collections.OrderedDict[tuple, tuple[int, Schedule]] = collections.OrderedDict()
_aside: dict[tuple, Aside] = {}


def least_peak(problem: Problem, options: MilpOptions) -> tuple[int, Schedule]:
    """The memory-centric program (the budget is the objective), given
    options.least_time_limit_s (a quarter of the time limit by default), warm-started from
    the lowest of Chen's least-peak schedules (greedy or sqrt) and options.least_start; or
    that schedule, where it is lower. Cached per (problem, the options it reads: not
    time_limit_s where least_time_limit_s is given), so the budget it reports is met again by
    the same call; if start() began it, its result is waited for."""
    key = _key(problem, options)
    if key not in _done:
        running = _aside.pop(key, None)
        value = running.result() if running is not None else _solve(*_started(*key))
        _done[key] = value
        while len(_done) > CACHE_SIZE:
            _done.popitem(last=False)
    _done.move_to_end(key)
    return _done[key]


def start(problem: Problem, options: MilpOptions) -> None:
    """Begin least_peak(problem, options) in a forked child, where the platform can fork, the
    problem is large and it is neither known nor begun; least_peak() collects it."""
    key = _key(problem, options)
    if can_fork() and key not in _done and key not in _aside and \
            len(problem.ops) >= ASIDE_MIN_OPS:
        _aside[key] = Aside(_solve, *_started(*key))


def forget_inherited() -> None:
    """In a forked child: drop, unread and running, the programs the parent began aside (its
    children, its to collect or stop)."""
    _aside.clear()


def running(problem: Problem, options: MilpOptions) -> bool:
    """Whether start() began least_peak(problem, options) aside and nothing collected it yet."""
    return _key(problem, options) in _aside


def cache_clear() -> None:
    """Forget every answer, and stop the programs begun aside."""
    _done.clear()
    while _aside:
        _aside.popitem()[1].cancel()


least_peak.cache_clear = cache_clear  # type: ignore[attr-defined]
# A child nobody collects would block on its full pipe, and the interpreter waits for its
# children at exit: stop them first (handlers run last-registered first, so before
# multiprocessing's own).
atexit.register(cache_clear)


def _key(problem: Problem, options: MilpOptions) -> tuple[Problem, MilpOptions]:
    options = timeshare.with_floor(options)  # of time_limit_s, before it is pinned below
    if options.least_time_limit_s is not None:
        options = dataclasses.replace(options, time_limit_s=1.0)  # not read: one cache entry
    return problem, dataclasses.replace(options, refine_left=True)  # not read either


def _started(problem: Problem, options: MilpOptions) -> tuple[Problem, MilpOptions]:
    """`options` with the lowest least peak found in this process for `problem` as their
    least_start where it is lower (NOTE [The least peak where store-all fits])."""
    found = [value for (p, _), value in _done.items() if p == problem]
    if not found:
        return problem, options
    peak, schedule = min(found, key=lambda value: value[0])
    if options.least_start is not None:
        with contextlib.suppress(InvalidScheduleError, IndexError):
            if simulate(problem, options.least_start).peak_bytes <= peak:
                return problem, options
    return problem, dataclasses.replace(options, least_start=schedule)


def _solve(problem: Problem, options: MilpOptions) -> tuple[int, Schedule]:
    best = None
    opts = baselines.BaselineOptions()
    for heuristic in (baselines.chen_greedy, baselines.chen_sqrt):
        for chosen in {frozenset(), variants.lightest(problem)}:
            floor = variants.run_with(heuristic, problem, 2 ** 62, opts,
                                      chosen).min_feasible_bytes
            sched = variants.run_with(heuristic, problem, floor, opts, chosen).schedule
            if best is None or floor < best[0]:
                best = (floor, sched)
    known = None
    if options.least_start is not None:  # NOTE [Least peaks remembered]
        with contextlib.suppress(InvalidScheduleError, IndexError):
            known = (simulate(problem, options.least_start).peak_bytes, options.least_start)
    # NOTE [Least peak with variants]
    #   Variant reads move stage boundaries (where recomputation may run), so the program
    #   with variants can end a byte above the same program without them. The plain problem
    #   is solved too; its schedules run on `problem` unchanged, so offering variants never
    #   raises the least peak. Each gets half the time, and in half the time the program on a
    #   large graph often ends where it started; the plain one is therefore made coarser (half
    #   the held variables: fewer, longer stages). Measured (5 s; 10 s alike): ResNet-50 b16
    #   128² with BatchNorm split and variants 337.6 -> 293.9 MiB, b32 160² 665.3 -> 554.0 MiB,
    #   DenseNet-121 and GPT-2 unchanged; with the plain one as fine, it ended at its start.
    plains = [problem] + ([problem.with_variants(frozenset())] if problem.variants else [])
    total = options.least_time_limit_s if options.least_time_limit_s is not None \
        else options.time_limit_s / 4
    share = max(options.min_program_s, total / len(plains))
    for plain in plains:
        held = options.max_held_vars if plain is problem else options.max_held_vars // 2
        stages = build_stages(plain, options.max_recompute_vars, held)
        quick = dataclasses.replace(options, time_limit_s=share)
        warm = best[1] if plain is problem or not best[1].variants else None
        res, sched = solve_program(Program(stages, None), quick, warm)
        if sched is not None:
            sched = sched if plain is problem else \
                dataclasses.replace(sched, variants=frozenset())
            best = min(best, (simulate(problem, sched).peak_bytes, sched), key=lambda b: b[0])
    return best if known is None else min(best, known, key=lambda b: b[0])
