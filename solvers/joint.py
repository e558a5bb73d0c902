"""The MILP as a solver: warm start, solve, check with the simulator, report honestly."""
from __future__ import annotations

import dataclasses
import math
import time

from solvers import baselines, coarse, evict, fine, prune, timeshare, variants, windows
from solvers.bound import boundary_bound
from solvers.counted import counted_above
from solvers.least import least_peak
from solvers.least import start as start_least_peak
from solvers.milp import MilpOptions, Program, build_stages, solve_program
from solvers.mip import band, solve_relaxation
from solvers.ondemand import schedule_from_kept
from solvers.problem import Problem
from solvers.remembered import floor_of
from solvers.schedule import Schedule, SolveResult, Status, gap_of
from solvers.simulate import fastest_within, simulate

# Of the time left after the warm start, the share the whole program gets before windows of it
# are solved one at a time (NOTE [Windows of stages] in solvers/windows.py); where nothing
# could start it, the larger share (NOTE [No start, longer search]).
WHOLE_PROGRAM_SHARE = 0.5
NO_START_SHARE = 0.8
# The share of the MILP's time its heuristic warm starts may take (a cap: they take a second
# or two on the bench's models, and go on from what "auto" found: NOTE [Heuristics in their
# time] in solvers/registry.py).
HEURISTIC_SHARE = 0.2
# The least time left worth refining a schedule the program did not find (NOTE [Time left
# near the floor]).
REFINE_LEFT_MIN_S = 1.0
# The most of that time left pruning may take before fine windows begin.
PRUNE_LEFT_SHARE = 0.25

# NOTE [Time left near the floor]
#   Near its least peak the whole program (recomputation at stage starts only) is often proved
#   infeasible within seconds (or ends early, having found nothing better), and the schedule
#   returned was the memory-centric program's (or the warm start's), tight and slow, with the rest
#   of the time limit unused: at 10 % above the least peak on the CPU bench (0ef195b, limit 30 s)
#   the MILP solver ended in 8-20 s on GPT-2 (narrow), MobileNetV2, GoogLeNet and DenseNet-121 at
#   +52.6 / +34.2 / +45.3 / +129.9 %, where "auto", which refines its best by fine windows (NOTE
#   [Fine windows] in solvers/fine.py), measured +28.7 / +10.2 / +31.0 / +42.2 %. The time left now
#   goes to fine windows on that schedule (each window a small program at full resolution: still the
#   MILP's). "auto" sets refine_left off: it refines its best itself, in its own share. On the kept
#   GoogLeNet CPU problem at the MILP's least peak and 10 / 20 % above it: +47.0 / +41.6 / +40.4 %
#   -> +38.0 / +25.2 / +21.3 %; DenseNet-121's H200 problem +26.1 % at all three -> +25.0 / +25.1 /
#   +23.4 % (docs/benchmarks/milp_time_left.md). At the least peak itself windows may move
#   nothing, where the schedule still recomputes what it need not: the time left first prunes it
#   (NOTE [Pruning recomputation] in solvers/prune.py; at most PRUNE_LEFT_SHARE of it). The
#   bench's GoogLeNet profile at 3b69dad at the MILP's least peak (148.8 MiB), limit 30 s:
#   +111.8 % in 10.0 s -> +108.7 % (59 recomputations dropped) in 12.8 s; the kept problems
#   above came out the same.

# NOTE [The least peak within the limit]
#   The MILP solver reports the least budget it meets again (min_feasible_bytes), from its
#   memory-centric program (solvers/least.py), which runs for least_time_limit_s (a quarter of
#   the limit by default). Alone it ran that program at its end, past its limit: GoogLeNet and
#   ResNet-50 (the CPU's kept problems, 25 % of the activations, limit 30 s) took 38.9 and
#   38.8 s. It now begins the program aside (NOTE [Work aside] in solvers/aside.py), as "auto"
#   does, on the core its search leaves idle: the same plans (+27.5 / +59.4 % predicted) in
#   30.1 s each (GoogLeNet at half its activations +5.2 %, 39.3 -> 30.1 s). Where the platform
#   cannot fork, or the problem is small (least.ASIDE_MIN_OPS), it still runs at the end.

