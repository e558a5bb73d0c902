"""Every solver behind one signature: solve(problem, budget_bytes, solver=name, options)."""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

from solvers import (anneal, baselines, checkmate, dp, evict, fine, joint, least, portfolio,
                     last_tries, prune, remat, timeshare, variants)
from solvers.bound import proved_bound
from solvers.bound_start import KEPT_REMAT, kept_starts
from solvers.errors import UnknownSolverError
from solvers.lazy_cuts import CUTS_SOLVER, lazy_cuts
from solvers.milp import MilpOptions
from solvers.problem import Problem
from solvers.prune import without_unread
from solvers.remembered import fitting, floor_of, lowest, with_known
from solvers.sane_numbers import check_solve_arguments
from solvers.schedule import Schedule, SolveResult, Status, gap_of, without_refuted_bound
from solvers.simulate import simulate
from solvers.stages import build_stages

SolverFn = Callable[[Problem, int, Any], SolveResult]

# Solvers that choose operator variants themselves; the others see the plain problem.
_VARIANT_AWARE = {"milp", "remat"}

_REGISTRY: dict[str, tuple[SolverFn, type]] = {
    "store_all": (baselines.store_all, baselines.BaselineOptions),
    "chen_sqrt": (baselines.chen_sqrt, baselines.BaselineOptions),
    "chen_greedy": (baselines.chen_greedy, baselines.BaselineOptions),
    "chen": (baselines.chen, baselines.BaselineOptions),
    "evict": (evict.evict, evict.EvictOptions),
    "milp": (joint.milp, MilpOptions),
    "checkmate": (checkmate.checkmate_milp, checkmate.CheckmateOptions),
    "dp": (dp.dp, dp.DpOptions),
    "remat": (remat.remat, remat.RematOptions),
}

# The lower-set program's share of "auto" (it runs whatever else does; a cap, not a target).
AUTO_DP_TIME_LIMIT_S = 3.0
# How many of the fastest schedules "auto" polishes, and the most of its limit set aside for
# that and pruning, half each (polishing also gets whatever the MILP leaves).
AUTO_POLISH_SCHEDULES = 3
AUTO_POLISH_TIME_LIMIT_S = 5.0
# The share of "auto"'s limit that fine windows get on the best schedule (NOTE [Fine windows]
# in solvers/fine.py), taken from the MILP's.
AUTO_FINE_SHARE = 0.35
# The share of "auto"'s limit for annealing kept sets (NOTE [Annealing kept sets] in
# solvers/anneal.py), from the MILP's where it is coarsened (else what polishing leaves).
AUTO_ANNEAL_SHARE = 0.4
# How close to the step with no recomputation a heuristic's schedule must come for "auto" to
# search no further (NOTE [Close enough]), as a share of that step's time.
AUTO_CLOSE_ENOUGH = 0.005
# The share of "auto"'s limit the heuristics may take before the DP and the MILP (NOTE
# [Heuristics in their time]); a cap: on the bench's models they take a second or two, and
# up to AUTO_CHEAP_GRACE of the limit of theirs is not taken from the MILP's share.
AUTO_CHEAP_SHARE = 0.25
AUTO_CHEAP_GRACE = 0.1
# Fine windows refine a rematerialized schedule only where it beats the fastest recomputing
# once by this share of the no-recomputation step (NOTE [Rematerializing in auto], remat.py).
AUTO_REMAT_MARGIN = 0.15
# The least-peak program's share of "auto"'s limit where store-all fits (NOTE [The least peak
# where store-all fits] in solvers/least.py); elsewhere it gets a quarter.
AUTO_FITTING_LEAST_SHARE = 1 / 30
# The most of "auto"'s limit (a cap: 0.1-0.6 s on the kept problems) the bound's kept set may
# take to solve, and again to fit (NOTE [The bound's kept set] in solvers/bound_start.py).
AUTO_BOUND_KEPT_SHARE = 1 / 15
# The most of "auto"'s limit the cut rounds take (NOTE in solvers/lazy_cuts.py; auto_shares.md);
# where nothing cheap fits within AUTO_FLOOR_CUTS_NEAR of the heuristics' least peak, less
# (NOTE [Rounds near the floor] there).
AUTO_CUTS_SHARE = 0.45
AUTO_FLOOR_CUTS_SHARE, AUTO_FLOOR_CUTS_NEAR = 0.1, 0.05


