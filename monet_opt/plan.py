"""What optimize() decided, and why: the numbers and a readable table."""
from __future__ import annotations

from dataclasses import dataclass

from monet_opt import variants
from monet_opt.errors import internal_assert
from monet_opt.peak_held import HeldAtPeak, held_at
from monet_opt.units import Share, format_bytes
from solvers import Problem, Schedule, Simulation, SolveResult, schedule_from_kept, simulate


@dataclass(frozen=True)
class OpRow:
    """One operator of the plan. decision: 'kept', 'recomputed xN' (with the time of each
    run where that is not time_s), 'freed' (forward ops: freed after the forward's last use)
    or 'backward'. time_s: its run in the forward (or backward). recomputed: how often the
    backward re-runs it, each run priced rerun_s."""

    name: str
    label: str
    phase: str
    bytes: int
    time_s: float
    decision: str
    recomputed: int = 0
    rerun_s: float = 0.0


@dataclass(frozen=True)
class Timeline:
    """The simulated step, one entry per op run in execution order (forward, then backward with
    its recomputations): the op's profiled time and the bytes resident while it runs (fixed
    memory included). The backward phase starts at entry `backward_start`."""

    op_time_s: tuple[float, ...]
    live_bytes: tuple[int, ...]
    backward_start: int


@dataclass(frozen=True)
class Plan:
    memory_limit_bytes: int
    predicted_peak_bytes: int
    predicted_step_time_s: float
    solver: str
    status: str
    solve_time_s: float
    gap: float | None
    fixed_bytes: int           # parameters, buffers, inputs (CUDA: and NOTE [CUDA blocks]'s slack;
    #                            CPU: and NOTE [The step's generator states])
    gradient_bytes: int        # what the backward returns (parameter and input gradients)
    store_all_peak_bytes: int  # the peak with nothing recomputed
    store_all_step_time_s: float
    store_all_fixed_bytes: int  # the store-all step's fixed bytes (no generator state kept)
    min_feasible_bytes: int    # the least peak the solver reached (briefly searched
    # where store-all fits: NOTE [The least peak where store-all fits] in solvers/least.py)
    rows: tuple[OpRow, ...]
    solver_note: str = ""      # what the solver restricted or fell back to, if anything
    variants: tuple[str, ...] = ()  # the operator variants in use ("family:backward node")
    timeline: Timeline | None = None  # the predicted memory over the step
    in_place_runs: int = 0     # op runs writing into a dying input (NOTE [Writing into a dying
    #                            input] in solvers/simulate.py)
    in_place_backward: int = 0  # backward ops writing into a dying gradient (NOTEs [In-place
    #                            accumulation], [Elementwise backward ops in place])
    peak_op: str = ""          # the op run at the predicted peak, with its phase and workspace
    held_at_peak: HeldAtPeak | None = None  # what the step holds there (NOTE [Held at the peak])

    @property
    def store_all_activation_bytes(self) -> int:
        """The store-all peak above parameters, buffers, inputs and gradients: the same for
        every plan of a step, where `fixed_bytes` counts the generator states the plan keeps
        (it moved with them: API probe, 2026-12-06)."""
        return self.store_all_peak_bytes - self.store_all_fixed_bytes - self.gradient_bytes

    @property
    def recomputed_ops(self) -> int:
        """How many forward op runs the backward adds."""
        return sum(r.recomputed for r in self.rows)

    @property
    def predicted_overhead(self) -> float:
        """The predicted step over the store-all step's, less 1 (0 where that is 0 s)."""
        return self.predicted_step_time_s / self.store_all_step_time_s - 1 \
            if self.store_all_step_time_s else 0.0

    def explain(self) -> str:
        overhead = self.predicted_overhead
        gap = "n/a" if self.gap is None else f"{self.gap:.2%}"
        op = max([28, *(len(r.name) for r in self.rows)])
        said = max([10, *(len(r.decision) for r in self.rows)])
        head = [
            f"monet_opt plan: solver {self.solver} ({self.status}, gap {gap}, "
            f"solved in {self.solve_time_s:.2f} s)"
            + (f"\n  solver note       {self.solver_note}" if self.solver_note else ""),
            f"  memory limit      {format_bytes(self.memory_limit_bytes)}",
            f"  predicted peak    {format_bytes(self.predicted_peak_bytes)} "
            f"(store-all {format_bytes(self.store_all_peak_bytes)}, least reachable "
            f"{format_bytes(self.min_feasible_bytes)})"
            + (f"\n  at                {self.peak_op}" if self.peak_op else "")
            + (f"\n  held there        {self.held_at_peak.text()}"
               f"\n  largest there     {self.held_at_peak.largest_text()}"
               if self.held_at_peak else ""),
            f"  fixed             {format_bytes(self.fixed_bytes)} parameters/buffers/inputs "
            f"(CUDA: and the allocator's slack; CPU: and random ops' generator states), "
            f"{format_bytes(self.gradient_bytes)} gradients",
            f"  predicted step    {self.predicted_step_time_s * 1e3:.2f} ms "
            f"({overhead:+.1%} vs no recomputation), {self.recomputed_ops} op runs recomputed",
            f"  variants in use   {_count_families(self.variants)}",
            f"  in place          {self.in_place_runs} op runs write into an input that dies "
            f"there (relu_, add_), {self.in_place_backward} backward ops their result into a "
            "gradient that dies there (NOTE [Elementwise backward ops in place])",
            "",
            f"  {'phase':<8} {'op':<{op}} {'bytes':>11} {'time ms':>9}  {'decision':<{said}} "
            "source",
        ]  # whole names, columns as wide as theirs: cut to 28, twenty ops read alike
        body = [f"  {r.phase:<8} {r.name:<{op}} {format_bytes(r.bytes):>11} "
                f"{r.time_s * 1e3:>9.3f}  {r.decision:<{said}} {r.label}" for r in self.rows]
        return "\n".join(head + body)


