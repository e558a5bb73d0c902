"""Situations an optimized module could not plan under its limit, remembered per step key."""
from __future__ import annotations

from monet_opt.errors import InfeasibleBudgetError


# NOTE [Situations found infeasible]
#   A step planned for a new situation (another batch shape, hooks, autocast) can be infeasible
#   under the module's limit. A loop that catches the error and goes on (skipping the batches
#   too long to fit) met it again at every such batch, and each time traced, profiled and
#   solved the situation again (seconds each) to raise the same error. Nothing that decides the
#   plan is outside the step's key (the limit is the module's), so the error is remembered by
#   key and raised again at once, as a copy without the first call's traceback: its frames
#   hold that call's inputs, which would stay alive with the remembered error. The least peak
#   a solver reaches depends on its time, which is not in the key: a limit a longer solve would
#   meet stays refused (optimize() again plans anew); an error where no schedule at all was
#   found in the time is not remembered.
class Refused:
    def __init__(self) -> None:
        self._errors: dict[tuple, InfeasibleBudgetError] = {}

    def remember(self, key: tuple, err: InfeasibleBudgetError) -> None:
        """Not where the solver found no schedule at all in its time (a slow moment's)."""
        if err.min_feasible_bytes is not None:
            self._errors[key] = _copy(err, "monet_opt: this situation is not planned again: "
                                      "its error is raised at once at each later call.")

    def again(self, key: tuple) -> None:
        """Raises the error remembered for `key`, if any."""
        err = self._errors.get(key)
        if err is not None:
            raise _copy(err)


def _copy(err: InfeasibleBudgetError, note: str = "") -> InfeasibleBudgetError:
    twin = InfeasibleBudgetError.__new__(InfeasibleBudgetError)
    twin.__dict__.update(err.__dict__)
    twin.args = err.args
    twin.__notes__ = [*getattr(err, "__notes__", ()), *filter(None, [note])]
    return twin