def _pruned(problem: Problem, budget_bytes: int, best: SolveResult,
            deadline: float) -> SolveResult:
    """`best` with the recomputation it can do without dropped (NOTE [Pruning
    recomputation]), given at least a second."""
    schedule = prune.prune(problem, best.schedule, budget_bytes,
                           max(deadline, time.perf_counter() + 1.0))
    dropped = len(best.schedule.backward) - len(schedule.backward)
    if not dropped:
        return best
    sim = simulate(problem, schedule)
    note = f"{dropped} recomputations it could do without dropped"
    return dataclasses.replace(best, schedule=schedule, objective_s=sim.time_s,
                               peak_bytes=sim.peak_bytes, status=Status.FEASIBLE,
                               note=f"{best.note}; {note}" if best.note else note)


def _refined(problem: Problem, budget_bytes: int, best: SolveResult,
             deadline: float) -> SolveResult:
    """`best` refined by fine windows until `deadline` (NOTE [Fine windows])."""
    refined = fine.refine(problem, budget_bytes, best.schedule, deadline)
    if not refined.improved:
        return best
    note = (f"then refined in {refined.windows} fine windows (NOTE [Fine windows]), "
            f"{refined.improved} of them faster")
    return dataclasses.replace(best, schedule=refined.schedule, objective_s=refined.time_s,
                               peak_bytes=refined.peak_bytes, status=Status.FEASIBLE,
                               note=f"{best.note}; {note}" if best.note else note)


def _once(r: SolveResult) -> bool:
    """Whether r recomputes a kept set once, on demand: not a rematerialized schedule (NOTE
    [Rematerializing in auto] in solvers/remat.py; the bound's kept set rematerialized, NOTE
    [The bound's kept set] in solvers/bound_start.py)."""
    return r.solver not in ("remat", KEPT_REMAT, CUTS_SOLVER)


def _to_refine(problem: Problem, feasible: list[SolveResult]) -> SolveResult:
    """The schedule fine windows refine: the fastest, unless that is rematerialized and a
    schedule recomputing once is within AUTO_REMAT_MARGIN of it (NOTE [Rematerializing
    in auto] in solvers/remat.py): windows make more of those."""
    def key(r: SolveResult):
        return (r.objective_s, r.peak_bytes)
    best = min(feasible, key=key)
    once = [r for r in feasible if _once(r)]
    if _once(best) or not once:
        return best
    other = min(once, key=key)
    margin = AUTO_REMAT_MARGIN * problem.no_recompute_time_s
    return other if other.objective_s <= best.objective_s + margin else best


def _annealed(problem: Problem, budget_bytes: int, feasible: list[SolveResult],
              deadline: float) -> SolveResult:
    """The fastest of `feasible`, or a faster schedule annealing finds from their kept sets
    by `deadline` (NOTE [Annealing kept sets])."""
    ranked = sorted(feasible, key=lambda r: (r.objective_s, r.peak_bytes))
    best = ranked[0]
    if best.objective_s <= problem.no_recompute_time_s * (1 + 1e-12):
        return best  # nothing is faster
    found = anneal.anneal(problem, budget_bytes, [r.schedule for r in ranked], deadline)
    if found is None or found[1].time_s >= best.objective_s:
        return best
    schedule, sim = found
    return dataclasses.replace(best, solver="anneal", schedule=schedule, objective_s=sim.time_s,
                               peak_bytes=sim.peak_bytes, status=Status.FEASIBLE,
                               note="kept sets annealed, recomputed on demand (NOTE [Annealing "
                                    "kept sets])")


def _close_enough(problem: Problem, results: list[SolveResult]) -> bool:
    """NOTE [Close enough]
      No schedule's step is faster than the one that recomputes nothing (problem.
      no_recompute_time_s), so once a heuristic's schedule comes within AUTO_CLOSE_ENOUGH of
      it, the most any further search can gain is that share of the step: "auto" then takes
      it as it takes store-all where store-all fits, and spends no more of its limit (the
      least-peak program still runs, so the least peak is reported). It used to search for
      its whole limit regardless: GPT-2 narrow (b4, 200 tokens, CPU) at a limit 60 % of the
      256-token step's store-all peak, cheapest-first eviction found +0.48 % in 0.8 s, the MILP
      proved +0.48 % optimal in its program at 6.6 s, and polishing, annealing and fine
      windows then spent 21 s finding nothing faster: 27.6 s for the plan of 0.8 s; now 5.9 s
      (docs/benchmarks/close_enough.md). Store-all is one unless variants save time: it
      settled at 4.0 s where the MILP's 3.5 s fit (solvers fuzzing, 2026-12-06)."""
    best = min((r.objective_s for r in results if r.feasible), default=None)
    return best is not None and best <= problem.no_recompute_time_s * (1 + AUTO_CLOSE_ENOUGH)


