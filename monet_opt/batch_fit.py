"""What `largest_batch` reports: each batch it traced or tried (`Try`) and its answer
(`BatchFit`), with one line of text each."""
from __future__ import annotations

from dataclasses import dataclass

from monet_opt.module import OptimizedModule
from monet_opt.units import format_bytes


@dataclass(frozen=True)
class Try:
    """One batch size tried: whether a plan fit, the least peak the solver reached there and
    the peak with nothing recomputed (known where a plan fit), and the seconds it took.
    `profiled` False: the batch was only traced, and `least_bytes` is its size bound (NOTE [A
    least peak from sizes] in solvers/peak_bound.py), `fits` whether that is within the
    limit, or within `held_to` where that is set (the limit scaled to a try's least peak).
    `estimated`: its sizes alone solved by the lower-set DP; `least_bytes` is the DP's least
    peak (its size bound where the DP ran out of time), `fits` whether a schedule of those
    sizes fit the limit (an estimate of a try: proof neither way)."""

    batch: int
    fits: bool
    least_bytes: int | None  # None: the device ran out of memory first
    store_all_bytes: int | None
    seconds: float
    profiled: bool = True
    held_to: int | None = None  # traced against the limit scaled to a try, not the limit
    estimated: bool = False  # traced and solved briefly on its sizes: least_bytes a solve's

    @property
    def is_bound(self) -> bool:
        """Traced for its size bound alone (neither tried nor estimated)."""
        return not self.profiled and not self.estimated

    def text(self) -> str:
        if self.estimated:
            return (f"batch {self.batch:>6}: {('over', 'may fit')[self.fits]:<12} least peak "
                    f"about {_mib(self.least_bytes):>10} (the DP's on its sizes alone, not "
                    "profiled"
                    + ("" if self.held_to is None else
                       f"; against {_mib(self.held_to)}, the limit scaled to a try")
                    + f")  ({self.seconds:.1f} s)")
        if not self.profiled:
            status = ("may fit", "does not fit") if self.held_to is None else ("below", "above")
            return (f"batch {self.batch:>6}: {status[not self.fits]:<12} least peak at least "
                    f"{_mib(self.least_bytes):>13} (its sizes alone, not profiled"
                    + ("" if self.held_to is None else
                       f"; against {_mib(self.held_to)}, the limit scaled to a try")
                    + f")  ({self.seconds:.1f} s)")
        return (f"batch {self.batch:>6}: {'fits' if self.fits else 'does not fit':<12} least peak "
                + (f"{_mib(self.least_bytes):>13}" if self.least_bytes is not None
                   else "unknown (the device ran out of memory)")
                + (f", store-all {_mib(self.store_all_bytes)}"
                   if self.store_all_bytes is not None else "")
                + f"  ({self.seconds:.1f} s)")


@dataclass(frozen=True)
class BatchFit:
    """`batch`: the largest batch found to fit; `module`: its plan (an optimized module for
    inputs of that batch); `proven`: the next batch was tried, or traced, and did not fit (or
    `batch` is `max_batch`); `tries`: every batch traced (`Try.profiled` False; `estimated`
    where the DP solved its sizes) or tried, in order."""

    batch: int
    module: OptimizedModule
    proven: bool
    tries: tuple[Try, ...]

    def text(self) -> str:
        """One line per try and the answer, for a terminal."""
        lines = [f"  {t.text()}" for t in self.tries]
        plan = self.module.plan
        lines.append(f"largest batch {self.batch}" + ("" if self.proven else
                     " (not proven: the tries ran out before the next batch was tried)")
                     + f": predicted peak {_mib(plan.predicted_peak_bytes)} of "
                     f"{_mib(plan.memory_limit_bytes)}, predicted overhead "
                     f"{plan.predicted_overhead:+.1%} ({plan.solver})")
        return "\n".join(lines)


def _mib(n: int) -> str:
    """Bytes in MiB to a tenth (the tries of one search differ by a few MiB); under a MiB,
    as format_bytes has them (a small model's were all "0.0 MiB")."""
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else format_bytes(n)
