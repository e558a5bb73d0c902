"""optimize(): capture, lower, profile, solve, simulate, execute."""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Collection

import torch
from torch import nn

from monet_opt import (branches, capture, collectives, grouped_attention, held_in, host_random,
                       in_flight, input_spec, joint_passes, kept_states, merged_inputs,
                       ones_masks, output_hooks, outside_grads, params_read, progress, recompute,
                       refusals, rewrite, side_effects, twice_passed, unseeded, updated_buffers,
                       variants_bn)
from monet_opt.accumulate import GradientSlots, in_place_problem
from monet_opt.arguments import check_arguments
from monet_opt.attribute_tensors import attribute_values
from monet_opt.attributes import Watched
from monet_opt.cache import Profile, ProfileCache, derived
from monet_opt.cache_keys import ProfileKey, describe_inputs
from monet_opt.eager_kernels import warn_if_lstm
from monet_opt.families import offered_families
from monet_opt.held_outputs import held_loss, held_problem
from monet_opt.errors import InfeasibleBudgetError, NoBackwardError, check_backward, internal_assert
from monet_opt.hooks import warn_if_hooks
from monet_opt.lower import Lowered, lower
from monet_opt.memory import cuda_devices, held_beyond, shared_bytes, sparse_bytes, storage_groups
from monet_opt.lower_variants import attach_variants, matching
from monet_opt.measured import measured_problem
from monet_opt.model_signature import for_model
from monet_opt.module import OptimizedModule, Step
from monet_opt.pass_inputs import pass_copies
from monet_opt.plan import Plan, least_held, limit_bytes, make_plan
from monet_opt.profile_memory import pass_limit
from monet_opt.profiler import PROFILER_REVISION
from monet_opt.units import Share, parse_limit
import solvers
from solvers.peak_bound import least_peak_bound
from solvers.remembered import recall, recalled, replanned


