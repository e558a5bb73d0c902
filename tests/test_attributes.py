"""Numbers a module's forward reads are constants of the traced step: changing one plans a step
for the new value (NOTE [Attributes read as constants] in monet_opt/attributes.py); before, the
change did nothing, silently."""
from __future__ import annotations

import copy
import types
import warnings

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt.module import ReplanWarning

HUGE = 1 << 40
pytestmark = pytest.mark.filterwarnings("ignore::monet_opt.OutputGradientWarning")


class Tempered(nn.Module):
    """A softmax at temperature `tau` (an attribute, or a buffer), then dropout; `config.scale`
    as an HF model reads its config."""

    def __init__(self, in_buffer: bool = False) -> None:
        super().__init__()
        self.f, self.drop = nn.Linear(16, 16), nn.Dropout(0.1)
        self.config = types.SimpleNamespace(scale=1.0)
        if in_buffer:
            self.register_buffer("tau", torch.tensor(1.0))
        else:
            self.tau = 1.0

    def forward(self, x):
        return self.drop(torch.softmax(self.f(x) / self.tau, -1)) * self.config.scale


def _step(module, owner, x, seed):
    owner.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = module(x)
    out.square().sum().backward()
    return out.detach(), [p.grad.clone() for p in owner.parameters()]


def _replans_of_alike_step(opt, model, eager, x, seed) -> list[str]:
    """One step of `opt` (training `model`) and of `eager`, outputs and gradients bitwise
    alike; the ReplanWarnings ours raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = _step(opt, model, x, seed)
    expected = _step(eager, eager, x, seed)
    assert torch.equal(ours[0], expected[0])
    assert all(torch.equal(a, b) for a, b in zip(ours[1], expected[1]))
    return [str(w.message) for w in caught if issubclass(w.category, ReplanWarning)]


def _set(model, tau, p, scale):
    model.drop.p, model.config.scale = p, scale
    if isinstance(model.tau, torch.Tensor):
        model.tau.fill_(tau)
    else:
        model.tau = tau


def test_changed_attributes_plan_a_step_and_train_like_eager():
    torch.manual_seed(0)
    model, x = Tempered().train(), torch.randn(4, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    settings = [(1.0, 0.1, 1.0), (0.5, 0.1, 1.0), (0.5, 0.5, 1.0), (0.5, 0.5, 3.0),
                (1.0, 0.1, 1.0)]
    for seed, (tau, p, scale) in enumerate(settings):
        _set(eager, tau, p, scale)
        _set(model, tau, p, scale)
        replans = _replans_of_alike_step(opt, model, eager, x, seed)
        assert len(replans) == (seed in (1, 2, 3))  # back to the first values: its step again
        if seed == 2:
            assert "with tau 1.0 -> 0.5, drop.p 0.1 -> 0.5" in replans[0]
        if seed == 3:
            assert "config.scale 1.0 -> 3.0" in replans[0]
    assert len(opt._steps) == 4


def test_a_buffer_changes_with_no_plan():
    """The advice the warning gives: a number in a buffer is an input of the step."""
    torch.manual_seed(0)
    model, x = Tempered(in_buffer=True).train(), torch.randn(4, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplanWarning)
        for seed, tau in enumerate((1.0, 0.7, 0.3)):
            _set(eager, tau, 0.1, 1.0)
            _set(model, tau, 0.1, 1.0)
            ours, expected = _step(opt, model, x, seed), _step(eager, eager, x, seed)
            assert torch.equal(ours[0], expected[0])
            assert all(torch.equal(a, b) for a, b in zip(ours[1], expected[1]))


def test_new_values_refused_when_asked():
    """new_shapes="error" refuses inputs of other shapes; a changed attribute is planned
    whatever it says, as changed parameters are."""
    model, x = Tempered().train(), torch.randn(4, 16)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1,
                             new_shapes="error")
    model.tau = 2.0
    with pytest.warns(ReplanWarning, match=r"with tau 1\.0 -> 2\.0"):
        opt(x).sum().backward()


def test_a_replaced_module_plans_a_step():
    """A module replaced by one of another class (with no attributes to tell them apart) ran as
    the old one, silently (outputs 0.58 apart)."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)), torch.randn(4, 16)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    model[1] = nn.Sigmoid()
    with pytest.warns(ReplanWarning, match=r"with module '1' Tanh -> Sigmoid"):
        out = opt(x)
    assert torch.equal(out, model(x))