def _coarsened(problem: Problem) -> bool:
    """Whether the joint MILP merges stages or windows recomputation on this problem."""
    o = MilpOptions()
    stages = build_stages(problem, o.max_recompute_vars, o.max_held_vars)
    return stages.max_stages is not None or stages.window is not None


def available_solvers() -> list[str]:
    return ["auto", *_REGISTRY]


def solve(problem: Problem, budget_bytes: int, solver: str = "auto", options: Any = None,
          time_limit_s: float | None = None, known: Sequence[Schedule] = (),
          candidates: Sequence[Schedule] = (), least_peak: bool = True) -> SolveResult:
    """Find a schedule whose simulated peak is at most `budget_bytes` (fixed memory included).

    "auto": store-all when it fits (nothing is faster, unless variants save time), or a
    schedule within AUTO_CLOSE_ENOUGH of it (NOTE [Close enough]); else store-all, Chen's,
    eviction, rematerializing (NOTE [Rematerializing under the budget]), the lower-set DP
    (capped at AUTO_DP_TIME_LIMIT_S) and the joint MILP, and the fastest feasible schedule,
    polished (NOTE [Polishing]), pruned of recomputation it can do without (NOTE [Pruning
    recomputation]), refined by fine windows (NOTE [Fine windows], AUTO_FINE_SHARE of the
    limit; NOTE [Pruned before windows] in solvers/prune.py) and pruned again in the time
    left. Its `min_feasible_bytes` is the least of theirs and of every schedule it found
    within the budget (the heuristics, the DP's
    memory-centric pass and the MILP's least-peak program always run, so it is known even
    when store-all fits; there the program is brief: NOTE [The least peak where store-all
    fits]). An infeasible
    budget is not an exception here: the result has status INFEASIBLE and says the least
    budget that would do. `time_limit_s` caps the MILP (overrides its options' limit);
    for "auto" it is the whole solve's (default: MilpOptions' limit), shared out between the
    heuristics (at most AUTO_CHEAP_SHARE of it, a second or two on the bench's models, not
    taken from the others up to AUTO_CHEAP_GRACE of it), the DP, the MILP, polishing and
    pruning (NOTE [Heuristics in their time]).
    `known`: floor_schedules the same solver returned on this problem before; the least peak
    reported is no higher than theirs, and a budget they fit is met (NOTE [Least peaks
    remembered] in solvers/remembered.py).
    `candidates`: other schedules of this problem ("auto" only); those that fit the budget
    join its own (NOTE [Schedules remembered]). A machine with four cores per search to spare
    runs several "auto" searches at once, each with its own HiGHS seed, and the fastest wins
    (NOTE [A portfolio of seeds] in solvers/portfolio.py). `least_peak` False: where store-all
    fits, "auto" runs no least-peak program; its least peak is then its heuristics', the DP's
    and the known schedules' (NOTE [Plans for other shapes] in solvers/remembered.py).
    """
    check_solve_arguments(problem, budget_bytes, time_limit_s)
    start = lowest(problem, known)
    if solver == "auto":  # NOTE [A portfolio of seeds]
        limit = time_limit_s if time_limit_s is not None else MilpOptions().time_limit_s
        result = portfolio.best_of(
            lambda: _auto(problem, budget_bytes, limit, start, candidates, least_peak), limit)
        return without_refuted_bound(without_unread(problem, with_known(
            problem, budget_bytes, result, known), budget_bytes))
    if solver not in _REGISTRY:
        raise UnknownSolverError(
            f"solvers.solve: no solver named {solver!r}; available: {available_solvers()}")
    fn, options_type = _REGISTRY[solver]
    options = options if options is not None else options_type()
    if time_limit_s is not None and hasattr(options, "time_limit_s"):
        options = dataclasses.replace(options, time_limit_s=time_limit_s)
    if isinstance(options, MilpOptions) and options.least_start is None:
        options = dataclasses.replace(options, least_start=start)
    if solver in _VARIANT_AWARE:
        result = fn(problem, budget_bytes, options)
    else:
        result = variants.run_with(fn, problem, budget_bytes, options)
    return without_refuted_bound(without_unread(problem, with_known(
        problem, budget_bytes, result, known), budget_bytes))