def optimize(model: nn.Module, sample_input: Any, memory_limit: int | str | Share, *,
             solver: str = "auto", time_limit_s: float = 30.0, profile_repeats: int = 3,
             variants: bool | Collection[str] = True, allow_lossy: bool = False,
             profile_dir: str | os.PathLike | None = "profiles",
             profile_time_limit_s: float | None = None,
             new_shapes: str = "plan") -> OptimizedModule:
    """Return a module that trains exactly like `model` with its step's peak memory within
    `memory_limit`.

    Args:
        model: the module to train. It is not copied: the result shares its parameters and
            buffers. An optimized module stands for its model (planned anew under this limit).
            Its state (parameters, BatchNorm statistics, the random stream) is left as it was.
        sample_input: a tensor, a tuple of them (positional arguments; a list is read the
            same way, so a forward taking one list gets `([a, b],)`) or a dict (keyword
            arguments), shaped exactly like the batches you will train on.
        memory_limit: the peak of everything the training step holds on the device
            (parameters, gradients, activations, inputs): int bytes or a string like "512MiB",
            or a share of the step with nothing recomputed: "50% of activations" (above
            parameters, buffers, inputs and gradients) or "60% of peak" (NOTE [Limits as
            shares] in monet_opt/units.py; `opt.plan.memory_limit_bytes` says what it was).
            Given in bytes, profiling keeps within it too (NOTE [Profiling within the limit]).
        solver: "auto" (store-all, or a schedule within 0.5 % of its time, when one fits;
            else the fastest schedule any solver finds: NOTE [Close enough]), or one of
            `solvers.available_solvers()`: "milp" (the joint program, HiGHS), "evict"
            (cheapest-first eviction: recompute what costs least per byte), "remat" (drop and
            make again as often as the limit asks, offline DTR), "dp" (Kusumoto et
            al.'s lower-set DP), "checkmate" (Checkmate's MILP, a baseline: recomputation
            only), "chen" (the better of "chen_greedy" and "chen_sqrt"), "store_all".
        time_limit_s: wall time the solve may spend ("auto": its phases shared out, up to a
            tenth more where the heuristics were slow (CPU ResNet-50 at a third of its
            activations: 33.5 s at 30), and below 2 s some more, each program getting a tenth
            of it: NOTE [Short limits]; "milp": the MILP; see plan.status).
        profile_repeats: timed runs per operator when profiling (after one warm-up).
        variants: offer the solver the exact operator variants of `monet_opt.variants` (ReLU
            and dropout masks, compact max-pool indices, shape-only pooling inputs: smaller
            forms of what the backward reads, bitwise the same result). False: recomputation
            alone, for comparison. A collection of family names (`monet_opt.variants.FAMILIES`):
            only those (an ablation).
        allow_lossy: also offer the lossy variants (float32 tensors that convolution and
            matrix-product backwards read, kept as bfloat16): the plan then no longer trains
            bitwise like the original (error bounds: NOTE [Lossy bound] in monet_opt.variants).
            Ignored without `variants`.
        profile_dir: where profiles and schedules are cached as JSON (None: no caching). A
            second call with the same model graph, input shapes, device, limit and solver
            options profiles and solves nothing (the model is still traced).
        profile_time_limit_s: wall time profiling may take (None: no limit). Near the limit
            ops are timed with fewer repeats, down to one; ops not reached by then get
            estimates (from the output bytes of ops measured already, of the same ATen target
            where there are some), with a `ProfileTimeLimitWarning` saying how many; variants
            not reached are not offered. See `monet_opt.profiler`, NOTE [The profiling time
            limit]. A time-limited profile is cached apart from complete ones (NOTE [The time
            limit in the cache key], in `_Planner._cached_profile`).
        new_shapes: what the module does with inputs whose shapes or structure differ from
            `sample_input`'s (a smaller last batch; other keyword arguments): "plan" plans a
            step for them when first met, under the same limit and options, with a
            `ReplanWarning` (NOTE [New input shapes] in monet_opt/module.py); "error" raises
            PlanMismatchError.

    Raises:
        ValueError: memory_limit is not a positive size.
        InfeasibleBudgetError: memory_limit is below the least reachable peak (both numbers in
            the error).
        CaptureError: the model cannot be traced; the message names where.
        NoBackwardError: the step has no backward to plan (gradients off, nothing requiring
            grad, or outputs that depend on nothing that does).
    """
    refusals.check_module(model)
    if isinstance(model, OptimizedModule):  # NOTE [Optimized inside optimized]
        model = model.model
    refusals.refuse_untraceable(model)  # before the warnings below, which it would follow
    limit = parse_limit(memory_limit)
    time_limit_s, profile_time_limit_s, profile_repeats = check_arguments(
        solver, time_limit_s, profile_time_limit_s, new_shapes, profile_repeats, variants,
        allow_lossy)
    cache = ProfileCache(profile_dir) if profile_dir is not None else None
    families = offered_families(variants, allow_lossy)  # checked before anything is traced
    replan = False

    def plan_step(model: nn.Module, args: tuple, kwargs: dict, resident: tuple[int, ...] = (),
                  resident_bytes: int = 0, outputs_held: bool = False) -> Step:
        planner = _Planner(limit, solver, profile_repeats, type(model).__name__, time_limit_s,
                           cache=cache, variants=families, allow_lossy=allow_lossy,
                           profile_time_limit_s=profile_time_limit_s, resident=resident,
                           resident_bytes=resident_bytes, outputs_held=outputs_held,
                           replan=replan)
        run, spec = _trace(model, args, kwargs, planner)
        internal_assert(planner.plan is not None, "the partition function was never called")
        inputs = planner.primals[len(planner.primals) - len(spec.leaves):]
        planner.primals = []  # the step keeps the planner: NOTE [Buffers the pass reads]
        return Step(run, spec, planner.plan, planner.inputs, resident, resident_bytes,
                    planner.slots, frozen=sum(not p.requires_grad for p in model.parameters()),
                    shared=storage_groups(inputs),  # NOTE [Inputs that share a storage]
                    kept=tuple(run.kept),  # NOTE [Tensors kept on a module]
                    attributes=run.attributes,  # NOTE [Tensors held as attributes]
                    outputs_held=outputs_held,  # NOTE [Outputs held through the backward]
                    saved_inputs=planner.saved_inputs,  # NOTE [Inference tensors kept]
                    feeding=planner.feeding,  # NOTE [Hooks on an output others are computed from]
                    held=held_in.held_in(model, planner.constants))  # NOTE in held_in.py

    autocast = capture.autocast_state()  # NOTE [Autocast is traced]
    warn_if_lstm(model)  # NOTE [Eager's own kernels]
    warn_if_hooks(model)  # NOTE [Module hooks]
    watched = Watched.of(model)  # NOTE [Attributes read as constants]
    before = watched.values(list(model.modules()))
    first = plan_step(model, *ones_masks.split(model, sample_input))  # NOTE in ones_masks.py
    limit = first.plan.memory_limit_bytes  # other shapes: the same bytes (NOTE [Limits as shares])
    replan = True  # NOTE [Plans for other shapes]
    side_effects.warn_if_forward_changed(model, watched, before)
    flags = tuple(m.training for m in model.modules())
    optimized = for_model(model)  # NOTE [The model's signature]
    return optimized(model, first, flags, autocast, plan_step,
                     any_shape=new_shapes == "plan")