def test_an_attribute_changed_after_a_module_was_added_plans_a_step():
    """A module added after optimize() (an adapter wrapping a Linear) moved the others in the
    model's list of modules; where the watched values are was noted once, for the first list,
    so a dropout's p changed after it planned nothing and ran at the old p, silently (outputs
    0.17 apart). They are noted anew for each set of modules."""
    torch.manual_seed(0)
    model, x = Tempered().train(), torch.randn(4, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    for m in (model, eager):
        m.f = nn.Sequential(m.f, nn.Identity())
    replans = _replans_of_alike_step(opt, model, eager, x, 1)
    assert len(replans) == 1 and "with 3 -> 5 modules (" in replans[0]
    for m in (model, eager):
        m.drop.p = 0.6
    replans = _replans_of_alike_step(opt, model, eager, x, 2)
    assert len(replans) == 1 and "with 3 -> 5 modules, drop.p 0.1 -> 0.6 (" in replans[0]
    assert _replans_of_alike_step(opt, model, eager, x, 3) == []


def test_a_batch_norm_frozen_after_optimize_plans_a_step():
    """Freezing a BatchNorm (eval mode in a training model) after optimize() plans a step for
    it (it was refused); its running statistics stay, gradients bitwise eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
    x = torch.randn(2, 3, 10, 10)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model.train(), x, HUGE, profile_dir=None, profile_repeats=1)
    for m in (model, eager):
        m[1].eval()
    with pytest.warns(ReplanWarning, match=r"with module '1' train -> eval"):
        ours = _step(opt, model, x, 0)
    expected = _step(eager, eager, x, 0)
    assert torch.equal(ours[0], expected[0])
    assert all(torch.equal(a, b) for a, b in zip(ours[1], expected[1]))
    assert torch.equal(model[1].running_mean, eager[1].running_mean)
    assert int(model[1].num_batches_tracked) == 0


class Counted(nn.Module):
    """Anneals a temperature by a count its forward increments: a Python attribute, or a
    buffer updated in place."""

    def __init__(self, in_buffer: bool) -> None:
        super().__init__()
        self.f, self.in_buffer = nn.Linear(16, 16), in_buffer
        if in_buffer:
            self.register_buffer("calls", torch.zeros(()))
        else:
            self.calls = 0

    def forward(self, x):
        if self.in_buffer:
            self.calls.add_(1)
        else:
            self.calls += 1
        return torch.softmax(self.f(x) / (1 + self.calls), -1)


def test_a_count_the_forward_keeps_is_warned_and_a_buffer_counts():
    """The forward's own Python runs only while traced: optimize() says so, naming the line
    that called it; kept in a buffer, the count is updated by every step, as eager's is."""
    x = torch.randn(4, 16)
    with pytest.warns(monet_opt.SideEffectWarning, match=r"calls 0 -> \d") as seen:
        monet_opt.optimize(Counted(False), x, HUGE, profile_dir=None, profile_repeats=1)
    assert any(w.filename == __file__ for w in seen)
    torch.manual_seed(0)
    model = Counted(True)
    eager = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.SideEffectWarning)
        opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    for _ in range(3):
        assert torch.equal(opt(x), eager(x))
    assert int(model.calls) == int(eager.calls) == 3


class Untied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(50, 16), nn.Linear(16, 50, bias=False)

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


def test_weights_tied_after_optimize_plan_a_step():
    """Tying weights after optimize() (HF's tie_weights()) removes a parameter's name: it raised
    a KeyError; now a step is planned for the parameters as they are, gradients eager's."""
    torch.manual_seed(0)
    model, ids = Untied(), torch.randint(0, 50, (4, 8))
    opt = monet_opt.optimize(model, ids, HUGE, profile_dir=None, profile_repeats=1)
    eager = copy.deepcopy(model)
    for m in (model, eager):
        m.head.weight = m.emb.weight
    with pytest.warns(ReplanWarning, match="added, removed or tied"):
        ours = _step(opt, model, ids, 0)
    expected = _step(eager, eager, ids, 0)
    assert torch.equal(ours[0], expected[0])
    assert len(ours[1]) == len(expected[1]) == 1 and torch.equal(ours[1][0], expected[1][0])


SCALE, WARM = 1.0, True  # globals the forward below reads, changed by the test as a loop would
SCHEDULE = types.SimpleNamespace(p=0.1)