# NOTE [No start, longer search]
#   Where no heuristic schedule and no rounding of the LP fits the budget (near the least peak),
#   windows of stages have nothing to refine until the whole program, or the coarser one aside
#   (NOTE [A coarser program aside]), finds a schedule; with half the time left they often found
#   none, or a poor one, and the memory-centric program's schedule, tight at every moment,
#   went on instead. What came out varied from solve to solve: ResNet-50 made channels-last
#   (b16 128², `make bench-channels-last`'s profile at 14b1782) at 289.9 MiB, auto in 30 s,
#   five solves: +34/+124/+147/+39/+123 % predicted (the bench's own solve +147 %, measured
#   +138 %), the MILP solver alone +22/+76 %. With 80 % of the time left to the whole program
#   (and to the ladder aside, which runs as long): four solves, +17.3 % each; at 286.3 / 295 /
#   305 MiB, one solve each, +31.0/+12.3/+62.1 % -> +17.5/+12.6/+13.9 %. `make
#   bench-near-floor`'s ResNet-50 (auto in 30 s at the least peak and 2/5/10/20 % above it,
#   two solves each) +20.6/+16.8-30.9/+171.8-173.7/+12.0/+5.5-5.7 % ->
#   +18.9/+16.2/+12.5/+12.3/+6.3 %; its GoogLeNet, where annealing makes the plan near the
#   least peak, alike: +35.3/+34.7/+32.1-32.3/+27.4/+21.1-24.6 % ->
#   +35.3/+34.7/+30.5-31.8/+27.4/+21.8-22.9 %. Where a schedule starts the program, windows
#   refine it and the share stays half.


def milp(problem: Problem, budget_bytes: int, options: MilpOptions) -> SolveResult:
    """Least step time within the budget. Warm-started from the best heuristic schedule that
    fits; the whole program gets half the time left (NO_START_SHARE of it where nothing fits to
    start from: NOTE [No start, longer search]), windows of it the rest (NOTE [Windows of
    stages]); the fastest schedule any of them found is returned (FEASIBLE unless the whole
    program was proved optimal). min_feasible_bytes comes from the memory-centric program
    (solvers/least.py, whose schedule is the floor_schedule when it is the lower) and the
    heuristics: a budget the same call meets again (a schedule found at a looser budget may
    peak lower; its peak is not reported, since a search at that budget need not find it
    again)."""
    start = time.perf_counter()
    options = timeshare.with_floor(options)  # NOTE [Short limits]
    deadline = start + options.time_limit_s
    start_least_peak(problem, options)  # NOTE [The least peak within the limit]
    stages = build_stages(problem, options.max_recompute_vars, options.max_held_vars)
    heuristic = _heuristic(problem, budget_bytes,
                           start + options.time_limit_s * HEURISTIC_SHARE)
    # NOTE [A coarser program aside], begun before the bound and the relaxation where no
    # heuristic fits (NOTE [The ladder's head start]); dropped if the relaxation's rounding fits
    aside = coarse.start(problem, budget_bytes, options,
                         (deadline - time.perf_counter()) * NO_START_SHARE) \
        if not heuristic.feasible and stages.max_stages is not None else None
    valid = boundary_bound(problem, budget_bytes, min(10.0, options.time_limit_s / 5))
    if valid == math.inf:  # some moment of the backward cannot fit
        coarse.cancel(aside)
        min_feasible, floor = _floor(problem, options, heuristic)
        return SolveResult(solver="milp", status=Status.INFEASIBLE, schedule=None,
                           objective_s=None, peak_bytes=None, bound_s=None, gap=None,
                           solve_time_s=time.perf_counter() - start,
                           min_feasible_bytes=min_feasible, floor_schedule=floor,
                           note="the budget cannot hold what the backward must have at one "
                                "of its moments (NOTE [Cuts through the backward])")
    program = Program(stages, budget_bytes)
    # NOTE [The relaxation's time]: its rounding is the best start on large graphs. Capped at
    # a quarter of the MILP's time, it missed DenseNet-121 (b16, 160², 40 %) inside auto's
    # 60 s: the LP takes 4.9 s there and got 4.5, and auto ended at +8.0 to +8.7 % from the
    # heuristics; rounded, it starts at +4.4 %. A cap, not a share: the LP stops when solved.
    warm = _best_start(problem, budget_bytes, program, heuristic, options.time_limit_s / 2)
    # the whole program gets a share of what is left; windows the rest (NOTE [Windows of stages])
    share = (deadline - time.perf_counter()) * (
        WHOLE_PROGRAM_SHARE if warm is not None else NO_START_SHARE)
    if warm is not None:
        coarse.cancel(aside)
        aside = None
    res, sched = solve_program(program, _remaining(options, time.perf_counter() + share), warm)
    coarsened = _notes(stages)
    notes = list(coarsened)
    found = [(sched, "milp"), (warm, "warm start")]
    other = coarse.collect(aside, problem, budget_bytes)
    if other is not None:
        found.append((other[1], "coarser program"))
    best = fastest_within(problem, budget_bytes, found, "the MILP")
    if best is None:  # the memory-centric program's schedule may fit where nothing else did
        found.append((least_peak(problem, options)[1], "memory-centric program"))
        best = fastest_within(problem, budget_bytes, found, "the MILP")
    if best is not None and best[2] == "coarser program":
        notes.append(f"a coarser program ({len(other[0].st.groups)} stages), searched aside, "
                     "found a faster schedule (NOTE [A coarser program aside])")
        program, sched = other
    if best is not None and res.status != "optimal" and program.start_values(best[0]):
        best, res = _by_windows(program, best, res, options, deadline, notes,
                                again=sched is not None)
    # collected last: "auto" begins it aside (NOTE [Work aside] in solvers/aside.py)
    min_feasible, floor = _floor(problem, options, heuristic)
    found = [(best[0], best[2])] if best is not None else []
    best = fastest_within(problem, budget_bytes, found + [
        (least_peak(problem, options)[1], "memory-centric program")], "the MILP")
    # NOTE [A valid bound]: a coarsened program (merged stages, a recompute window) searches
    # part of the schedules only, so its bound is no bound on the rest: another solver's
    # schedule can beat it. The result then reports the boundary bound (solvers/bound.py) or
    # the no-recompute time, whichever is higher: both hold for every schedule. The whole
    # program too recomputes an op only in a stage that reads it (MONeT's space), so its
    # "optimal" and its bound are within that space: Checkmate's schedule recomputing an op a
    # stage early beat one by 8 % (solvers fuzzing, 2026-12-02); auto reports only bounds
    # that hold for every schedule (solvers/registry.py). Where the program counts more than
    # the simulator (NOTE [Counted above the step]), its bound holds for no space either.
    whole = max(valid or 0.0, problem.no_recompute_time_s)
    bound = max(res.bound or 0.0, whole)
    above = counted_above(problem, first_runs=True)  # NOTE [Counted above the step]
    banded = band(budget_bytes)  # NOTE [Rows that must hold to the byte] in solvers/mip.py
    if coarsened or above or banded:
        if res.bound is not None:
            within = "within that space" if coarsened else f"counting {above} at full size" \
                if above else f"held {banded} B under the budget"
            notes.append(f"the program's bound {within} is {bound:.6g} s; the bound reported "
                         "is NOTE [The boundary bound]'s, valid for every schedule")
        bound = whole
    if best is None:
        status = Status.INFEASIBLE if res.status == "infeasible" else Status.TIMEOUT
        return SolveResult(solver="milp", status=status, schedule=None, objective_s=None,
                           peak_bytes=None, bound_s=None, gap=None,
                           solve_time_s=time.perf_counter() - start,
                           min_feasible_bytes=min_feasible, floor_schedule=floor,
                           note="; ".join(notes))
    s, sim, origin = best
    if origin not in ("milp", "windows", "coarser program"):
        notes.append(f"the schedule is the {origin}'s; the backend ended {res.status}")
        if options.refine_left and deadline - time.perf_counter() >= REFINE_LEFT_MIN_S:
            s, sim = _refined(problem, budget_bytes, s, sim, deadline, options, notes)
    gap = gap_of(sim.time_s, bound)
    status = Status.OPTIMAL if res.status == "optimal" and \
        gap <= options.rel_gap + 1e-9 else Status.FEASIBLE
    return SolveResult(solver="milp", status=status, schedule=s, objective_s=sim.time_s,
                       peak_bytes=sim.peak_bytes, bound_s=bound, gap=gap,
                       solve_time_s=time.perf_counter() - start,
                       min_feasible_bytes=min_feasible, floor_schedule=floor,
                       note="; ".join(notes))


