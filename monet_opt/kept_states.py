"""The generator states a schedule keeps, read from its problem (NOTE [States kept only where
used] in monet_opt/recompute.py), for what shows a stored schedule (`monet-opt precompute`,
`explain`): its step's prediction, as optimize() plans it."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from monet_opt import recompute
from solvers import Problem, SolveResult, simulate
from solvers.simulate import captured

if TYPE_CHECKING:
    from monet_opt.cache import Profile


def as_kept(profile: Profile, result: SolveResult) -> tuple[Problem, SolveResult]:
    """`profile`'s problem with the fixed bytes of the generator states `result`'s schedule
    does not keep left out, and `result` with its peak on it: a CPU step's problem as
    optimize() derives it counts one per random forward op; the step makes those it recomputes
    or replays alone. A recomputed op whose outputs the step holds anyway is counted as kept
    (which the step holds is known only as it runs: the safe side)."""
    problem, schedule = profile.problem, result.schedule
    if schedule is None or not profile.derived or not profile.key.device.startswith("cpu"):
        return problem, result
    kept = captured(problem, schedule)
    unkept = sum(problem.ops[i].is_random and i not in kept for i in problem.forward_ops)
    if not unkept:
        return problem, result
    problem = dataclasses.replace(problem, fixed_bytes=problem.fixed_bytes -
                                  unkept * recompute.rng_state_nbytes("cpu"))
    return problem, dataclasses.replace(result, peak_bytes=simulate(problem, schedule).peak_bytes)
