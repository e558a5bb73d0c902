"""Schedules read off the cut program, with cuts added where they go over the budget.

NOTE [Cuts where the schedule goes over]
  A solution of the program of NOTE [Cuts through the backward] (solvers/bound.py) is a
  schedule, where it fits: keep the copies alive at the first cut; in each segment run the
  backward ops in order, each forward copy they or their reruns read recomputed on demand if
  it is not alive; before the next cut recompute what that cut's live set holds and is not
  alive, and let go of every copy it does not hold (reads after it recompute them). Its step
  time is the program's objective: it recomputes only ops the solution reruns in that
  segment. Between cuts nothing bounds its memory, so it goes over there; a cut at the
  backward op where it goes over most (of each run of steps over the budget, the worst few)
  bounds that moment, and the program is solved again. Where it goes over at a cut already
  there (a recomputation just before the cut's op, whose chain is alive then, or an encode
  op's reads in the forward, which NOTE [Forward rows] leaves out), that cut's row is given
  the excess less room instead; where it goes over in the forward, a forward row is added
  there. The first schedule that fits ends the rounds. Until some row is given less room or a
  forward row is added, every row holds for every schedule, so each round's proven bound
  bounds every schedule.
  The program grows with its cuts (CPU ResNet-50 at a quarter of its activations: 9 cuts
  solved in 13 s, 13 cuts not in 130 s); alone in 18 s, its schedule on CPU ResNet-50 at a
  third of its activations was +7.23 % (11 cuts, in 13 s) where auto's in 30 s is +8.06 %, but
  in auto's share of 30 s (a third, or 0.45: 13.5 s) it does not fit there. Auto in 30 s on
  the kept problems, with and without the rounds (docs/benchmarks/auto_shares.md): the sum
  of the 11 cells' predicted overheads +146.15 -> +144.78 % (GoogLeNet (CPU) at a third
  +13.33 -> +12.96 %, DenseNet-121 (H200) at a quarter +13.90 -> +13.45 %), the gaps auto
  reports 0.1-19.9 -> 0.0-4.2 %.

NOTE [Rounds near the floor]
  Near the least peak the rounds found no schedule that fits in their 0.45 of the limit, and
  what they took came out of the least-peak program's and the MILP's time: on U-Net (b4 128²,
  docs/benchmarks/problems_unet.json.gz) at its least peak, auto in 30 s spent 13.5 s in the
  rounds and 7.9 s in the least-peak program, the MILP had 8.4 s, found nothing of its own,
  and the memory-centric schedule (pruned) was auto's answer, +29.8 % predicted, where the
  MILP solver alone made +20.1 %; on CPU ResNet-50 (b16 128²) at its least peak and 5 and 20 %
  above it the rounds took 13.6 s each and fit nothing. So where nothing cheap fits (NOTE
  [Nothing cheap fits] in solvers/registry.py) within AUTO_FLOOR_CUTS_NEAR (5 %) of the least
  peak the heuristics found, the rounds get AUTO_FLOOR_CUTS_SHARE (0.1) of the limit. Further
  above, they keep 0.45: at a third of CPU ResNet-50's activations (22 % above that least
  peak, where nothing cheap fits either) they fit in their 13.5 s in one run (+7.31 %; with
  0.1 auto made +8.06 %, which is also what 0.45 made in earlier runs, auto_shares.md).
  `python -m monet_opt.bench_solvers --time-limit 30 --near-floor 1 --above 0,0.02,0.05` at
  the least peak and 2 / 5 % above it, 0.45 -> 0.1 (docs/benchmarks/floor_cuts.md): U-Net
  +29.8/+15.3/+12.0 -> +20.1/+15.9/+12.0 %; GoogLeNet (b32 128², problems_cpu)
  +29.8/+30.0/+26.6 -> +29.9/+29.4/+26.6 %; the bench's ResNet-50 (problems_bench_resnet50)
  +35.9/+31.2/+17.8 % both.

NOTE [Proven close enough]
  Where the schedule found is within AUTO_CLOSE_ENOUGH of the no-recompute step above the
  bound proven on the way (solvers/registry.py), no search can gain more than that, and auto
  stops there, as it does for a heuristic's schedule that close to store-all (NOTE [Close
  enough]). On the kept H200 DenseNet-121 at a third of its activations and BERT-base at a
  third, the rounds' schedule was auto's own 30 s answer, 0.05 and 0.01 points above the
  bound, found in 2.7 and 0.9 s.
"""
from __future__ import annotations

import time

from solvers.bound import build_program, cut_positions, cut_row
from solvers.bound_start import _ForwardRows
from solvers.mip import solve_mip
from solvers.ondemand import schedule_from_cuts
from solvers.problem import Problem
from solvers.schedule import SolveResult, Status, gap_of
from solvers.simulate import Simulation, simulate

CUTS_SOLVER = "bound_cuts"  # its results' solver name
# The program is solved to within this share of its optimum: the time-limited rounds stop
# sooner, and a schedule this close is refined afterwards anyway.
ROUND_GAP = 0.01
# The most new cuts a round adds: the worst moments over the budget (NOTE [Cuts where the
# schedule goes over]); 153 at once on CPU ResNet-50 made a program HiGHS did not solve in 2 min.
CUTS_PER_ROUND = 4
# The most of its time one round's solve may take: a program the clock cuts short still gives
# a schedule, and the rounds after it their chance.
ROUND_SHARE = 1 / 3