def _floor(problem: Problem, options: MilpOptions,
           heuristic: SolveResult) -> tuple[int, Schedule | None]:
    """The least budget this call meets again, and its schedule where that is the memory-centric
    program's."""
    return floor_of([least_peak(problem, options), (heuristic.min_feasible_bytes, None)])


def _by_windows(program: Program, best, res, options: MilpOptions, deadline: float,
                notes: list[str], again: bool = True):
    """`best` refined window by window (NOTE [Windows of stages]); if the windows settle before
    the deadline, the whole program again from their schedule, unless not `again`: where the
    whole program had no start and found no schedule, the memory-centric program's is what
    windows refined, and the whole program did not move from that one either (NOTE [Nothing
    cheap fits]): the time left is the caller's. (best, the whole program's last result, with
    the highest bound either proved)."""
    problem = program.st.problem
    refined = windows.refine(program, best[0], options, deadline)
    notes.append(f"then refined in {refined.windows} windows of stages with the rest fixed "
                 f"(NOTE [Windows of stages]), {refined.improved} of them faster")
    if refined.improved:
        best = (refined.schedule, simulate(problem, refined.schedule), "windows")
    if again and deadline - time.perf_counter() > 2.0:
        last, sched = solve_program(program, _remaining(options, deadline), best[0])
        res = dataclasses.replace(last, bound=max(last.bound or 0.0, res.bound or 0.0) or None)
        notes.append("then the whole program again from there")
        best = fastest_within(problem, program.budget, [(sched, "milp"), (best[0], best[2])],
                              "the MILP")
    return best, res


