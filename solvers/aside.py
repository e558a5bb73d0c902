"""A computation run aside, in a forked child process, while the caller goes on.

NOTE [Work aside]
  HiGHS solves one program on one core, and the machines we are measured on have two. "auto"
  always needs the memory-centric program's answer (the least budget it can meet), but needs
  it only at its end, and that program took a quarter of the MILP's share out of auto's minute
  (15 s of 60 on ResNet-50, b32 160²). So auto starts it aside, in a forked child (which forks
  its own HiGHS children, NOTE [HiGHS in a child process] in solvers/highs.py), and searches on
  the other core meanwhile. The child sends its result back through a pipe when done; a child
  that dies or raises is reported as a SolverError, never as a missing result. Where the
  platform cannot fork, nothing is begun aside and auto runs the program first, as before.
"""
from __future__ import annotations

import multiprocessing
import traceback
from typing import Any, Callable

from solvers.errors import SolverError
from solvers.highs import drop_inherited_scheduler


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


class Aside:
    """fn(*args) computed in a forked child; result() waits for it, once."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        if not can_fork():
            raise SolverError("solvers.aside: this platform cannot fork; run the computation "
                              "in the caller instead")
        self.fn = fn
        ctx = multiprocessing.get_context("fork")
        self.receive, send = ctx.Pipe(duplex=False)
        # not a daemon: it forks HiGHS children of its own, which daemons may not
        self.child = ctx.Process(target=_run, args=(send, fn, args), daemon=False)
        self.child.start()
        send.close()

    def result(self, timeout_s: float | None = None) -> Any:
        """The value, waiting for the child as long as it takes (its work has its own time
        limit), or at most `timeout_s`: then the child is stopped and TimeoutError raised."""
        if self.child is None:
            raise SolverError(f"{self._name()} was cancelled, or its result already taken")
        try:
            if timeout_s is not None and not self.receive.poll(timeout_s):
                raise TimeoutError(f"{self._name()} gave no result in {timeout_s:g} s")
            kind, payload = self.receive.recv()
        except EOFError:
            raise SolverError(f"{self._name()} died in its child process without a result "
                              f"(exit code {self.child.exitcode})") from None
        finally:
            self.cancel()
        if kind == "error":
            raise SolverError(f"{self._name()} failed in its child process: {payload}")
        return payload

    def cancel(self) -> None:
        """Stop the child, if still running; the result is then lost."""
        if self.child is not None:
            self.child.kill()
            self.child.join()
            self.receive.close()
            self.child = None

    def _name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


def _run(send, fn: Callable[..., Any], args: tuple) -> None:
    try:
        drop_inherited_scheduler()  # NOTE [HiGHS after fork] in solvers/highs.py
        value = fn(*args)
    except BaseException:  # reported to the parent, which raises it as a SolverError
        send.send(("error", traceback.format_exc(limit=8)))
    else:
        send.send(("done", value))
    finally:
        send.close()
