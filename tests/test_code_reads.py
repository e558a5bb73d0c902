"""NOTE [Attributes the forward's code reads] in monet_opt/attributes.py: what a module's code
reads from `self` beside its plain public values (a function, a private number, a class
attribute, a dtype, a module kept in a list, a forward set on the instance) and a function read
by a global name, changed after optimize(), plan a step for the new value; each was held as
traced, silently (outputs 0.16-1.45 from eager's). What changes every step but is not read
plans nothing."""
from __future__ import annotations

import copy
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import monet_opt
from monet_opt.module import ReplanWarning

ACT = torch.relu


class _Reads(nn.Module):
    SCALE = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.f, self.g = nn.Linear(8, 16), nn.Linear(16, 4)
        self.act_fn, self._scale, self.dtype = F.relu, 1.0, torch.float32
        self.use, self.opts = [True], {"scale": 1.0}
        self.cfg = types.SimpleNamespace(tau=1.0)
        self.schedule = types.SimpleNamespace(weights=torch.ones(16))  # a noise schedule's
        self.monitor = types.SimpleNamespace(weight=self.g.weight)  # read for its shape only
        self.kept = [nn.Linear(8, 16).requires_grad_(False), torch.ones(16)]

    def forward(self, x):
        h = self.act_fn(self.f(x)) * self._scale * self.SCALE * self.opts["scale"] / self.cfg.tau
        h = h + self.kept[0](x) * self.kept[1] * self.schedule.weights
        h = ACT(h.to(self.dtype).float())[:, :self.monitor.weight.shape[1]]
        return self.g(h if self.use[0] else -h)


def _use_tanh(m):
    m.act_fn = torch.tanh


def _new_teacher_weight(m):
    m.kept[0].weight = nn.Parameter(m.kept[0].weight * 3, requires_grad=False)


def _forward_set_on_the_instance(m):
    g = m.g
    g.forward = lambda x: nn.Linear.forward(g, x) * 2


def _global_function(m):
    global ACT
    ACT = torch.tanh


CHANGES = {
    "a function": _use_tanh,
    "a private number": lambda m: setattr(m, "_scale", 3.0),
    "a class attribute set on the instance": lambda m: setattr(m, "SCALE", 2.0),
    "a dtype": lambda m: setattr(m, "dtype", torch.float16),
    "a module kept in a list, replaced": lambda m: m.kept.__setitem__(
        0, nn.Linear(8, 16).requires_grad_(False)),
    "a kept module's new weight": _new_teacher_weight,
    "a forward set on the instance": _forward_set_on_the_instance,
    "a global function": _global_function,
    # NOTE [Objects the forward's code reads]: a diffusers processor or scheduler swapped
    "an object replaced": lambda m: setattr(m, "schedule", types.SimpleNamespace(
        weights=torch.full((16,), 2.0))),
    "an object's tensor replaced": lambda m: setattr(m.schedule, "weights", torch.full(
        (16,), 2.0)),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_value_the_code_reads_changed_plans_a_step(change):
    global ACT
    torch.manual_seed(0)
    model, x = _Reads(), torch.randn(4, 8)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    before = opt(x).detach()
    try:
        CHANGES[change](model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = opt(x)
        said = [str(w.message) for w in caught if issubclass(w.category, ReplanWarning)]
        assert said and torch.equal(out, model(x)) and not torch.equal(out, before)
        if change == "a forward set on the instance":  # it said "(None, None) -> (None, <fn>)"
            assert "module 'g': forward set on it" in said[0], said[0]
    finally:
        ACT = torch.relu


def test_an_objects_tensor_written_in_place_is_read_as_it_is():
    """NOTE [Objects the forward's code reads]: a tensor a helper holds is read by reference,
    so the loop's writes reach the step with no plan made (watching its version planned every
    step anew where the loop filled it each step); a helper holding a parameter it does not
    read plans nothing as the optimizer writes it."""
    torch.manual_seed(0)
    model, x = _Reads(), torch.randn(4, 8)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplanWarning)
        for step in range(3):
            model.schedule.weights.fill_(1.0 + step)
            out = opt(x)
            assert torch.equal(out.detach(), model(x).detach())
            out.sum().backward()
            with torch.no_grad():
                model.g.weight.sub_(0.1 * model.g.weight.grad)
            model.zero_grad(set_to_none=True)
    assert len(opt.plans) == 1


def test_a_torch_layers_activation_changed_plans_a_step():
    """TransformerEncoderLayer reads `self.activation` in a method of PyTorch's own."""
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 16)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    model.activation = F.gelu
    with pytest.warns(ReplanWarning, match="activation"):
        out = opt(x)
    assert torch.equal(out, copy.deepcopy(model)(x))


def test_what_the_loop_changes_each_step_plans_nothing():
    """An argparse Namespace on the module whose `step` the loop counts, a list it appends to
    (the forward reads other values of them) planned a step at every call."""
    torch.manual_seed(0)
    model, x = _Reads(), torch.randn(4, 8)
    model.cfg.step, model.history = 0, []
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplanWarning)
        for step in range(3):
            opt(x).sum().backward()
            model.zero_grad(set_to_none=True)
            model.cfg.step, model.opts["seen"] = step + 1, step
            model.use.append(True)


def test_a_forward_walking_its_children_is_not_planned_again_for_a_copy_or_an_assigned_load():
    """NOTE [A module's own registries]: TransformerEncoderLayer's forward walks
    `self.modules()`; its `_modules` was watched by identity, so a deepcopy and each
    load_state_dict(assign=True) planned the step again (one more plan at every load)."""
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 16)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    eager = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplanWarning)
        twin = copy.deepcopy(opt)
        assert torch.equal(twin(x), eager(x))
        for _ in range(2):
            opt.load_state_dict(copy.deepcopy(eager.state_dict()), assign=True)
            opt(x).sum().backward()
    assert len(opt.plans) == 1 and len(twin.plans) == 1
    eager(x).sum().backward()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert torch.equal(p.grad, q.grad), name
    model.activation = F.gelu  # a value the forward reads is still watched
    with pytest.warns(ReplanWarning, match="activation"):
        opt(x)


class _ReadsInAComprehension(nn.Module):
    """`self` read in a comprehension is a cell of the forward: every `self.X` of it was
    unseen, the ones outside the comprehension too."""
    drop = 0.1

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(8, 4) for _ in range(2))
        self._tau, self.act_fn = 1.0, F.relu

    def forward(self, x):
        hs = [self.heads[i](x) for i in range(len(self.heads))]
        return self.act_fn(torch.cat(hs, -1)) / self._tau * (1 - self.drop)


@pytest.mark.parametrize("change", ["_tau", "act_fn", "drop"])
def test_a_value_read_beside_a_comprehension_changed_plans_a_step(change):
    torch.manual_seed(0)
    model, x = _ReadsInAComprehension(), torch.randn(4, 8)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    before = opt(x).detach()
    new = {"_tau": 0.25, "act_fn": torch.tanh, "drop": 0.5}[change]
    setattr(model if change != "drop" else _ReadsInAComprehension, change, new)
    try:
        with pytest.warns(ReplanWarning):
            out = opt(x)
        assert torch.equal(out, model(x)) and not torch.equal(out, before)
    finally:
        _ReadsInAComprehension.drop = 0.1