def _refined(problem: Problem, budget_bytes: int, s: Schedule, sim, deadline: float,
             options: MilpOptions, notes: list[str]):
    """NOTE [Time left near the floor]: (schedule, simulation) pruned of the recomputation it
    can do without, in at most PRUNE_LEFT_SHARE of the time left, then refined by fine
    windows."""
    pruned = prune.prune(problem, s, budget_bytes, time.perf_counter() + PRUNE_LEFT_SHARE * (
        deadline - time.perf_counter()))
    dropped = len(s.backward) - len(pruned.backward)
    if dropped:
        s, sim = pruned, simulate(problem, pruned)
        notes.append(f"with the time left {dropped} recomputations it could do without dropped "
                     "(NOTE [Time left near the floor])")
    refined = fine.refine(problem, budget_bytes, s, deadline, options)
    if not refined.improved:
        return s, sim
    notes.append(f"then refined in {refined.windows} fine windows with the time left (NOTE "
                 f"[Time left near the floor]), {refined.improved} of them faster")
    return refined.schedule, simulate(problem, refined.schedule)


def _remaining(options: MilpOptions, deadline: float) -> MilpOptions:
    left = max(options.min_program_s, deadline - time.perf_counter())
    return dataclasses.replace(options, time_limit_s=left)


def _notes(stages) -> list[str]:
    notes = []
    if stages.max_stages is not None:
        notes.append(f"backward cut into {len(stages.groups)} stages (recomputation only at "
                     "their starts)")
    if stages.window is not None:
        notes.append(f"recomputation limited to ancestors within {stages.window} forward ops "
                     f"({stages.num_recompute_vars} recompute variables)")
    return notes


def _heuristic(problem: Problem, budget_bytes: int, deadline: float) -> SolveResult:
    """Chen's greedy and cheapest-first eviction, without variants and with the lightest ones,
    sharing the time to `deadline` (NOTE [Heuristics in their time] in solvers/timeshare.py):
    the fastest that fits (or the lowest peak)."""
    plan = [(name, fn, opts, chosen)
            for name, fn, opts in (("chen_greedy", baselines.chen_greedy,
                                    baselines.BaselineOptions()),
                                   ("evict", evict.evict, evict.EvictOptions()))
            for chosen in {frozenset(), variants.lightest(problem)}]
    runs = [variants.run_with(fn, problem, budget_bytes,
                              dataclasses.replace(opts, time_limit_s=limit), chosen)
            for (_, fn, opts, chosen), limit in zip(plan, timeshare.limits(
                [name for name, *_ in plan], deadline))]
    fits = [r for r in runs if r.feasible]
    if fits:
        best = min(fits, key=lambda r: (r.objective_s, r.peak_bytes))
    else:
        best = min(runs, key=lambda r: r.min_feasible_bytes)
    return dataclasses.replace(best, min_feasible_bytes=min(r.min_feasible_bytes for r in runs))


def _rounded_variants(program: Program, values: list[float]) -> frozenset[int]:
    """Per exclusive group, the variant the relaxation leans to most, if at least half."""
    best: dict[tuple[int, int], tuple[float, int]] = {}
    for v, e in enumerate(program.E):
        group = program.st.problem.variants[v].group
        if values[e] >= 0.5 and (group not in best or values[e] > best[group][0]):
            best[group] = (values[e], v)
    return frozenset(v for _, v in best.values())


def _best_start(problem: Problem, budget_bytes: int, program: Program, heuristic: SolveResult,
                time_limit_s: float) -> Schedule | None:
    """The fastest of Chen's greedy and Checkmate-style roundings of the LP relaxation (the
    variants it leans to; keep x where S[0][x] >= tau), each made runnable on demand and
    simulated."""
    best = (heuristic.objective_s, heuristic.schedule) if heuristic.feasible else None
    lp = solve_relaxation(program.mip, max(1.0, time_limit_s))
    if lp.values is None:
        return best[1] if best else None
    chosen = _rounded_variants(program, lp.values)
    for tau in (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
        kept = {x for x, v in program.S[0].items() if lp.values[v] >= tau}
        sched = schedule_from_kept(problem, kept, chosen)
        sim = simulate(problem, sched)
        if sim.peak_bytes <= budget_bytes and (best is None or sim.time_s < best[0]):
            best = (sim.time_s, sched)
    return best[1] if best else None
