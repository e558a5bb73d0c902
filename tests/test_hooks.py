"""NOTE [Module hooks]: hooks in place when optimize() traces are in the step (what they compute
on tensors, bitwise eager's), with a HookWarning about their side effects; hooks added or removed
later plan a step for them."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import monet_opt
from tests import models

HUGE = 1 << 40


def _scale(module, inputs, output):
    return output * 0.5


def _step(module, owner, x, loss_fn):
    torch.manual_seed(1)
    loss_fn(module(x)).backward()
    grads = [p.grad.clone() for p in owner.parameters()]
    owner.zero_grad(set_to_none=True)
    return grads


def test_a_hook_in_place_when_traced_is_in_the_step_with_a_warning():
    torch.manual_seed(0)
    model, x, loss_fn = models.mlp()
    model.net[1].register_forward_hook(_scale)
    eager = copy.deepcopy(model)
    with pytest.warns(monet_opt.HookWarning, match=r"MLP has module hooks: net\.1 \(forward "
                                                    r"hooks\).*side effects"):
        least = monet_opt.optimize(model, x, HUGE, profile_repeats=1,
                                   profile_dir=None).plan.min_feasible_bytes
    with pytest.warns(monet_opt.HookWarning):
        opt = monet_opt.optimize(model, x, least, profile_repeats=1, profile_dir=None)
    assert opt.plan.recomputed_ops > 0
    plain = copy.deepcopy(eager)
    plain.net[1]._forward_hooks.clear()
    ours, theirs, unhooked = (_step(m, o, x, loss_fn) for m, o in
                              ((opt, model), (eager, eager), (plain, plain)))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert not all(torch.equal(a, b) for a, b in zip(ours, unhooked))  # the hook mattered


def test_hooks_changed_after_optimize_plan_a_step_for_them():
    """A hook added after optimize() (it refused the step, PlanMismatchError) plans a step that
    runs it (ReplanWarning naming where, HookWarning), bitwise eager's; removed, the first plan
    runs again, with no new plan; a global hook plans one too."""
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    handles = [m.stem[0].register_forward_hook(_scale) for m in (model, eager)]
    with pytest.warns(monet_opt.ReplanWarning, match=r"hooks changed at stem\.0 \(forward "
                                                     r"hooks\)"), \
            pytest.warns(monet_opt.HookWarning, match=r"stem\.0") as hooked:
        ours = _step(opt, model, x, loss_fn)
    assert all(w.filename == __file__ for w in hooked if w.category is monet_opt.HookWarning)
    assert all(torch.equal(a, b) for a, b in zip(ours, _step(eager, eager, x, loss_fn)))
    for handle in handles:
        handle.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = _step(opt, model, x, loss_fn)  # the first plan
    assert all(torch.equal(a, b) for a, b in zip(ours, _step(eager, eager, x, loss_fn)))
    glob = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        with pytest.warns(monet_opt.ReplanWarning, match=r"global \(forward hooks\)"):
            _step(opt, model, x, loss_fn)
    finally:
        glob.remove()
    assert len(opt.plans) == 3


def test_pruning_after_optimize_trains_like_eager():
    """torch.nn.utils.prune after optimize() (a forward pre-hook and a mask buffer, the weight
    a parameter no more), twice, then made permanent: each step bitwise eager's, within its
    plan's prediction and the limit, one plan for each. Each is measured on the step after
    the one that plans it: a step that plans has the planning's memory in its allocation
    events (NOTE [Allocation events] in monet_opt/alloc_events.py)."""
    prune = pytest.importorskip("torch.nn.utils.prune")
    torch.manual_seed(0)
    model, x, loss_fn = models.mlp()
    eager = copy.deepcopy(model)
    full = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_repeats=1,
                              profile_dir=None).plan
    limit = (full.min_feasible_bytes + full.store_all_peak_bytes) // 2  # room for the masks
    opt = monet_opt.optimize(model, x, limit, profile_repeats=1, profile_dir=None)
    assert opt.plan.recomputed_ops > 0
    for k in range(4):
        for m in (model, eager):
            if k in (1, 2):
                prune.l1_unstructured(m.net[0], "weight", amount=0.3)
            elif k == 3:
                prune.remove(m.net[0], "weight")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", monet_opt.ReplanWarning)
            warnings.simplefilter("ignore", monet_opt.HookWarning)
            loss_fn(opt(x)).backward()  # plans where the pruning made another step
            model.zero_grad(set_to_none=True)
            torch.manual_seed(1)  # as _step does
            peak = monet_opt.measure_peak(lambda: loss_fn(opt(x)).backward(),
                                          monet_opt.resident_tensors(model, x))
        ours = [p.grad for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        assert all(torch.equal(a, b) for a, b in zip(ours, _step(eager, eager, x, loss_fn))), k
        plan = list(opt.plans.values())[k]  # made permanent, the weight is registered last
        assert peak <= plan.predicted_peak_bytes <= limit, (k, peak, plan.predicted_peak_bytes)
    assert len(opt.plans) == 4


@pytest.mark.parametrize("solver", ["chen_greedy", "evict"])
def test_a_pruned_weight_held_on_its_module_and_recomputed(solver):
    """NOTE [Saved values the backward does not read]: plans that recompute a pruned layer's
    weight (the prune hook keeps it on the module, held for the whole step) rather than read it
    made the backward be handed it unread, an internal error; each now trains bitwise like
    eager within its prediction."""
    prune = pytest.importorskip("torch.nn.utils.prune")
    torch.manual_seed(0)
    model, x, loss_fn = models.mlp()
    full = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_repeats=1,
                              profile_dir=None).plan
    least, store_all = full.min_feasible_bytes, full.store_all_peak_bytes + 40_000  # the mask
    for k in range(3, 8):
        limit = least + (store_all - least) * k // 10
        ours, eager = copy.deepcopy(model), copy.deepcopy(model)
        for m in (ours, eager):
            prune.l1_unstructured(m.net[0], "weight", amount=0.3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", monet_opt.HookWarning)
            try:
                opt = monet_opt.optimize(ours, x, limit, solver=solver, time_limit_s=3,
                                         profile_repeats=1, profile_dir=None)
            except monet_opt.InfeasibleBudgetError:
                continue
        torch.manual_seed(1)
        peak = monet_opt.measure_peak(lambda: loss_fn(opt(x)).backward(),
                                      monet_opt.resident_tensors(ours, x))
        grads = [p.grad for p in ours.parameters()]
        assert all(torch.equal(a, b) for a, b in zip(grads, _step(eager, eager, x, loss_fn)))
        assert peak <= opt.plan.predicted_peak_bytes <= limit, (k, peak)


class _Offloaded(torch.nn.Module):
    """Its first block's saved tensors offloaded to host memory (or checkpointed: torch's own
    saved-tensor hooks, not the model's)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a, self.b = torch.nn.Linear(8, 32), torch.nn.Linear(32, 2)
        if how == "offload_wrapper":  # torch's, which enters save_on_cpu in its own file
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                offload_wrapper)
            self.wrapped = offload_wrapper(torch.nn.Sequential(self.a, torch.nn.GELU()))

    def block(self, x):
        return torch.nn.functional.gelu(self.a(x))

    def forward(self, x):
        if self.how == "checkpoint":
            return self.b(torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False))
        if self.how == "offload_wrapper":
            return self.b(self.wrapped(x))
        with torch.autograd.graph.save_on_cpu():
            h = self.block(x)
        return self.b(h)