class ReadsGlobals(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(16, 16)

    def forward(self, x):
        h = self.f(x) * SCALE
        return nn.functional.dropout(h if WARM else torch.tanh(h), SCHEDULE.p)


def test_globals_the_forward_reads_plan_a_step():
    """A plain global the forward reads, or an attribute of an object held in one, was a
    constant of the traced step: reassigning it (a schedule the loop keeps at module level)
    changed nothing, silently."""
    global SCALE, WARM
    torch.manual_seed(0)
    model, x = ReadsGlobals().train(), torch.randn(4, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    try:
        for seed, (SCALE, WARM, SCHEDULE.p) in enumerate([(1.0, True, 0.1), (0.5, True, 0.1),
                                                          (0.5, False, 0.1), (0.5, False, 0.4)]):
            replans = _replans_of_alike_step(opt, model, eager, x, seed)
            assert len(replans) == (seed > 0)
            if seed == 2:
                assert "global WARM" in replans[0] and "True -> False" in replans[0]
            if seed == 3:
                assert "global SCHEDULE.p" in replans[0] and "0.1 -> 0.4" in replans[0]
    finally:
        SCALE, WARM, SCHEDULE.p = 1.0, True, 0.1


LIMITS = {"clip": 3.0}  # read by a helper the forward calls, through a method and a property
CFG = types.SimpleNamespace(MODEL=types.SimpleNamespace(TEMP=1.0))


def _clipped(h):
    return h.clamp(-LIMITS["clip"], LIMITS["clip"])


class ReadsFurther(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(16, 16)

    @property
    def temperature(self):
        return CFG.MODEL.TEMP

    def _act(self, h):
        return _clipped(h) / self.temperature

    def forward(self, x):
        return torch.softmax(self._act(self.f(x) * 4), -1)


def test_globals_read_by_called_functions_plan_a_step():
    """What the functions the forward calls read (a helper by its global name, a method and a
    property through self), an item of a global dict and a chain of attributes were constants
    of the traced step too, silently (NOTE [Globals read by the forward])."""
    torch.manual_seed(0)
    model, x = ReadsFurther().train(), torch.randn(4, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    model_node = CFG.MODEL
    try:
        for seed, change, named in [(0, None, None),
                                    (1, lambda: LIMITS.update(clip=0.5), "LIMITS['clip']"),
                                    (2, lambda: setattr(CFG.MODEL, "TEMP", 0.5), "MODEL.TEMP"),
                                    (3, lambda: setattr(CFG, "MODEL", types.SimpleNamespace(
                                        TEMP=2.0)), "-> 2.0")]:
            if change:
                change()
            replans = _replans_of_alike_step(opt, model, eager, x, seed)
            assert len(replans) == (seed > 0)
            assert seed == 0 or named in replans[0]
    finally:
        LIMITS["clip"], CFG.MODEL, model_node.TEMP = 3.0, model_node, 1.0


HOOK_SCALE = 1.5  # read by a module hook, changed by the test as a warm-up schedule would


def _scaled(module, inputs, output):
    return output * HOOK_SCALE


def test_globals_read_by_module_hooks_plan_a_step():
    """A forward hook scaling an output by a global the loop changes: the step held the value
    met at optimize() (loss 23.95 where eager's was 16.33, silently). HookWarning aside, it
    is watched as the forward's own reads are."""
    global HOOK_SCALE
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), torch.randn(8, 16)
    model[0].register_forward_hook(_scaled)
    eager = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.HookWarning)
        opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    try:
        for seed, scale in enumerate((1.5, 0.25)):
            HOOK_SCALE = scale
            replans = _replans_of_alike_step(opt, model, eager, x, seed)
            assert len(replans) == seed and (seed == 0 or "HOOK_SCALE" in replans[0])
    finally:
        HOOK_SCALE = 1.5


def test_methods_replaced_on_a_class_plan_a_step():
    """NOTE [Methods replaced on a class]: a class's forward (or a method it calls) replaced
    after optimize() ran as traced, silently (outputs 1.53 from eager's)."""
    class Mixed(Tempered):
        def forward(self, x):
            return self._mix(super().forward(x))

        def _mix(self, y):
            return y + 1.0

    torch.manual_seed(0)
    model, x = Mixed().train(), torch.randn(4, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    plain_forward, plain_mix = Mixed.forward, Mixed._mix
    try:
        Mixed._mix = lambda self, y: y * 2.0
        assert "with Mixed._mix replaced" in _replans_of_alike_step(opt, model, eager, x, 1)[0]
        Mixed.forward = lambda self, x: plain_forward(self, x) - 3.0
        assert "Mixed.forward replaced" in _replans_of_alike_step(opt, model, eager, x, 3)[0]
    finally:
        Mixed.forward, Mixed._mix = plain_forward, plain_mix
    assert not _replans_of_alike_step(opt, model, eager, x, 4)  # the first step again


def test_a_config_value_set_once_is_no_side_effect():
    """HF's sequence classifiers set config.problem_type on their first call with labels, as
    eager does once: every one of them was warned that eager would set it each step."""
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        vocab_size=100, max_position_embeddings=32, num_labels=3)).train()
    batch = {"input_ids": torch.randint(0, 100, (2, 8)), "labels": torch.tensor([0, 2])}
    assert model.config.problem_type is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.SideEffectWarning)
        opt = monet_opt.optimize(model, batch, 1 << 40, profile_dir=None, profile_repeats=1)
    assert model.config.problem_type == "single_label_classification"
    opt(**batch).loss.backward()
