"""What a solver decides, and what it reports."""
from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """One training step's plan.

    The forward phase runs every forward op once, in problem order (so random ops draw from the
    generator in the same order as eager PyTorch). `kept` are the forward tensors held from the
    forward into the backward. `backward` is the order of the backward phase: every backward op
    exactly once, plus forward ops that are recomputed (a forward op id appearing here).
    Every tensor is freed right after its last read (NOTE [Lifetimes] in simulate.py).
    `variants` are the ids of the problem's variants in use (Problem.with_variants).
    """

    kept: frozenset[int]
    backward: tuple[int, ...]
    variants: frozenset[int] = frozenset()

    def to_json(self) -> str:
        return json.dumps({"kept": sorted(self.kept), "backward": list(self.backward),
                           "variants": sorted(self.variants)})

    @staticmethod
    def from_json(text: str) -> Schedule:
        d = json.loads(text)
        return Schedule(kept=frozenset(d["kept"]), backward=tuple(d["backward"]),
                        variants=frozenset(d.get("variants", ())))


def gap_of(time_s: float, bound_s: float | None) -> float | None:
    """(time - bound) / time, at least 0 (SolveResult.gap); None without a bound."""
    if bound_s is None:
        return None
    return max(0.0, (time_s - bound_s) / time_s) if time_s > 0 else 0.0


class Status(str, enum.Enum):
    OPTIMAL = "optimal"        # proven least step time within the budget
    FEASIBLE = "feasible"      # within the budget, optimality not proven
    INFEASIBLE = "infeasible"  # this solver found no schedule within the budget
    TIMEOUT = "timeout"        # stopped by the time limit without a schedule


@dataclass(frozen=True)
class SolveResult:
    """solver: registry name. objective_s: predicted step time of `schedule`. peak_bytes: its
    simulated peak. bound_s: a proven lower bound on the step time of any schedule within the
    budget (the joint MILP's, where its program is whole and counts what the simulator counts:
    of any schedule in its program's space, which recomputes an op only in a stage that reads
    it: NOTEs [A valid bound], [Counted above the step] in solvers/counted.py).
    gap: (objective - bound) / objective. min_feasible_bytes: the least peak this solver can
    reach at any budget (what an infeasible caller should raise the budget to).
    floor_schedule: a schedule whose simulated peak is min_feasible_bytes, where the solver
    found that least peak by a search a clock can cut short (NOTE [Least peaks remembered] in
    solvers/remembered.py); None where the same search always finds it again."""

    solver: str
    status: Status
    schedule: Schedule | None
    objective_s: float | None
    peak_bytes: int | None
    bound_s: float | None
    gap: float | None
    solve_time_s: float
    min_feasible_bytes: int | None
    note: str = ""
    floor_schedule: Schedule | None = None

    @property
    def feasible(self) -> bool:
        return self.schedule is not None and self.status in (Status.OPTIMAL, Status.FEASIBLE)


# NOTE [A bound its own schedule refutes]
#   A bound is a claim about every schedule within the budget, the result's own included. A
#   program that cannot represent a schedule it was handed (the warm start, a heuristic's) may
#   prove a bound above that schedule's time: the MILP called 13.27 s optimal with a bound of
#   14.53 s (two variants of one op; solvers fuzzing, 2026-12-02), and gap_of's clamp at 0 hid
#   it. Such a bound proves nothing: it is dropped, the status is at most FEASIBLE, the note
#   says so.
def without_refuted_bound(result: SolveResult) -> SolveResult:
    """`result`, its bound dropped where its own schedule is faster (NOTE above), and raised
    to 0 where it is below (no step takes less; a program's bound of -0.005 s made a gap of
    165 %)."""
    if result.bound_s is not None and result.bound_s < 0:
        result = dataclasses.replace(result, bound_s=0.0, gap=None if result.objective_s is None
                                     else gap_of(result.objective_s, 0.0))
    if result.bound_s is None or result.objective_s is None or \
            result.bound_s <= result.objective_s * (1 + 1e-9) + 1e-12:
        return result
    note = (f"the program's bound {result.bound_s:.6g} s is above this schedule's own time: "
            f"dropped, not a proof")
    return dataclasses.replace(
        result, bound_s=None, gap=None,
        status=Status.FEASIBLE if result.status == Status.OPTIMAL else result.status,
        note=f"{result.note}; {note}" if result.note else note)