_HEURISTICS = ("store_all", "chen_sqrt", "chen_greedy", "evict")


# NOTE [Heuristics in their time] in solvers/timeshare.py
def _cheap(problem: Problem, budget_bytes: int, deadline: float = math.inf,
           store_all: SolveResult | None = None) -> list[SolveResult]:
    """The heuristics, with no variants and (where the problem has any) the lightest ones
    (rematerializing tries both itself); store-all with the fastest ones. First: plain
    store-all (`store_all` where already run), whose fit auto asks about. Those that search
    share the time to `deadline`."""
    light = variants.lightest(problem)
    runs: list[tuple[str, frozenset[int] | None]] = [(n, frozenset()) for n in _HEURISTICS[1:]]
    runs += [(name, light) for name in _HEURISTICS] if light else []
    runs.append(("remat", None))  # it chooses between none and the lightest itself
    out = [store_all or solve(problem, budget_bytes, "store_all")]
    for (name, chosen), limit in zip(runs, timeshare.limits([n for n, _ in runs], deadline)):
        options = _REGISTRY[name][1]()
        if limit is not None:
            options = dataclasses.replace(options, time_limit_s=limit)
        out.append(variants.run_with(_REGISTRY[name][0], problem, budget_bytes, options,
                                     chosen) if chosen else
                   solve(problem, budget_bytes, name, options))
    fast = variants.fastest(problem)
    if fast:
        out.append(variants.run_with(baselines.store_all, problem, budget_bytes,
                                     baselines.BaselineOptions(), fast))
    return out