def lower_problem(model: nn.Module, sample_input: Any, *, profile_repeats: int = 3,
                  variants: bool | Collection[str] = True, allow_lossy: bool = False,
                  timed: bool = True) -> solvers.Problem:
    """The profiled scheduling problem of one training step of `model` on `sample_input`, as
    every solver sees it (for benchmarks and for studying a model's graph); `timed` False: its
    sizes only, no op run (times and measured workspace 0, sizes as traced; what
    `solvers.peak_bound` needs). Leaves the model's state as it was."""
    planner = _Planner(None, "store_all", profile_repeats, type(model).__name__, 1.0,
                       variants=variants, allow_lossy=allow_lossy, timed=timed)
    _trace(model, *capture.InputSpec.split(sample_input), planner)
    internal_assert(planner.problem is not None, "the partition function was never called")
    return planner.problem


def profile_model(model: nn.Module, sample_input: Any, *,
                  profile_dir: str | os.PathLike | None = "profiles", profile_repeats: int = 3,
                  variants: bool | Collection[str] = True, allow_lossy: bool = False,
                  profile_time_limit_s: float | None = None) -> tuple[Profile | None, Plan]:
    """Trace and profile one training step of `model` (or read its profile from `profile_dir`,
    storing it there if new) without solving for any limit: the profile with the problem
    optimize() solves (None without a profile directory) and the store-all plan, whose fixed,
    gradient and store-all bytes say which limits make sense. Options as optimize()'s. Leaves
    the model's state as it was."""
    cache = ProfileCache(profile_dir) if profile_dir is not None else None
    planner = _Planner(None, "store_all", profile_repeats, type(model).__name__, 1.0,
                       cache=cache, variants=variants, allow_lossy=allow_lossy,
                       profile_time_limit_s=profile_time_limit_s)
    _trace(model, *capture.InputSpec.split(sample_input), planner)
    internal_assert(planner.plan is not None, "the partition function was never called")
    # NOTE [Problems as planned] in monet_opt/cache.py: the problem optimize() solves
    return planner.profile and derived(planner.profile, planner.problem), planner.plan


