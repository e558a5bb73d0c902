"""Pure optimization over an abstract training-step graph. Never imports torch."""
from solvers.errors import (InvalidProblemError, InvalidScheduleError, SolverError,
                            UnknownSolverError)
from solvers.ondemand import schedule_from_kept
from solvers.problem import NO_PRODUCER, Op, Problem, Tensor, Variant
from solvers.prune import without_unread
from solvers.registry import available_solvers, solve
from solvers.schedule import Schedule, SolveResult, Status
from solvers.simulate import Simulation, alive_at, simulate

__all__ = ["NO_PRODUCER", "InvalidProblemError", "InvalidScheduleError", "Op", "Problem",
           "Schedule", "Simulation", "SolveResult", "SolverError", "Status", "Tensor",
           "UnknownSolverError", "Variant", "alive_at", "available_solvers", "schedule_from_kept",
           "simulate", "solve", "without_unread"]