def _count_families(names: tuple[str, ...]) -> str:
    counts: dict[str, int] = {}
    for name in names:
        family = name.split(":")[0]
        counts[family] = counts.get(family, 0) + 1
    return ", ".join(f"{f} x{n}" for f, n in sorted(counts.items())) or "none"


def make_plan(problem: Problem, labels: tuple[str, ...], result: SolveResult,
              limit: int) -> Plan:
    """The plan of a feasible `result` on `problem`; labels: each op's source (or ())."""
    sim = simulate(problem, result.schedule)
    internal_assert(sim.peak_bytes == result.peak_bytes, "solver and simulator disagree")
    store_all, grads = _store_all(problem)
    return Plan(memory_limit_bytes=limit, predicted_peak_bytes=sim.peak_bytes,
                predicted_step_time_s=sim.time_s, solver=result.solver,
                status=result.status.value, solve_time_s=result.solve_time_s, gap=result.gap,
                fixed_bytes=sim.fixed_bytes, gradient_bytes=grads,
                store_all_peak_bytes=store_all.peak_bytes, store_all_step_time_s=store_all.time_s,
                store_all_fixed_bytes=store_all.fixed_bytes,
                min_feasible_bytes=result.min_feasible_bytes, solver_note=result.note,
                variants=tuple(problem.variants[v].name for v in sorted(result.schedule.variants)),
                rows=op_rows(problem, result.schedule, sim, labels),
                in_place_runs=len(sim.overwrites),
                in_place_backward=_in_place_backward(problem, result.schedule.variants),
                peak_op=_peak_op(problem, result.schedule, sim),
                held_at_peak=held_at(problem, result.schedule, labels, sim),
                timeline=Timeline(op_time_s=sim.step_time_s, live_bytes=sim.live_bytes,
                                  backward_start=len(problem.forward_ops)))


def _in_place_backward(problem: Problem, chosen: frozenset[int]) -> int:
    """Backward ops writing their result into a dying gradient: those the lowering marked,
    less those a variant runs in place of that makes its result anew."""
    anew = {problem.variants[v].op for v in chosen
            if not variants.writes_into((problem.variants[v].name.split(":")[0],))}
    return sum(1 for i, op in enumerate(problem.ops)
               if op.is_backward and op.inplace_bytes and i not in anew)


def least_held(problem: Problem, result: SolveResult) -> HeldAtPeak | None:
    """What `result`'s least-peak schedule holds at its peak (NOTE [Held at the peak]), where
    it has one that peaks at its least peak."""
    if result.floor_schedule is None:
        return None
    held = held_at(problem, result.floor_schedule)
    return held if held and held.total_bytes == result.min_feasible_bytes else None


def limit_bytes(limit: int | Share, problem: Problem) -> int:
    """`limit` in bytes on `problem`: a Share (NOTE [Limits as shares]) of its store-all step."""
    if not isinstance(limit, Share):
        return limit
    store_all, grads = _store_all(problem)
    return limit.bytes_of(store_all.fixed_bytes + grads, store_all.peak_bytes)


def _store_all(problem: Problem) -> tuple[Simulation, int]:
    """The step with nothing recomputed, and the bytes of what its backward returns."""
    store_all = simulate(problem, schedule_from_kept(problem, problem.saved_for_backward))
    return store_all, sum(problem.tensors[t].bytes for t in problem.backward_outputs)


def _peak_op(problem: Problem, schedule: Schedule, sim: Simulation) -> str:
    """Which op runs at the predicted peak: its name, phase and workspace."""
    if not sim.steps:
        return ""
    op = problem.with_variants(schedule.variants).ops[sim.steps[sim.peak_step]]
    phase = "forward" if sim.peak_step < len(problem.forward_ops) else "backward"
    rerun = " (recomputed)" if phase == "backward" and not op.is_backward else ""
    return f"{op.name}{rerun}, {phase}, workspace {format_bytes(op.workspace_bytes)}"


def op_rows(problem: Problem, schedule: Schedule, sim: Simulation,
            labels: tuple[str, ...]) -> tuple[OpRow, ...]:
    """One row per op that runs (encode ops of variants not in use are left out), priced as
    the simulator prices it with the schedule's variants: the rows' times, recomputed runs
    included, add up to the predicted step."""
    rows = []
    with_variant = {problem.variants[v].op for v in schedule.variants}
    plain = problem.with_variants(schedule.variants)
    for i, op in enumerate(plain.ops):
        if problem.encode_ops.get(i, -1) not in schedule.variants and i in problem.encode_ops:
            continue
        size = sum(plain.tensors[t].bytes for t in op.outputs)
        if op.is_backward:
            decision = "variant" if i in with_variant else "backward"
        elif sim.recompute_counts[i]:
            decision = f"recomputed x{sim.recompute_counts[i]}" + (
                "" if op.recompute_time_s is None else f", {op.rerun_s * 1e3:.3f} ms each")
        elif any(t in schedule.kept for t in op.outputs):
            decision = "kept"
        else:
            decision = "freed"
        rows.append(OpRow(name=op.name, label=labels[i] if labels else op.name,
                          phase="backward" if op.is_backward else "forward", bytes=size,
                          time_s=op.time_s, decision=decision,
                          recomputed=0 if op.is_backward else sim.recompute_counts[i],
                          rerun_s=op.rerun_s))
    return tuple(rows)