# NOTE [Nothing cheap fits]
#   Near the least peak no heuristic and no lower-set schedule fits, so annealing, polishing
#   and fine windows have only the MILP's schedule to start from, and where the MILP's whole
#   program found none in its time, that is the memory-centric program's: tight at every
#   moment, so that windows and annealing barely move it (ResNet-50 b16 128², least peak
#   293.9 MiB: +261.5 % predicted; windows of stages from it, 12 s: +202.7 %; pruned first
#   (NOTE [Pruning recomputation], 5 s), then windows: +88.9 %).
#   The whole program, from scratch, found +22.4 % there in the MILP solver's own 30 s, and
#   on a coarsened problem auto gave it 1 s (its share less fine windows' and annealing's).
#   So where nothing cheap fits, the MILP also gets annealing's and fine windows' shares;
#   polishing's stays for the phases after it. (Until 2026-12-04 the code gave it half of fine
#   windows' share again, past auto's deadline: U-Net b4 128² at its least peak, auto in 60 /
#   45 s took 65.7 / 48.0 s; now 55.4 / 40.4 s, the same plans, and in 30 s the same plans
#   on the four problems of docs/benchmarks/floor_milp_share.md; windows keeping half their
#   share instead gave U-Net +29.8 % where this gives +20.1 %.) `make bench-near-floor`,
#   auto in 30 s at the least peak and 2/5/10/20 % above it, predicted overhead (two solves
#   each), before -> after (c6edc3b): ResNet-50 +66.6/+59.1-59.2/+43.8/+51.8/+5.6 % ->
#   +18.4/+16.0/+15.3/+28.2/+5.4-5.6 %; GoogLeNet (b32 128²) +35.2/+34.9-35.3/+34.9-35.6/
#   +27.4/+23.3-24.4 % -> +35.1-35.2/+33.6-40.1/+30.1-32.3/+27.4/+21.9-22.1 %. Giving the MILP
#   only fine windows' share was worse (+66.6/+76.9/+70.6/+61.3/+5.6 %), all of it alike
#   (+19.3/+15.5/+13.6/+26.9/+5.4 %). Starting the whole program from the memory-centric
#   schedule kept it there (+202.7 % at 20 s), and a least-peak program that also weighs time
#   ended higher (302.4 against 293.9 MiB in 7.5 s).
#   Where the whole program still finds nothing (`make bench`'s own ResNet-50 profile at its
#   least peak, at 142da28), the MILP spent its time on the whole program again from the
#   memory-centric schedule, which it does not leave (above), and fine windows and pruning had
#   half their time: +83.3 % where the old rule gave +67.3 %. So the MILP no longer runs its
#   whole program again from a schedule it did not find itself (joint._by_windows): on that
#   profile, old rule -> this, at the least peak and 2/5 % above: +67.3/+62.5/+60.2 % ->
#   +67.3/+15.6/+14.0 %. Where the whole program has no start, a coarser one now searches
#   aside on the idle core (NOTE [A coarser program aside] in solvers/coarse.py).
#   A rematerialized schedule does not count here, is not polished, and is refined by fine
#   windows only when well ahead (NOTE [Rematerializing in auto] in solvers/remat.py).
def _auto(problem: Problem, budget_bytes: int, limit: float,
          least_start: Schedule | None = None, candidates: Sequence[Schedule] = (),
          least_peak: bool = True) -> SolveResult:
    start = time.perf_counter()
    deadline = start + limit
    polish_s = min(AUTO_POLISH_TIME_LIMIT_S, limit / 6)
    prune_s = polish_s / 2  # polishing's share, split: NOTE [Pruning recomputation]
    dp_s = min(AUTO_DP_TIME_LIMIT_S, limit / 6)
    # fixed, not what is left: the least-peak program is cached per (problem, options)
    fine_s = limit * AUTO_FINE_SHARE  # whether or not store-all fits: the same options
    # only where the whole program is coarsened: elsewhere the MILP keeps its time (it is exact)
    anneal_s = limit * AUTO_ANNEAL_SHARE if _coarsened(problem) else 0.0
    milp_s = limit - polish_s - dp_s - anneal_s
    store_all = solve(problem, budget_bytes, "store_all")
    # the MILP solver's own least-peak time at this limit: auto's least peak is then no worse
    # for lack of time than the MILP's alone (NOTE [The least peak's time]), unless store-all
    # fits (NOTE [The least peak where store-all fits]; both in solvers/least.py)
    least_s = limit * (AUTO_FITTING_LEAST_SHARE if store_all.feasible else 0.25)
    prog_s = timeshare.program_floor(limit)  # each program's least: NOTE [Short limits]
    milp = MilpOptions(time_limit_s=max(prog_s, milp_s - fine_s), least_start=least_start,
                       least_time_limit_s=least_s, refine_left=False, min_program_s=prog_s)
    brief = store_all.feasible and not least_peak  # no least-peak program (solve's docstring)
    if not brief:
        least.start(problem, milp)  # NOTE [Work aside] in solvers/aside.py
    cheap = _cheap(problem, budget_bytes, start + limit * AUTO_CHEAP_SHARE, store_all)
    cheap_s = time.perf_counter() - start
    # NOTE [Schedules remembered]; NOTE [Close enough]
    remembered = fitting(problem, budget_bytes, candidates) if not cheap[0].feasible else []
    settled = _close_enough(problem, cheap + remembered)  # store-all, where no variant saves
    dp_options = dp.DpOptions(mode="memory" if settled else "time", time_limit_s=dp_s)
    lower_sets = solve(problem, budget_bytes, "dp", dp_options)  # memory: only its least peak
    # a start for polishing, annealing and windows, not a heuristic that settles anything
    starts = [] if settled else kept_starts(problem, budget_bytes,
                                            limit * AUTO_BOUND_KEPT_SHARE)
    bare = not lower_sets.feasible and not any(r.feasible and _once(r) for r in cheap)
    near = bare and budget_bytes <= (1 + AUTO_FLOOR_CUTS_NEAR) * min(
        (r.min_feasible_bytes for r in cheap if r.min_feasible_bytes), default=0)
    cuts = None if settled else lazy_cuts(problem, budget_bytes, limit * (
        AUTO_FLOOR_CUTS_SHARE if near else AUTO_CUTS_SHARE))
    if cuts is not None:  # NOTE [Proven close enough] in solvers/lazy_cuts.py
        starts.append(cuts)
        settled = cuts.feasible and cuts.objective_s - cuts.bound_s <= \
            AUTO_CLOSE_ENOUGH * problem.no_recompute_time_s
    if not settled:  # NOTE [The least peak's time] in solvers/least.py
        before = time.perf_counter()
        if not least.running(problem, milp):
            least.least_peak(problem, milp)  # here, unless cached
        spent = max(time.perf_counter() - before, milp_s / 4)
        share = milp_s - fine_s
        if bare:  # NOTE [Nothing cheap fits]
            share = milp_s + anneal_s
        # NOTE [Heuristics in their time]: the phases after the MILP keep their time (all
        # but the DP's and the MILP's share), less what the heuristics took past their grace
        after = limit - dp_s - share
        end = deadline + min(cheap_s, limit * AUTO_CHEAP_GRACE) - after
        milp = dataclasses.replace(milp, time_limit_s=max(prog_s, min(
            share - spent, end - time.perf_counter())))
    results = cheap if settled else \
        cheap + [lower_sets, solve(problem, budget_bytes, "milp", milp)]
    floors = [(r.min_feasible_bytes, r.floor_schedule) for r in results + [lower_sets]]
    if settled and not brief:  # the MILP's least peak, as if it had run
        floors.append(least.least_peak(problem, milp))
    min_peak, floor = floor_of(floors)
    feasible = [r for r in results + remembered + starts if r.feasible]
    if feasible and not settled:  # NOTE [Polishing] in solvers/evict.py
        top = sorted((r for r in feasible if _once(r)),
                     key=lambda r: (r.objective_s, r.peak_bytes))[:AUTO_POLISH_SCHEDULES]
        polished = evict.polish(problem, budget_bytes, [r.schedule for r in top], max(
            prog_s, deadline - fine_s - prune_s - anneal_s - time.perf_counter())) if top else None
        if polished is not None and polished.objective_s < top[0].objective_s:
            feasible.append(dataclasses.replace(polished, note=(
                "kept sets of the best schedules (" + ", ".join(r.solver for r in top) +
                ") recomputed on demand and put back into greedily")))
        once = [r for r in feasible if _once(r)]  # annealing starts from these alone too
        if once:
            feasible.append(_annealed(problem, budget_bytes, once, deadline - fine_s - prune_s))
        # NOTE [Pruned before windows] in solvers/prune.py
        target = _pruned(problem, budget_bytes, _to_refine(problem, feasible),
                         time.perf_counter() + prune_s)
        feasible.append(_refined(problem, budget_bytes, target, deadline - prune_s))
        feasible.append(_pruned(problem, budget_bytes, min(
            feasible, key=lambda r: (r.objective_s, r.peak_bytes)), deadline))
    if not feasible:  # NOTE [Checkmate where nothing fits] in solvers/last_tries.py
        min_peak, floor, feasible = last_tries.last_tries(problem, budget_bytes, start, limit,
                                                         min_peak, floor)
    elapsed = time.perf_counter() - start
    if not feasible:
        return SolveResult(solver="auto", status=Status.INFEASIBLE, schedule=None,
                           objective_s=None, peak_bytes=None, bound_s=results[0].bound_s,
                           gap=None, solve_time_s=elapsed, min_feasible_bytes=min_peak,
                           floor_schedule=floor)
    min_peak, floor = floor_of([(min_peak, floor)] + [(r.peak_bytes, r.schedule)
                                                      for r in feasible])
    best = min(feasible, key=lambda r: (r.objective_s, r.peak_bytes))
    # bounds that hold for every schedule: the joint MILP's own holds within its space (NOTE
    # [A valid bound] in solvers/joint.py), the boundary bound it proved is recalled here
    bound = max([r.bound_s for r in results if r.bound_s is not None and r.solver != "milp"]
                + [problem.no_recompute_time_s, proved_bound(problem, budget_bytes) or 0.0]
                + ([cuts.bound_s] if cuts is not None and cuts.bound_s is not None else []))
    gap = gap_of(best.objective_s, bound)
    status = Status.OPTIMAL if gap <= MilpOptions().rel_gap + 1e-9 else Status.FEASIBLE
    return SolveResult(solver=f"auto:{best.solver}", status=status, schedule=best.schedule,
                       objective_s=best.objective_s, peak_bytes=best.peak_bytes,
                       bound_s=bound, gap=gap, solve_time_s=elapsed,
                       min_feasible_bytes=min_peak, note=best.note, floor_schedule=floor)
