"""The module optimize() returns."""
from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from typing import Any, Callable, Mapping

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from monet_opt import (eval_steps, held_in, ones_masks, output_grad, outputs_fp32, refusals,
                       saved_hooks, stats_in_place, step_backward)
from monet_opt.alloc_events import UNMEASURED
from monet_opt.attributes import TRAINING, Watched
from monet_opt.capture import autocast_state
from monet_opt.attribute_tensors import attribute_values
from monet_opt.call_form import CallForm
from monet_opt.input_spec import InputSpec, LeafSpec, constants_of
from monet_opt.cache_keys import describe_inputs
from monet_opt.errors import (CaptureError, InfeasibleBudgetError, PlanMismatchError,
                              user_stacklevel)
from monet_opt.hooks import Hooks, changed as changed_hooks, hooks_of, warn_if_hooks
from monet_opt.held_outputs import HeldOutputs
from monet_opt.in_flight import InFlight, refuse_inference
from monet_opt.memory import storage_groups
from monet_opt.module_state import ModelState
from monet_opt.plan import Plan
from monet_opt.refused import Refused
from monet_opt.replan_text import WHAT_TO_DO, call_hints, situation, too_many
from monet_opt.step import (ReplanWarning, Step, describe_autocast, param_key,
                            resident_gradient_bytes, resident_positions, step_key)
from monet_opt.units import format_bytes
from monet_opt.walk import Walk, layout, moved


# NOTE [New input shapes]
#   A plan holds for the shapes it was traced with: every activation's size, and so the
#   schedule, depends on them. A DataLoader with drop_last=False ends each epoch on a smaller
#   batch, so refusing other shapes would stop a default training loop at the end of its first
#   epoch. Inputs that differ from the sample only in shape, layout (NOTE [Input layouts] in
#   monet_opt/input_spec.py) or requires_grad (dtype, device and structure equal; an input that
#   requires a gradient, as in adversarial training or a GAN's generator step through its
#   discriminator, makes the backward compute it: it was refused), or in their structure (other
#   arguments: HF's Trainer adds num_items_in_batch for a model whose forward takes **kwargs),
#   are planned when first met, under the same memory limit and options, and kept, one Step each:
#   optimize()'s work again (tracing on fake tensors, profiling and solving, or reading both
#   from the profile directory), with a ReplanWarning saying how long it took; where a plan
#   made before fits the new step (a shorter length), the solve starts from it in less time
#   (NOTE [Plans for other shapes] in solvers/remembered.py).
#   optimize(..., new_shapes="error") refuses them instead (PlanMismatchError). A step that
#   begins with gradients in place is planned apart in the same way (NOTE [Gradients resident
#   at the start] in monet_opt/accumulate.py), whatever new_shapes says.
#   Planning leaves the random stream and BatchNorm's statistics as they were, so the step then
#   trains like the model on that batch, bitwise, like every plan. It runs outside any
#   TorchDispatchMode the caller has around the step (a live-bytes counter, a FLOP counter):
#   the mode is there to watch the step, and tracing under it failed (CaptureError on
#   ResNet-50 inside monet_opt.measure_peak).
#
# NOTE [Parameters changed]
#   A traced step also fixes which parameters get a gradient (those that required one when it
#   was traced) and each parameter's shape, dtype and device. A parameter unfrozen after
#   optimize() (gradual unfreezing, when fine-tuning) silently got no gradient: the step had
#   none to give it. So these are part of a step's key, with every parameter's and buffer's
#   name (weights tied after optimize(), as HF's tie_weights() after resizing an embedding,
#   raised a KeyError naming the parameter that went), like the inputs' shapes: a change plans
#   a step for the parameters as they are (ReplanWarning), once per combination met, and going
#   back to an earlier one runs its step again (tests/test_new_shapes.py). With every parameter
#   frozen (and no input needing a gradient) the step has no backward: the model itself runs,
#   as without gradients.
#
# NOTE [Optimized in eval mode]
#   A step is traced with the modules' train/eval flags as they are at optimize(), and runs its
#   plan whenever they are so again, in eval mode too: fine-tuning with BatchNorm frozen, or a
#   model loaded with HF's from_pretrained (which leaves it in eval mode) and trained without
#   .train(), as eager would train it (dropout off, BatchNorm's running statistics). It used to
#   run the model itself whenever the wrapper was in eval mode, so such a step, after opt.eval(),
#   silently ran without its plan (tests/models.py's small CNN at its least plan: eager's
#   415,024 B measured against the plan's 174,064 B, no warning); and the wrapper began in train
#   mode whatever the model's (nn.Module's default), now in the model's. In eval mode with other
#   flags than the plan's (validation with gradients on, after a plan made for training) it runs
#   the model itself, as before; in train mode with other flags (a BatchNorm frozen after
#   optimize(), a model optimized in eval mode then trained after .train()) it plans a step for
#   them (ReplanWarning), as for any module changed (NOTE [Attributes read as constants] in
#   monet_opt/attributes.py); it used to refuse (PlanMismatchError). The wrapper's mode is
#   the model's own flag: it was a copy, so opt.eval() for validation, then model.train() (or
#   HF's from_pretrained, then model.train()) left the wrapper in eval mode and every later
#   step ran the model itself, silently over its limit (35,789 B over on a small CNN's plan).
#
# NOTE [Optimized inside optimized]
#   An optimized module inside a model given to optimize() (a backbone optimized on its own,
#   then put into a larger model), or given to it itself (to plan under another limit), was
#   traced as a step that runs real tensors through its compiled graphs: CaptureError,
#   "Attempted to access the data pointer on an invalid python storage" on every route. Traced,
#   it now runs its model's forward, so the outer plan covers the whole step and the inner
#   module's own limit does not apply inside it; optimize(opt, ...) plans opt.model, leaving opt
#   as it was (tests/test_wrapping.py).
_TRACED = (FakeTensor, FunctionalTensor)
_PLANNING = threading.RLock()


