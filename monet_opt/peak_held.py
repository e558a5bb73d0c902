"""What a schedule holds at its peak, by kind.

NOTE [Held at the peak]
  A peak is a sum: which tensors the step holds at the moment it peaks, and what makes it
  higher than the limit asked for. `held_at` reads that moment off the simulator
  (`solvers.alive_at`) and sorts every resident tensor into what a smaller batch does not
  shrink (the fixed memory: parameters, buffers, inputs; the gradients the backward has
  returned so far) and what it does (tensors the forward made, kept for the backward or not
  yet freed, forward tensors recomputed in the backward, what the backward made: gradients
  of activations and the output gradients), plus the op's workspace. The parts sum to the
  simulated peak to the byte. `Plan.explain()` prints it for the plan's peak, and
  InfeasibleBudgetError for the least peak's schedule, so that a refused limit says whether a
  smaller batch would help.
"""
from __future__ import annotations

from dataclasses import dataclass

from monet_opt.units import format_bytes
from solvers import NO_PRODUCER, Problem, Schedule, Simulation, alive_at, simulate
from solvers.simulate import captured

LARGEST = 3  # tensors named, largest first
_KINDS = {"gradients": "a gradient returned", "kept": "from the forward",
          "recomputed": "recomputed", "backward": "made by the backward"}


@dataclass(frozen=True)
class Part:
    """Tensors of one kind resident at the peak: their bytes and how many."""

    bytes: int = 0
    tensors: int = 0

    def text(self, what: str) -> str:
        return f"{what} {format_bytes(self.bytes)} ({self.tensors})"


@dataclass(frozen=True)
class HeldAtPeak:
    """NOTE [Held at the peak]. `largest`: (tensor, bytes, kind and the source of its op)."""

    op: str
    fixed_bytes: int
    gradients: Part
    kept: Part
    recomputed: Part
    backward: Part
    workspace_bytes: int
    largest: tuple[tuple[str, int, str], ...]
    in_place_bytes: int = 0  # the op's output written into an input that dies there

    @property
    def total_bytes(self) -> int:
        parts = (self.gradients, self.kept, self.recomputed, self.backward)
        return self.fixed_bytes + sum(p.bytes for p in parts) + self.workspace_bytes - \
            self.in_place_bytes

    def text(self) -> str:
        """One line: each kind's bytes and tensor count, then the fixed memory."""
        return ", ".join([self.gradients.text("gradients"), self.kept.text("from the forward"),
                          self.recomputed.text("recomputed"),
                          self.backward.text("made by the backward"),
                          f"workspace {format_bytes(self.workspace_bytes)}"]) + \
            (f", less {format_bytes(self.in_place_bytes)} its output shares with a dying input"
             if self.in_place_bytes else "") + f"; with the fixed {format_bytes(self.fixed_bytes)}"

    def largest_text(self) -> str:
        return "; ".join(f"{name} {format_bytes(n)} ({kind})" for name, n, kind in self.largest)


def held_at(problem: Problem, schedule: Schedule, labels: tuple[str, ...] = (),
            sim: Simulation | None = None) -> HeldAtPeak | None:
    """NOTE [Held at the peak] for `schedule`'s simulated peak (`sim`, where simulated
    already); None for an empty step."""
    sim = sim or simulate(problem, schedule)
    if not sim.steps:
        return None
    plain = problem.with_variants(schedule.variants)
    n_fwd = len(problem.forward_ops)
    returned = set(problem.backward_outputs)
    parts: dict[str, list[int]] = {k: [0, 0] for k in ("gradients", "kept", "recomputed",
                                                        "backward")}
    sizes = []
    for t, born in alive_at(problem, schedule, sim.peak_step):
        tensor = plain.tensors[t]
        made_by = plain.ops[tensor.producer] if tensor.producer != NO_PRODUCER else None
        if t in returned:
            kind = "gradients"
        elif made_by is None or made_by.is_backward:
            kind = "backward"
        else:
            kind = "kept" if born < n_fwd else "recomputed"
        parts[kind][0] += tensor.bytes
        parts[kind][1] += 1
        label = labels[tensor.producer] if labels and kind in ("kept", "recomputed") else ""
        where = f", in {label.split(' in ', 1)[1]}" if " in " in label else ""  # module path
        sizes.append((tensor.name, tensor.bytes, _KINDS[kind] + where))
    op = plain.ops[sim.steps[sim.peak_step]]
    phase = "forward" if sim.peak_step < n_fwd else "backward"
    workspace = op.run_workspace_bytes(first=phase == "forward", captured=sim.steps[
        sim.peak_step] in captured(problem, schedule))  # NOTE [The capture's copy]
    largest = tuple(sorted(sizes, key=lambda s: -s[1])[:LARGEST])
    return HeldAtPeak(op=f"{op.name}, {phase}", fixed_bytes=sim.fixed_bytes,
                      **{k: Part(*v) for k, v in parts.items()},
                      workspace_bytes=workspace, largest=largest,
                      in_place_bytes=op.inplace_bytes)