def _trace(model: nn.Module, args: tuple, kwargs: dict, planner: _Planner):
    """Trace one step of `model` on inputs like (args, kwargs) through `planner.partition`
    (which plans it), leaving the model's state and the random stream as they were: the
    compiled step and its inputs' spec."""
    refusals.check_module(model)
    refusals.refuse_untraceable(model)
    spec, inputs = capture.InputSpec.of(args, kwargs)
    check_backward(model, inputs)
    param_names, buffer_names, attributes = capture.state_names(model)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    state = [buffers[n] for n in buffer_names] + attribute_values(model, tuple(attributes))
    weights = [params[n] for n in param_names]
    clones = pass_copies(state, weights + list(inputs))  # NOTE [Buffers the pass reads]
    planner.primals, planner.num_inputs = weights + clones + list(inputs), len(inputs)
    beyond, originals = held_beyond(state, clones, counted=weights + list(inputs) + [
        t for t, c in zip(state, clones) if t is c])
    masks = ones_masks.dropped_bytes(kwargs)  # NOTE [Attention masks of all ones]
    planner.storage_extra, planner.beside_pass = beyond + masks, originals + masks
    planner.inputs = describe_inputs(args, kwargs)
    planner.grouped = not grouped_attention.eager_masks(model)
    progress.tracing(planner.name, planner.inputs)  # NOTE [Progress]
    devices = cuda_devices(planner.primals)
    with torch.random.fork_rng(devices=devices), twice_passed.refused_if_differentiated(
            model, inputs):
        step = capture.first_call(model, spec, args, kwargs, planner.primals, planner.partition,
                                  partitioned=lambda: planner.partitioned)
    if planner.problem is None:  # AOTAutograd compiled it for inference: no output needs grad
        raise NoBackwardError(
            f"monet_opt.optimize: no output of {type(model).__name__} is computed from a tensor "
            "that requires grad (detached, made under torch.no_grad() inside forward, or an "
            "input or parameter returned as it is), so its step has no backward to plan.")
    return step, spec