class OptimizedModule(ModelState):
    """Runs `model`'s training step under a memory plan.

    It holds `model` as its only child, so it shares every parameter and buffer: optimizers,
    `.train()`/`.eval()` and `.to()` act on the model itself, and `state_dict()` has the model's
    own keys. With gradients disabled, in eval mode unless the plan was made in it (NOTE
    [Optimized in eval mode]), or with nothing left to train (NOTE [Parameters changed]) it
    simply calls the model (nothing is kept for a backward, so there is nothing to plan).
    `plan` is the sample input's plan; `plans` has one per input shape met so far, per amount of
    gradients resident at a step's start (NOTE [New input shapes]) and per set of parameters
    that train. Its other attributes are the model's (NOTE [The model's attributes through the
    optimized module] in monet_opt/forwarded.py).
    """

    private_state_untraced = True  # NOTE [An optimized module's own state] in attributes.py

    def __init__(self, model: nn.Module, first: Step, training_flags: tuple[bool, ...],
                 autocast: tuple = (),
                 plan_step: Callable[[nn.Module, tuple, dict, tuple[int, ...], int], Step]
                 | None = None, any_shape: bool = False) -> None:
        """plan_step(model, args, kwargs, resident, resident_bytes): plans another step of
        `model` (this module's own: a deep copy plans its copy's), None: any other situation
        raises PlanMismatchError. any_shape: inputs of other shapes are planned, not
        refused."""
        super().__init__()
        self.model = model
        self.plan = first.plan
        self._first = first
        self._first_params = param_key(dict(model.named_parameters()),  # NOTE [A slot
                                       dict(model.named_buffers())) + (  # pointed at another
            layout(list(model.modules())),)  # module] in monet_opt/walk.py
        self._hooks = hooks_of(list(model.modules()))  # NOTE [Module hooks]
        # NOTE [Cumulative averages, unplanned]: those made so after optimize() run the model
        self._cumulative = frozenset(eval_steps.cumulative_norms(model, training_only=False))
        self._watched = Watched.of(model, skip=first.kept)  # NOTE [Attributes read as constants]
        self._first_values = self._watched.values(list(model.modules()))
        self._watchers = {_structure(list(model.modules())): (self._watched, self._first_values)}
        self._steps: dict[tuple, Step] = {
            step_key((first.spec.treedef, first.spec.constants), first.spec.leaves,
                     self._first_params, first.resident, first.resident_bytes, first.shared,
                     (autocast, self._hooks, first.outputs_held), self._first_values): first}
        self._plan_step = plan_step
        self._form = CallForm(model, first.spec.treedef)
        self._refused = Refused()  # NOTE [Situations found infeasible]
        self._any_shape = any_shape and plan_step is not None
        self._training_flags = training_flags
        self._autocast = autocast
        self._fresh()  # steps in flight, outputs held (NOTE [Outputs held through the backward])
        self.ready()

    @property
    def training(self) -> bool:
        """The model's own flag (NOTE [Optimized in eval mode])."""
        modules = self.__dict__.get("_modules", {})  # nn.Module.__init__ sets it after ours
        return modules["model"].training if "model" in modules else True

    @training.setter
    def training(self, mode: bool) -> None:
        if "model" in self.__dict__.get("_modules", {}):  # nn.Module.__init__ sets it first
            self.__dict__["_modules"]["model"].training = mode

    @property
    def plans(self) -> Mapping[str, Plan]:
        """Every plan made so far, by input description ('float32[4x3x16x16]'), the sample's
        first; a description met again (hooks changed twice at one module) is numbered
        ('... #2')."""
        plans: dict[str, Plan] = {}
        steps = {id(step): step for step in self._steps.values()}  # one may be under two keys
        for step in steps.values():
            label, n = step.label, 1
            while label in plans:
                n += 1
                label = f"{step.label} #{n}"
            plans[label] = step.plan
        return plans  # a copy: a dict, so it pickles (torch.save(opt.plans))

    @torch.compiler.disable  # NOTE [Compiled around] in module_state.py
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.model(*args, **kwargs)
        if isinstance(self, refusals.SHARDED):  # fully_shard(opt): NOTE [Sharded models]
            refusals.refuse_sharded(self, "monet_opt")
        # params in the order the steps take them; NOTE [Names kept between walks]
        modules, params, buffers = self._walk(self.model)
        hooks = hooks_of(modules)  # NOTE [Module hooks]
        args, kwargs = self._form.as_sample(self.model, args, kwargs)  # NOTE in call_form.py
        # NOTE [Attention masks of all ones]
        kwargs = ones_masks.dropped(self.model, args, kwargs, hooks, self._any_shape)
        mine = list(params.values())
        refusals.refuse_flattened(mine, self._first_params[0])  # NOTE [Sharded models]
        leaves, treedef = pytree.tree_flatten((args, kwargs))
        if any(isinstance(x, _TRACED) for x in (*mine[:1], *leaves)) or \
                output_grad.eager_only(mine, leaves):  # NOTE [torch.func transforms]
            return self.model(*args, **kwargs)  # NOTE [Optimized inside optimized]
        flags = tuple(map(TRAINING, modules))
        if flags != self._training_flags and not self.training:  # NOTE [Optimized in eval mode]
            return eval_steps.watched(self.model(*args, **kwargs), self)
        if not any(p.requires_grad for p in mine) and not any(
                isinstance(x, torch.Tensor) and x.requires_grad for x in leaves):
            return self.model(*args, **kwargs)  # NOTE [Parameters changed]: nothing to plan
        saved_hooks.warn_if_around()  # NOTE [Saved-tensor hooks in the forward]
        fp32 = outputs_fp32.wrapped(self)  # NOTE [Outputs accelerate makes float32]
        if not fp32:
            outputs_fp32.warn_if_around()
        try:
            with outputs_fp32.converting(fp32):
                step, inputs = self._step_for(args, kwargs, leaves, treedef, params, buffers,
                                              modules, hooks)
        except eval_steps.RunItself:  # NOTE [Cumulative averages, unplanned]
            return eval_steps.cumulative(self.model(*args, **kwargs), self)
        if step.slots is not None:
            step.slots.bind(mine)
        refuse_inference(inputs, step.saved_inputs)  # NOTE [Inference tensors kept]
        self._in_flight.starting()  # NOTE [Steps in flight]
        try:  # NOTE [Tensors held as attributes] in monet_opt/attribute_tensors.py
            attributes = attribute_values(self.model, step.attributes)
            held_in.check(self.model, step.held)  # NOTE [Tensors held in containers]
            with stats_in_place.versions_kept(modules):  # NOTE [The statistics' versions]
                outputs = step.run(*mine, *buffers.values(), *attributes, *inputs)
        except BaseException as err:
            self._in_flight.failed(err)
            raise
        returned = [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]
        node = self._in_flight.started(returned)
        self._held.watch(node, returned, inputs, step.plan,
                         lambda: [*self.model.parameters(), *self.model.buffers()])
        output_grad.watch(returned, step.plan.predicted_peak_bytes)  # NOTE [The output's gradient]
        step_backward.hook(returned, outputs, step.feeding)
        return outputs

    def _step_for(self, args: tuple, kwargs: dict, leaves: list, treedef: pytree.TreeSpec,
                  named: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                  modules: list[nn.Module], hooks: Hooks) -> tuple[Step, list[torch.Tensor]]:
        """The step planned for these inputs (`leaves`: flattened (args, kwargs); their
        structure, shapes, layouts and requires_grad), the gradients now in place, the
        modules' watched values and their `hooks` (planned now if new), and the flat input
        tensors."""
        first = self._first.spec
        structure = (treedef, constants_of(leaves))  # NOTE [Constant arguments] in input_spec.py
        new_structure = self._any_shape and structure != (first.treedef, first.constants)
        inputs = InputSpec.tensors_of(leaves, "monet_opt: every argument of a training step") \
            if new_structure else first.check(leaves, structure, any_shape=self._any_shape)
        resident = resident_positions(list(named.values()))
        now = param_key(named, buffers) + (self._walk.layout,)
        resident_bytes = resident_gradient_bytes(self.model, inputs, bool(resident))
        shared = storage_groups(inputs)  # NOTE [Inputs that share a storage]
        watched, base = self._watching(modules)
        values = watched.values(modules)
        specs = tuple(LeafSpec.of(x) for x in inputs)
        autocast = autocast_state()  # NOTE [Autocast is traced] in monet_opt/capture.py
        held = self._held.held  # NOTE [Outputs held through the backward]
        key = step_key(structure, specs, now, resident, resident_bytes, shared,
                       (autocast, hooks, held), values)
        step = self._steps.get(key)
        if step is None and UNMEASURED in autocast:  # NOTE [Plans made inside a profiler]
            step = self._steps.get(key[:6] + ((tuple(a for a in autocast if a != UNMEASURED),
                                               hooks, held),) + key[7:])
        if step is None:
            if set(eval_steps.cumulative_norms(self.model)) - self._cumulative:
                raise eval_steps.RunItself  # NOTE [Cumulative averages, unplanned]
            self._refused.again(key)  # NOTE [Situations found infeasible]
            why = ("params" if now[:-1] != self._first_params[:-1]
                   else "resident" if resident_bytes
                   else "outputs_held" if held
                   else "autocast" if autocast != self._autocast
                   else "hooks" if hooks != self._hooks
                   else "structure" if new_structure
                   else "sharing" if shared != self._first.shared
                   else "attributes" if values != self._first_values or now != self._first_params
                   else "input_grads" if [s.requires_grad for s in specs] !=
                   [s.requires_grad for s in first.leaves]
                   else "dtypes" if [s.dtype for s in specs] != [s.dtype for s in first.leaves]
                   else "shapes" if [s.shape for s in specs] != [s.shape for s in first.leaves]
                   else "entries" if [s.sparse for s in specs] != [s.sparse for s in first.leaves]
                   else "layouts")
            changed = ", ".join(filter(None, (
                moved(self.model, self._first_params[-1], now[-1]),
                self._watched.changed(self.model, self._first_values, values)
                if values != self._first_values else "",  # modules added or swapped, if any
                watched.changed(self.model, base, values)  # ... and since, where they were
                if base[0] != self._first_values[0] and values != base else "")))
            if autocast != self._autocast:
                changed = ", ".join(filter(None, (f"{describe_autocast(autocast)} here, "
                                                  f"{describe_autocast(self._autocast)} at "
                                                  "optimize()", changed)))
            if hooks != self._hooks:
                changed = ", ".join(filter(None, (
                    f"hooks changed at {changed_hooks(self.model, self._hooks, hooks)}", changed)))
                warn_if_hooks(self.model)
            try:
                step = self._plan_for(args, kwargs, resident, resident_bytes, held, why, changed)
            except InfeasibleBudgetError as err:
                if not held:
                    self._refused.remember(key, err)
                    raise
                # NOTE [Outputs held through the backward]: keep the plan that frees them
                freeing = key[:6] + ((autocast, hooks, False),) + key[7:]
                try:
                    step = self._steps.get(freeing) or self._plan_for(
                        args, kwargs, resident, resident_bytes, False, why, changed)
                except InfeasibleBudgetError as freed:  # the least it can hold: said alone
                    self._refused.remember(key, freed)
                    self._refused.remember(freeing, freed)
                    raise freed from None
                self._held.cannot_fit(err.min_feasible_bytes, self.plan.memory_limit_bytes)
            self._steps[key] = step
            traced = watched.values(list(self.model.modules()))
            if traced != values:  # the forward changed some while traced: the step holds those
                self._steps[key[:-1] + (traced,)] = step
        return step, inputs

    def _watching(self, modules: list[nn.Module]) -> tuple[Watched, tuple]:
        """NOTE [Attributes read as constants] for the modules the model has now (`modules`:
        walked), and their values when that set was first met. Where they are is noted once
        per set of modules: a module added after optimize() (an adapter wrapping a Linear)
        moved the rest, and the positions noted for the first set read other modules, so a
        dropout's p changed after it planned nothing, silently (tests/test_attributes.py)."""
        if modules is not self._watched_list:
            key = _structure(modules)
            if key not in self._watchers:
                watched = Watched.of(self.model, skip=self._first.kept)
                self._watchers[key] = watched, watched.values(modules)
            self._watched_now, self._watched_list = self._watchers[key], modules
        return self._watched_now

    def _plan_for(self, args: tuple, kwargs: dict, resident: tuple[int, ...],
                  resident_bytes: int, outputs_held: bool, why: str, changed: str = "") -> Step:
        """A step planned for these inputs and gradients in place; `why`: what differs from
        the first step: a key of WHAT_TO_DO ("attributes": `changed` says which)."""
        start = time.perf_counter()
        first = self._first.label
        if self._plan_step is None:
            raise PlanMismatchError(f"monet_opt: this module runs only its first plan ({first})")
        try:
            # the caller's dispatch modes watch the step only; tracing is the process's: one
            # thread plans at a time (NOTE [Steps in flight])
            with _PLANNING, _disable_current_modes():
                step = dataclasses.replace(
                    self._plan_step(self.model, args, kwargs, resident, resident_bytes,
                                    outputs_held),
                    changed=changed)
        except CaptureError as err:  # it says optimize(): it was this call
            failed, hints = str(err).partition("\nWhat to try:")[::2]
            err.args = (failed.replace("monet_opt.optimize could not", "monet_opt could not", 1)
                        + f"\nThis was a call of the optimized module, planning a step for "
                        f"{situation(why, resident_bytes)} ({describe_inputs(args, kwargs)}); "
                        f"the first plan was for {first}." + call_hints(hints.strip()),)
            raise
        except InfeasibleBudgetError as err:  # it says optimize(): it was this call
            err.args = (str(err).replace("monet_opt.optimize: ", "monet_opt: ", 1),)
            err.add_note(f"monet_opt: while planning a step for {situation(why, resident_bytes)}"
                         f" ({describe_inputs(args, kwargs)}{f'; {changed}' if changed else ''})"
                         f"; the first plan was for {first}. The limit is the first plan's, "
                         f"{format_bytes(self.plan.memory_limit_bytes)}, held in bytes for every"
                         " shape (a share such as '60% of peak' is of the first plan's step: "
                         "NOTE [Limits as shares]); a higher one takes optimize() again. "
                         + WHAT_TO_DO[why])
            raise
        made = len({id(s) for s in self._steps.values()}) + 1  # one under two keys: once
        warnings.warn(ReplanWarning(
            f"monet_opt: planned a step for {step.label} (the first plan: {first}) under the "
            f"same memory limit, {format_bytes(self.plan.memory_limit_bytes)}, in "
            f"{time.perf_counter() - start:.1f} s: predicted peak "
            f"{format_bytes(step.plan.predicted_peak_bytes)}, {made} plans so "
            "far. Each is planned once. " + WHAT_TO_DO[why]
            + too_many(made, "shapes" if [s.shape for s in step.spec.leaves]
                       != [s.shape for s in self._first.spec.leaves] else why)),
            stacklevel=user_stacklevel())  # the caller of opt(...)
        return step

    def _fresh(self) -> OptimizedModule:
        """A copy's own record of steps in flight, outputs held and its last walk."""
        self._in_flight = InFlight()
        self._held = HeldOutputs()
        self._walk = Walk()
        self._watched_list: list[nn.Module] | None = None  # those _watched_now is for
        self._watched_now = None
        return self

    def _get_name(self) -> str:
        """The model's class name (NOTE [Named as the model] in monet_opt/forwarded.py)."""
        return self.model._get_name()

    def __repr__(self) -> str:
        return "OptimizedModule" + super().__repr__().removeprefix(self._get_name())

    def extra_repr(self) -> str:
        return (f"memory_limit={self.plan.memory_limit_bytes}, solver={self.plan.solver!r}, "
                f"predicted_peak={self.plan.predicted_peak_bytes}")


def _structure(modules: list[nn.Module]) -> tuple:
    return tuple(zip(map(id, modules), map(type, modules)))
