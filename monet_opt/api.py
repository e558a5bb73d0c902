"""optimize(): capture, lower, profile, solve, simulate, execute."""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
from torch import nn

from monet_opt import capture, rewrite
from monet_opt.errors import InfeasibleBudgetError, internal_assert
from monet_opt.lower import Lowered, lower
from monet_opt.lower_variants import attach_variants, with_costs
from monet_opt.module import OptimizedModule
from monet_opt.plan import Plan, Timeline, op_rows
from monet_opt.profiler import profile
from monet_opt.units import parse_memory_limit
import solvers


def optimize(model: nn.Module, sample_input: Any, memory_limit: int | str, *,
             solver: str = "auto", time_limit_s: float = 30.0,
             profile_repeats: int = 3, variants: bool = True) -> OptimizedModule:
    """Return a module that trains exactly like `model` with its step's peak memory within
    `memory_limit`.

    Args:
        model: the module to train. It is not copied: the result shares its parameters and
            buffers. Its state (parameters, BatchNorm statistics, the random stream) is left as
            it was.
        sample_input: a tensor, a tuple of them (positional arguments) or a dict (keyword
            arguments), shaped exactly like the batches you will train on.
        memory_limit: the peak of everything the training step holds on the device
            (parameters, gradients, activations, inputs): int bytes or a string like "512MiB".
        solver: "auto" (store-all when it fits, else the fastest schedule any solver finds),
            or one of `solvers.available_solvers()`: "milp" (the joint program, HiGHS),
            "checkmate" (Checkmate's MILP, a baseline: recomputation only), "chen" (the
            better of "chen_greedy" and "chen_sqrt"), "store_all".
        time_limit_s: wall time the MILP may spend (the plan reports its status and gap).
        profile_repeats: timed runs per operator when profiling (after one warm-up).
        variants: offer the solver the operator variants of `monet_opt.variants` (ReLU and
            dropout masks, shape-only max-pool inputs: exact, smaller forms of what the
            backward reads). False: recomputation alone, for comparison.

    Raises:
        ValueError: memory_limit is not a positive size.
        InfeasibleBudgetError: memory_limit is below the least reachable peak (both numbers in
            the error).
        CaptureError: the model cannot be traced; the message names where.
    """
    limit = parse_memory_limit(memory_limit)
    if solver not in solvers.available_solvers():
        raise ValueError(f"monet_opt.optimize: unknown solver {solver!r}; choose one of "
                         f"{solvers.available_solvers()}")
    if not time_limit_s > 0:
        raise ValueError(f"monet_opt.optimize: time_limit_s must be positive, got {time_limit_s}")
    planner = _Planner(limit, solver, profile_repeats, type(model).__name__, time_limit_s,
                       variants)
    step, spec, param_names, buffer_names = _trace(model, sample_input, planner)
    internal_assert(planner.plan is not None, "the partition function was never called")
    flags = tuple(m.training for m in model.modules())
    return OptimizedModule(model, step, spec, planner.plan, param_names, buffer_names, flags)


def lower_problem(model: nn.Module, sample_input: Any, *, profile_repeats: int = 3,
                  variants: bool = True) -> solvers.Problem:
    """The profiled scheduling problem of one training step of `model` on `sample_input`, as
    every solver sees it (for benchmarks and for studying a model's graph). Leaves the model's
    state as it was."""
    planner = _Planner(None, "store_all", profile_repeats, type(model).__name__, 1.0, variants)
    _trace(model, sample_input, planner)
    internal_assert(planner.problem is not None, "the partition function was never called")
    return planner.problem


def _trace(model: nn.Module, sample_input: Any, planner: _Planner):
    """Trace one step of `model` through `planner.partition` (which plans it) and run it once,
    leaving the model's state and the random stream as they were."""
    args, kwargs = capture.InputSpec.split(sample_input)
    spec, inputs = capture.InputSpec.of(args, kwargs)
    param_names, buffer_names = capture.state_names(model)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    # Buffers are cloned for the first run: it applies BatchNorm's statistics update.
    planner.primals = [params[n] for n in param_names] + \
        [buffers[n].clone() for n in buffer_names] + list(inputs)
    devices = sorted({t.device for t in planner.primals if t.device.type == "cuda"}, key=str)
    with torch.random.fork_rng(devices=devices):
        step = capture.first_call(model, spec, args, kwargs, planner.primals, planner.partition,
                                  planned=lambda: planner.problem is not None)
    return step, spec, param_names, buffer_names