class _Planner:
    """The partition function AOTAutograd calls with the joint graph: plans and cuts it
    (NOTE [Gradients resident at the start] in monet_opt/accumulate.py)."""

    def __init__(self, limit: int | Share | None, solver: str, repeats: int, name: str,
                 time_limit_s: float, *, cache: ProfileCache | None = None,
                 variants: bool | Collection[str] = True, allow_lossy: bool = False,
                 profile_time_limit_s: float | None = None, resident: tuple[int, ...] = (),
                 resident_bytes: int = 0, outputs_held: bool = False,
                 timed: bool = True, replan: bool = False) -> None:
        """limit None: only lower and profile (`self.problem`), then run store-all (caching no
        schedule). cache: the profile directory to consult, if any. variants, allow_lossy: the
        library's operator variants offered to the solver, and its lossy ones.
        resident, resident_bytes: the parameters (positions) whose gradients are in place
        when the step begins, and the bytes of every gradient in place then (NOTE [Gradients
        resident at the start]). outputs_held: the caller holds the step's outputs through its
        backward (NOTE [Outputs held through the backward] in monet_opt/held_outputs.py).
        timed False: the problem is not profiled (lower_problem's sizes only). replan: a step
        of an optimized module after its first (NOTE [Plans for other shapes])."""
        self.limit, self.solver, self.time_limit_s = limit, solver, time_limit_s
        self.repeats, self.name, self.cache = repeats, name, cache
        self.families = offered_families(variants, allow_lossy)
        self.variants, self.allow_lossy = bool(self.families), bool(self.families) and allow_lossy
        self.profile_time_limit_s = profile_time_limit_s
        self.resident, self.resident_bytes = resident, resident_bytes
        self.outputs_held, self.timed, self.replan = outputs_held, timed, replan
        self.primals: list[torch.Tensor] = []
        self.num_inputs = 0  # the last of primals: the step's input tensors
        self.inputs, self.storage_extra, self.beside_pass = "", 0, 0
        self.saved_inputs: tuple[int, ...] = ()  # NOTE [Inference tensors kept]
        self.feeding: tuple[int, ...] = ()  # NOTE [Hooks on an output others are computed from]
        self.constants: frozenset[int] = frozenset()  # NOTE [Tensors held in containers]
        self.problem: solvers.Problem | None = None
        self.profile: Profile | None = None
        self.plan: Plan | None = None
        self.slots: GradientSlots | None = None
        self.partitioned = False  # NOTE [The capture route] in monet_opt/capture.py
        self.grouped = True  # NOTE [Masks eager builds too] in monet_opt/grouped_attention.py

    def partition(self, joint, joint_inputs, *, num_fwd_outputs: int,
                  held: tuple[int, ...] = (), returned: tuple[int, ...] = (), **kwargs):
        """held, returned: where among the joint's outputs are the tensors the forward keeps on
        modules (NOTE [Tensors kept on a module]) and those it returns, held to the step's end
        where the caller holds them (NOTE [Outputs held through the backward])."""
        self.partitioned = True
        host_random.refuse_drawn()  # NOTE [Random numbers drawn in Python]
        host_random.refuse_generators(joint)  # NOTE [Generators set in the forward]
        branches.refuse_branches(joint)  # NOTE [Branches taken by value]
        merged_inputs.refuse_merged(joint, self.primals, len(self.primals) - self.num_inputs)
        params_read.refuse_trained_constants(joint, self.primals, num_fwd_outputs)  # NOTE there
        self.constants = held_in.constant_storages(joint)  # NOTE [Tensors held in containers]
        self.feeding = output_hooks.feeding(joint, returned)  # before the graph is rewritten
        joint_passes.rewrite(joint, num_fwd_outputs, self.primals, self.families, self.grouped)
        plain = lower(joint, num_fwd_outputs, name=self.name)
        kwargs["unseeded"] = unseeded.presumed(joint, plain.inplace)  # NOTE in unseeded.py
        lowered = attach_variants(plain, joint, allow_lossy=self.allow_lossy,
                                  only=self.families) if self.variants else plain
        told = progress.Progress(self.name, self.timed)  # NOTE [Progress]
        # the gradients in place stay beside the pass (it measured them over the limit)
        within = self.limit - self.beside_pass - self.resident_bytes \
            if isinstance(self.limit, int) else None
        # NOTEs [Tracing without the collector], [Profiling within the limit], [Originals beside
        # the pass]: the pass held no lower than the size bound, computed only where profiled
        measure = told.profiling(capture.collecting(lambda: measured_problem(
            joint, lowered, self.primals, self.repeats, self.allow_lossy,
            self.profile_time_limit_s, pass_limit(within, lowered.problem)))) \
            if self.timed else lambda: lowered.problem
        solve = told.solving(capture.collecting(solvers.solve))
        with capture.planning():
            if self.cache is None:
                problem = measure()
            else:
                self.profile = self._cached_profile(joint, lowered, measure)
                problem = variants_bn.guarded(self.profile.problem, joint, self.primals)
            # NOTEs [Inputs that share a storage], [Sparse inputs], [Buffers the step updates],
            # [The step's generator states] (recompute.py), [Gradients made outside the step]
            lowered = dataclasses.replace(lowered, states=recompute.states(joint, lowered))
            extra = lowered.conditional_bytes + sparse_bytes(self.primals) - \
                shared_bytes(self.primals)
            extra += self.storage_extra + \
                outside_grads.outside_bytes(joint, num_fwd_outputs, self.primals, self.resident)
            if extra:
                problem = dataclasses.replace(problem, fixed_bytes=problem.fixed_bytes + extra)
            problem = kept_states.with_states(problem, lowered)  # counted in `extra`
            held = held + returned if self.outputs_held else held
            problem, made = held_problem(problem, {t for k in held for t in
                                                   lowered.output_tensors[k]}
                                         | collectives.outputs(joint, lowered),  # NOTE there
                                         held_loss(joint, lowered, problem, returned))
            problem = unseeded.free(kept_states.held(problem, made), kwargs["unseeded"])
            self.problem = problem
            lowered = matching(lowered, problem)
            slots = GradientSlots(self.resident, self.primals) if self.resident else None
            if self.resident_bytes:  # NOTE [Gradients resident at the start]
                problem = in_place_problem(problem, lowered, num_fwd_outputs, slots,
                                           self.resident_bytes)
            lighter = updated_buffers.uncopied(problem, lowered)  # NOTE [Copies counted as made]
            limit = limit_bytes(self.limit, lighter) if self.limit is not None else 2 ** 62
            # NOTEs [Schedules found for the step ...], [Least peaks recalled in the process]
            seconds, others, least = replanned(self.solver, problem, limit, self.time_limit_s) \
                if self.replan else (self.time_limit_s, (), True)  # NOTE [Plans for other shapes]
            known = recalled(self.solver, problem, self.problem) + others
            solve = functools.partial(solve, least_peak=least)
            if self.cache is None or self.limit is None:
                result = solve(problem, limit, self.solver, time_limit_s=seconds, known=known,
                               candidates=others)
            else:
                result = self.cache.solve(derived(self.profile, problem), limit, self.solver,
                                          seconds, solve=solve, known=known, candidates=others)
            recall(self.solver, problem, result)
            # a schedule remembered in the directory may predate it: NOTE [Unread recomputation]
            result = solvers.without_unread(problem, result, limit)
            # NOTEs [Copies counted as made], [States kept only where used]
            if not result.feasible and updated_buffers.may_fit(lowered, result, limit):
                result = updated_buffers.retried(problem, limit, lowered, result, lambda p: solve(
                    p, limit, self.solver, time_limit_s=seconds, known=known), lambda s: (
                    rewrite.partition(joint, joint_inputs, lowered, s, num_fwd_outputs, **kwargs)))
            result = updated_buffers.store_all_if_fits(problem, limit, lowered, result)
            recall(self.solver, problem, result)  # with the least the retries found
        if not result.feasible:  # NOTE [Held at the peak]: what the least peak holds
            floor = result.floor_schedule
            held = least_held(problem, result)
            if held is None and floor is not None:  # with the copies its forward makes
                held = least_held(updated_buffers.as_made(
                    problem, dataclasses.replace(result, schedule=floor), rewrite.partition(
                        joint, joint_inputs, lowered, floor, num_fwd_outputs, **kwargs)[0],
                    lowered)[0], result)
            raise input_spec.with_viewed_note(InfeasibleBudgetError(
                limit, result.min_feasible_bytes, self.solver, self.limit,
                held, least_peak_bound(lighter), self.time_limit_s, result.solve_time_s),
                [] if self.replan else self.primals[len(self.primals) - self.num_inputs:])
        self.slots = slots
        graphs = rewrite.partition(joint, joint_inputs, lowered, result.schedule,
                                   num_fwd_outputs, slots=slots, made=made, **kwargs)
        self.saved_inputs = in_flight.saved_inputs(graphs[0], self.num_inputs, num_fwd_outputs)
        # NOTE [Copies nothing reads]
        problem, result = updated_buffers.as_made(problem, result, graphs[0], lowered)
        self.plan = make_plan(problem, lowered.op_labels, result, limit)
        told.planned(self.plan, self.inputs)
        return graphs

    def _cached_profile(self, joint, lowered: Lowered, measure) -> Profile:
        """NOTE [The time limit in the cache key]
          A limit that is hit changes the profile, and whether it is hit depends on the
          machine's speed and load, which no key can see. So a time-limited profile is cached
          under its own key (the limit is one of the key's options) and is never served to a
          call without a limit; a call with a limit first takes a complete profile of the same
          graph if one is cached (it is at least as good), and only then its own. Without a
          limit the key is what it was before the limit existed (old caches stay valid)."""
        options: dict[str, Any] = {"repeats": self.repeats, "profiler": PROFILER_REVISION,
                                   "variants": ",".join(sorted(self.families)),
                                   "allow_lossy": self.allow_lossy}
        complete = ProfileKey.of(joint, self.primals, self.inputs, options)
        if self.profile_time_limit_s is None:
            return self.cache.profile(complete, self.name, lowered, measure)
        found = self.cache.find(complete, self.name, lowered)
        if found is not None:
            return found
        limited = ProfileKey.of(joint, self.primals, self.inputs, {
            **options, "profile_time_limit_s": float(self.profile_time_limit_s)})
        return self.cache.profile(limited, self.name, lowered, measure)