def lazy_cuts(problem: Problem, budget_bytes: int, time_limit_s: float) -> SolveResult:
    """NOTE [Cuts where the schedule goes over]: the first schedule read off the cut program
    that fits within `budget_bytes`, in at most `time_limit_s`; infeasible where none did."""
    start = time.perf_counter()
    deadline = start + time_limit_s
    rounds = _Rounds(problem, budget_bytes)
    found, bound = None, None
    # HiGHS's dual bound, optimal or not, where no state is counted above the simulator (NOTE
    # [Bounds without the states] in solvers/counted.py)
    bounds = problem.stateless() is problem
    while found is None and (left := deadline - time.perf_counter()) > 0:
        res, schedule, sim = rounds.solve(min(left, time_limit_s * ROUND_SHARE))
        if res is None:
            break
        if rounds.exact and res.bound is not None and bounds:
            bound = res.bound if bound is None else max(bound, res.bound)
        if sim.peak_bytes <= budget_bytes:
            found = (schedule, sim)
        elif not rounds.tighten(sim):
            break
    elapsed = time.perf_counter() - start
    if found is None:
        return SolveResult(solver=CUTS_SOLVER, status=Status.INFEASIBLE, schedule=None,
                           objective_s=None, peak_bytes=None, bound_s=bound, gap=None,
                           solve_time_s=elapsed, min_feasible_bytes=None)
    schedule, sim = found
    bound = max(bound or 0.0, problem.no_recompute_time_s)
    gap = gap_of(sim.time_s, bound)
    return SolveResult(solver=CUTS_SOLVER, status=Status.OPTIMAL if gap == 0 else
                       Status.FEASIBLE, schedule=schedule, objective_s=sim.time_s,
                       peak_bytes=sim.peak_bytes, bound_s=bound, gap=gap, solve_time_s=elapsed,
                       min_feasible_bytes=None,
                       note=f"the cut program's solution at {len(rounds.cuts)} cuts, read off "
                            "as a schedule (NOTE [Cuts where the schedule goes over])")


class _Rounds:
    """The cuts, forward rows and rooms taken so far, and a round of solving with them."""

    def __init__(self, p: Problem, budget_bytes: int) -> None:
        self.p, self.budget = p, budget_bytes
        self.cuts = cut_positions(p, 1)
        self.forward: dict[int, int] = {}  # forward position -> room taken from its row
        self.taken: dict[int, int] = {}  # cut position -> room taken from its row
        self.position = {b: q for q, b in enumerate(p.backward_ops)}

    @property
    def exact(self) -> bool:
        """Whether every row holds for every schedule: none has had room taken, and there is
        no forward row (NOTE [Forward rows]: it charges every copy alive at the first cut as
        held through the forward, where a schedule may make it again before that cut)."""
        return not self.forward and not self.taken

    def solve(self, left: float) -> tuple:
        """The program with this round's rows solved in `left` seconds, and its solution as a
        schedule and that schedule's simulation; (None, None, None) where HiGHS found none."""
        p = self.p
        prog = build_program(p, self.budget, self.cuts)
        if prog.mip.trivially_infeasible or not self.cuts:
            return None, None, None
        for j, q in enumerate(self.cuts):
            if q in self.taken:  # the row at q again, with less room
                cut_row(prog, j, q, self.budget, self.taken[q])
        rows = _ForwardRows(prog, self.budget)
        for k, taken in self.forward.items():
            rows.budget = self.budget - taken
            rows.add(k)
        res = solve_mip(prog.mip, "highs", time_limit_s=left, rel_gap=ROUND_GAP)
        if res.values is None:
            return None, None, None
        live = [{t for t, v in at.items() if res.values[v] > 0.5} for at in prog.live]
        chosen = frozenset(v for v, var in prog.chosen.items() if res.values[var] > 0.5)
        schedule = schedule_from_cuts(p, self.cuts, live, chosen)
        return res, schedule, simulate(p, schedule)

    def tighten(self, sim: Simulation) -> bool:
        """Rows where `sim` goes over the budget (NOTE [Cuts where the schedule goes over]);
        False where there is nothing to add."""
        n_fwd, steps = len(self.p.forward_ops), sim.steps
        new_cuts: set[int] = set()
        excess: dict[int, int] = {}
        worst = self._worst(sim)
        for k in worst:
            over = sim.live_bytes[k] - self.budget
            if k < n_fwd:  # a row there, then less room in it
                self.forward[k] = self.forward[k] + over if k in self.forward else 0
                continue
            later = next((s for s in steps[k:] if s in self.position), None)
            if later is None:  # after the last backward op: its gradients' recomputation
                continue
            q = self.position[later]
            if q in self.cuts:
                excess[q] = max(excess.get(q, 0), over)
            else:
                new_cuts.add(q)
        for q, over in excess.items():
            self.taken[q] = self.taken.get(q, 0) + over
        self.cuts = sorted(set(self.cuts) | new_cuts)
        return any(k < n_fwd for k in worst) or bool(new_cuts or excess)

    def _worst(self, sim: Simulation) -> list[int]:
        """The step where each run of consecutive steps over the budget is highest, the
        CUTS_PER_ROUND highest of those."""
        runs: list[list[int]] = []
        for k, live in enumerate(sim.live_bytes):
            if live > self.budget:
                if runs and runs[-1][-1] == k - 1:
                    runs[-1].append(k)
                else:
                    runs.append([k])
        tops = [max(run, key=lambda k: sim.live_bytes[k]) for run in runs]
        return sorted(tops, key=lambda k: -sim.live_bytes[k])[:CUTS_PER_ROUND]