class _Planner:
    """The partition function AOTAutograd calls with the joint graph: plans and cuts it."""

    def __init__(self, limit: int | None, solver: str, repeats: int, name: str,
                 time_limit_s: float, variants: bool = True) -> None:
        """limit None: only lower and profile (`self.problem`), then run store-all."""
        self.limit, self.solver, self.time_limit_s = limit, solver, time_limit_s
        self.variants = variants
        self.repeats, self.name = repeats, name
        self.primals: list[torch.Tensor] = []
        self.problem: solvers.Problem | None = None
        self.plan: Plan | None = None

    def partition(self, joint, joint_inputs, *, num_fwd_outputs: int, **kwargs):
        lowered = self._profiled(joint, num_fwd_outputs)
        problem = dataclasses.replace(lowered.problem,
                                      fixed_bytes=lowered.problem.fixed_bytes + _loss_bytes(joint))
        lowered = dataclasses.replace(lowered, problem=problem)
        self.problem = problem
        limit = self.limit if self.limit is not None else 2 ** 62
        result = solvers.solve(problem, limit, self.solver, time_limit_s=self.time_limit_s)
        if not result.feasible:
            raise InfeasibleBudgetError(self.limit, result.min_feasible_bytes, self.solver)
        self.plan = _make_plan(lowered, result, limit)
        return rewrite.partition(joint, joint_inputs, lowered, result.schedule,
                                 num_fwd_outputs, **kwargs)


    def _profiled(self, joint, num_fwd_outputs: int) -> Lowered:
        """The lowered graph with measured times (and variants, where asked for). A variant
        whose result is not bitwise the op's is left out, with a warning."""
        plain = lower(joint, num_fwd_outputs, name=self.name)
        lowered = attach_variants(plain, joint) if self.variants else plain
        times, costs, exact = profile(joint, lowered, self.primals, self.repeats)
        skip = {(s.family, s.backward_node) for s, ok in zip(lowered.variant_sites, exact)
                if not ok}
        if skip:
            warnings.warn(f"monet_opt: {len(skip)} operator variant(s) did not reproduce the "
                          f"op's result bitwise on this device and are not used: "
                          f"{sorted(skip)[:3]}", RuntimeWarning, stacklevel=2)
            costs = [c for s, c in zip(lowered.variant_sites, costs)
                     if (s.family, s.backward_node) not in skip]
            by_name = dict(zip(lowered.op_nodes, times))
            lowered = attach_variants(plain, joint, skip=skip)
            times = tuple(by_name.get(name, 0.0) for name in lowered.op_nodes)
        ops = tuple(dataclasses.replace(op, time_s=t) for op, t in zip(lowered.problem.ops, times))
        lowered = dataclasses.replace(lowered, problem=dataclasses.replace(lowered.problem, ops=ops))
        return with_costs(lowered, costs) if lowered.variant_sites else lowered


def _loss_bytes(joint) -> int:
    """NOTE [The loss scalar]: the user's loss is outside the graph, but any training step makes
    at least a scalar loss and its seed gradient; count those two scalars (of the output gradients'
    dtype). Anything larger the loss function allocates (a cross-entropy's log-probabilities) is
    not in the plan: fold the loss into the module to plan it too."""
    tangents = [n.meta["val"] for n in joint.graph.find_nodes(op="placeholder")
                if n.name.startswith("tangents")]
    return 2 * tangents[0].element_size() if tangents else 0


def _make_plan(lowered: Lowered, result: solvers.SolveResult, limit: int) -> Plan:
    problem = lowered.problem
    sim = solvers.simulate(problem, result.schedule)
    run = problem.with_variants(result.schedule.variants)
    internal_assert(sim.peak_bytes == result.peak_bytes, "solver and simulator disagree")
    store_all = solvers.simulate(problem, solvers.schedule_from_kept(
        problem, problem.saved_for_backward))
    grads = sum(problem.tensors[t].bytes for t in problem.backward_outputs)
    return Plan(memory_limit_bytes=limit, predicted_peak_bytes=sim.peak_bytes,
                predicted_step_time_s=sim.time_s, solver=result.solver,
                status=result.status.value, solve_time_s=result.solve_time_s, gap=result.gap,
                fixed_bytes=problem.fixed_bytes, gradient_bytes=grads,
                store_all_peak_bytes=store_all.peak_bytes, store_all_step_time_s=store_all.time_s,
                min_feasible_bytes=result.min_feasible_bytes, solver_note=result.note,
                variants=tuple(problem.variants[v].name for v in sorted(result.schedule.variants)),
                rows=op_rows(problem, result.schedule, sim, lowered.op_labels),
                timeline=Timeline(op_time_s=tuple(run.ops[i].time_s for i in sim.steps),
                                  live_bytes=sim.live_bytes,
                                  backward_start=len(problem.forward_ops)))