@pytest.mark.parametrize("how", ["save_on_cpu", "offload_wrapper", "checkpoint"])
def test_saved_tensor_hooks_in_the_forward_are_named(how):
    """NOTE [Saved-tensor hooks in the forward]: the step does not run the model's saved-tensor
    hooks; optimize() says so, naming the line (it said nothing), and the step trains like
    eager at its prediction. torch.utils.checkpoint's own hooks are not the model's."""
    torch.manual_seed(0)
    model, x = _Offloaded(how), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    named = [str(w.message) for w in caught if issubclass(w.category, monet_opt.HookWarning)]
    if how == "checkpoint":
        assert not named
    else:
        assert len(named) == 1 and "save_on_cpu" in named[0]
        assert ("test_hooks.py" if how == "save_on_cpu" else "checkpoint_wrapper.py") in named[0]
    loss_fn = lambda out: out.sum()  # noqa: E731
    assert all(torch.equal(u, v) for u, v in zip(_step(opt, model, x, loss_fn),
                                                  _step(eager, eager, x, loss_fn)))
    measured = monet_opt.measure_peak(lambda: opt(x).sum().backward(),
                                      monet_opt.resident_tensors(model, x))
    assert measured == opt.plan.predicted_peak_bytes


def test_saved_tensor_hooks_around_the_call_are_warned_of():
    """Hooks set around the call act on the plan's saved tensors: the step measured over its
    prediction and limit under a pack hook that copies, silently."""
    model, x = _Offloaded("checkpoint"), torch.randn(4, 8)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        with pytest.warns(monet_opt.HookWarning, match="saved-tensor hooks context"):
            opt(x).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.HookWarning)
        opt(x).sum().backward()  # outside: nothing to say


