"""One exception hierarchy for the solvers package."""


class SolverError(Exception):
    """Base class of every error raised by `solvers`."""


class InvalidProblemError(SolverError, ValueError):
    """The Problem is malformed (not topological, dangling ids, negative sizes)."""


class InvalidScheduleError(SolverError):
    """A Schedule cannot run: a tensor is read before it exists or after it was freed, or a
    backward op is missing or repeated. Raised by `simulate()`; a solver that returns such a
    schedule has a bug."""


class UnknownSolverError(SolverError, KeyError):
    """No solver is registered under that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])