def test_saved_tensor_hooks_around_a_call_that_runs_the_model_say_nothing():
    """In eval mode the model itself runs (its hooks act as in eager): no plan to warn of."""
    model, x = _Offloaded("checkpoint"), torch.randn(4, 8)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    opt.eval()
    with torch.autograd.graph.save_on_cpu(), warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.HookWarning)
        opt(x).sum().backward()


def test_a_hook_registered_anew_every_step_is_told_to_be_kept():
    """From the fifth plan on, a hook registered anew each step was told to pad its inputs to
    a few fixed lengths (the advice for new shapes); its inputs never changed."""
    torch.manual_seed(0)
    model, x, loss_fn = models.mlp()
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    for _ in range(monet_opt.replan_text.MANY_SHAPES):
        handle = model.net[0].register_forward_hook(_scale)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _step(opt, model, x, loss_fn)
        handle.remove()
    said = [str(w.message) for w in caught if w.category is monet_opt.ReplanWarning][-1]
    assert "register it once and keep it" in said and "pad them" not in said


@pytest.mark.parametrize("tracker", ["FlopCounterMode", "ModTracker"])
def test_steps_inside_module_trackers_are_planned_once(tracker):
    """NOTE [Trackers' hooks]: FlopCounterMode's and ModTracker's trackers hook every module
    anew at each entry; each step inside them was planned again, with a HookWarning about the
    model's hooks (inside ModTracker the new trace failed)."""
    from torch.distributed._tools.mod_tracker import ModTracker
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(0)
    model, x, _ = models.small_cnn()
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        counter = FlopCounterMode(display=False) if tracker == "FlopCounterMode" else \
            ModTracker()
        with warnings.catch_warnings(record=True) as seen, counter:
            warnings.simplefilter("always")
            opt(x).sum().backward()
        ours = [str(w.message)[:100] for w in seen  # ModTracker's own may say it lost track
                if w.category.__module__.startswith("monet_opt")]
        assert not ours, ours
        assert tracker != "FlopCounterMode" or counter.get_total_flops() > 0
    assert len(opt.plans) == 1


class _TrunkAndHeads(torch.nn.Module):
    """Returns (features, the head's logits computed from them, a second head's logits)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)
        self.other = torch.nn.Linear(8, 2)

    def forward(self, x):
        h = torch.tanh(self.trunk(x))
        return h, self.head(h), self.other(x)


@pytest.mark.parametrize("hooked, warned", [(0, True), (2, False), (None, False)],
                         ids=["the features", "an independent head", "none"])
def test_a_hook_on_an_output_others_are_computed_from_is_warned(hooked, warned):
    """NOTE [Hooks on an output others are computed from]: it sees only the gradient handed to
    that output directly (the trunk's gradients 2.0x eager's, silently); on an output nothing
    else is computed from it sees the whole, and the gradients are eager's."""
    torch.manual_seed(0)
    model, x = _TrunkAndHeads(), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    for module in (eager, opt):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            outputs = module(x)
            if hooked is not None:
                outputs[hooked].register_hook(lambda g: g * 0.5)
            sum(o.pow(2).sum() for o in outputs).backward()
            del outputs
    assert any(w.category is monet_opt.HookWarning for w in seen) is warned
    if not warned:
        assert all(torch.equal(p.grad, q.grad)
                   for p, q in zip(model.parameters(), eager.parameters()))
