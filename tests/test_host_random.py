"""Random numbers drawn in Python while traced are refused, naming the line (NOTE [Random numbers
drawn in Python]): the traced step kept them as constants, silently."""
from __future__ import annotations

import copy
import random
import types

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

import monet_opt
from tests.records import assert_same_grads, at_least_peak

HUGE = 1 << 40


class Skipped(nn.Module):
    """A residual block skipped at random, drawn from Python's `random`."""

    def __init__(self, torch_draw: bool = False) -> None:
        super().__init__()
        self.f, self.torch_draw = nn.Linear(16, 16), torch_draw

    def forward(self, x):
        if self.torch_draw:  # the same, as a mask drawn by torch: part of the step
            return x + torchvision.ops.stochastic_depth(torch.tanh(self.f(x)), 0.5, "row",
                                                        self.training)
        if self.training and random.random() < 0.5:
            return x
        return x + torch.tanh(self.f(x))


class HeldGenerator(nn.Module):
    """Noise from a NumPy generator the module holds."""

    def __init__(self) -> None:
        super().__init__()
        self.f, self.rng = nn.Linear(16, 16), np.random.default_rng(0)

    def forward(self, x):
        return self.f(x) * float(self.rng.random())


def test_python_draw_is_refused_naming_the_line():
    """Traced, each step skipped (or ran) the blocks the one draw at optimize() chose: outputs
    0.7-1.5 from eager's over three steps, with no word."""
    model = nn.Sequential(Skipped(), Skipped(), nn.Linear(16, 1))
    with pytest.raises(monet_opt.CaptureError,
                       match=r"(?s)random\.random at .*test_host_random\.py:\d+: if self\.training "
                             r"and random\.random\(\) < 0\.5.*stochastic_depth"):
        monet_opt.optimize(model, torch.randn(4, 16), HUGE, profile_dir=None)
    assert random.random.__self__ is random._inst  # the functions are as they were


@pytest.mark.parametrize("build", [lambda: nn.Sequential(Skipped(), nn.Linear(16, 1)),
                                   HeldGenerator], ids=["python's", "numpy's held"])
def test_a_refused_draw_leaves_the_streams_as_they_were(build):
    """NOTE [Draws put back]: the trace's draws moved the stream they came from."""
    model = build()
    random.seed(0)
    held = getattr(model, "rng", None)
    before = (random.getstate(), held.bit_generator.state if held is not None else None)
    with pytest.raises(monet_opt.CaptureError, match="drew random numbers in Python"):
        monet_opt.optimize(model, torch.randn(4, 16), HUGE, profile_dir=None)
    assert (random.getstate(), held.bit_generator.state if held is not None else None) == before


def test_torch_draw_trains_like_eager():
    """The same blocks with torch's draw: each step draws anew, as eager does, bitwise."""
    torch.manual_seed(0)
    model = nn.Sequential(Skipped(torch_draw=True), Skipped(torch_draw=True), nn.Linear(16, 1))
    eager, x = copy.deepcopy(model), torch.randn(4, 16)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    for step in range(3):
        torch.manual_seed(step)
        expected = eager(x)
        torch.manual_seed(step)
        assert torch.equal(opt(x), expected)


def test_held_generator_is_refused_naming_it():
    with pytest.raises(monet_opt.CaptureError, match=r"from model\.0\.rng \(the line was not"):
        monet_opt.optimize(nn.Sequential(HeldGenerator()), torch.randn(4, 16), HUGE,
                           profile_dir=None)


PY_RNG, NP_RNG = random.Random(0), np.random.default_rng(0)


class GlobalGenerator(nn.Module):
    """A layer drop drawn from a generator held as a global of this file, as NumPy advises
    (`rng = np.random.default_rng(seed)` beside the model)."""

    def __init__(self, which: str) -> None:
        super().__init__()
        self.f, self.which = nn.Linear(16, 16), which

    def forward(self, x):
        rng = PY_RNG if self.which == "PY_RNG" else NP_RNG
        return x if rng.random() < 0.3 else x + self.f(x)


@pytest.mark.parametrize("which", ["PY_RNG", "NP_RNG"])
def test_a_global_generator_is_refused_and_put_back(which):
    """Not watched, its one draw at optimize() was every step's: outputs 1.78-2.16 from
    eager's, silently."""
    state = copy.deepcopy(globals()[which].__getstate__())
    with pytest.raises(monet_opt.CaptureError, match=rf"from tests\.test_host_random\.{which} "
                                                     r"\(the line was not seen"):
        monet_opt.optimize(GlobalGenerator(which), torch.randn(4, 16), HUGE, profile_dir=None)
    assert globals()[which].__getstate__() == state


def test_failed_trace_says_what_was_drawn():
    """A trace that fails (here on a value read as a number) also names the Python draws, as
    HF's SpecAugment makes before its boolean indexing fails."""
    class Masked(nn.Module):
        def forward(self, x):
            keep = torch.tensor(np.random.rand(x.shape[0]) < 0.5)
            return x[keep] * 2

    with pytest.raises(monet_opt.CaptureError,
                       match=r"(?s)It also drew random numbers in Python:\n  numpy\.random\.rand "
                             r"at .*test_host_random\.py"):
        monet_opt.optimize(Masked(), torch.randn(4, 16, requires_grad=True), HUGE,
                           profile_dir=None)


def test_layerdrop_is_named():
    """HF's LayerDrop draws with torch but reads the draw as a number: the trace fails, and the
    error says which config setting to turn off."""
    class LayerDrop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = types.SimpleNamespace(encoder_layerdrop=0.1, hidden_size=16)
            self.f = nn.Linear(16, 16)

        def forward(self, x):
            if torch.rand([]) < self.config.encoder_layerdrop:
                return x
            return self.f(x)

    with pytest.raises(monet_opt.CaptureError, match=r"LayerDrop on \(encoder_layerdrop=0\.1\)"):
        monet_opt.optimize(LayerDrop(), torch.randn(4, 16), HUGE, profile_dir=None)


class Reseeded(nn.Module):
    """Dropout made to repeat its mask by seeding torch in the forward; the same layer
    checkpointed, whose replay sets the random state from torch's own code."""

    def __init__(self, seeded: bool) -> None:
        super().__init__()
        self.fc, self.drop, self.seeded = nn.Linear(16, 16), nn.Dropout(0.5), seeded

    def forward(self, x):
        if self.seeded:
            torch.manual_seed(123)
            return self.drop(self.fc(x))
        return torch.utils.checkpoint.checkpoint(lambda h: self.drop(self.fc(h)), x,
                                                 use_reentrant=False)


class Forked(nn.Module):
    """Noise drawn inside torch.random.fork_rng(), so that the stream is where it was after."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.drop, self.forked = nn.Linear(16, 16), nn.Dropout(0.5), True

    def forward(self, x):
        with torch.random.fork_rng(enabled=self.forked):
            noise = torch.randn_like(x)
        return self.drop(self.fc(x + noise))


def test_a_forked_random_state_in_the_forward_is_refused():
    """fork_rng's exit puts the stream back from torch's own code, which was not noted: the
    step's dropout drew on where eager's repeated the noise's draws (loss 0.124 for 0.098)."""
    with pytest.raises(monet_opt.CaptureError, match=r"torch.random.fork_rng at "
                       r".*test_host_random.py:\d+: with torch.random.fork_rng\(enabled=self"):
        monet_opt.optimize(Forked(), torch.randn(4, 16), HUGE, profile_dir=None)
    model = Forked()
    model.forked = False  # fork_rng(enabled=False) sets nothing: eager's alike
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, torch.randn(4, 16), HUGE, profile_dir=None,
                             profile_repeats=1)
    x = torch.randn(4, 16)
    torch.manual_seed(2)
    ours = opt(x)
    torch.manual_seed(2)
    assert torch.equal(ours, eager(x))


def test_random_state_set_in_the_forward_is_refused_naming_the_line():
    """NOTE [Random state set in the forward]: the traced step seeded once, at optimize(), and
    its masks then differed from eager's at every step, silently; torch's own replay of the
    state (checkpointing) is not the model's and is not refused."""
    with pytest.raises(monet_opt.CaptureError, match=r"sets torch's random state:\n  "
                       r"torch.manual_seed at .*test_host_random.py:\d+: torch.manual_seed\(123\)"):
        monet_opt.optimize(Reseeded(True), torch.randn(4, 16), HUGE, profile_dir=None)
    opt = monet_opt.optimize(Reseeded(False), torch.randn(4, 16), HUGE, profile_dir=None,
                             profile_repeats=1)
    opt(torch.randn(4, 16)).sum().backward()


class RandomMasking(nn.Module):
    """MAE's masking (a permutation from torch.rand picks the tokens kept), and noise from
    torch.rand that the backward reads."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.mix, self.out = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x):
        keep = torch.argsort(torch.rand(x.shape[0], x.shape[1]), dim=1)[:, : x.shape[1] // 2]
        h = torch.gather(self.embed(x), 1, keep.unsqueeze(-1).expand(-1, -1, 32))
        for _ in range(3):
            h = h + torch.tanh(self.mix(h)) * torch.rand(h.shape)
        return (self.out(h) - torch.gather(x, 1, keep.unsqueeze(-1).expand(-1, -1, 8))) \
            .square().mean()


def test_torch_draws_given_a_device_recompute_like_eager():
    """torch.rand's op takes a device keyword, which collided with the replay's own argument:
    every plan that recomputed it failed ("got multiple values for argument 'device'")."""
    torch.manual_seed(0)
    model, x = RandomMasking(), torch.randn(4, 64, 8)
    eager = copy.deepcopy(model)
    opt, _ = at_least_peak(model, x)
    assert _recomputed_draws(opt) >= 1
    assert_same_grads(opt, model, eager, x, steps=2, seeded=True)


def _recomputed_draws(opt) -> int:
    """How many torch.rand ops the plan recomputes (its explain() rows)."""
    rows = [line.split() for line in opt.plan.explain().splitlines()]
    return sum(len(r) > 4 and r[1].startswith("rand") and "recomputed" in r for r in rows)


class OwnGenerator(nn.Module):
    """Noise from a torch.Generator the module holds, given to the ops that draw."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.mix, self.out = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 1)
        self.g = torch.Generator().manual_seed(3)

    def forward(self, x):
        h = self.embed(x)
        for _ in range(3):
            keep = torch.bernoulli(torch.full_like(h, 0.6), generator=self.g)
            h = h + torch.tanh(self.mix(h)) * torch.rand(h.shape, generator=self.g) * keep
        return self.out(h).square().mean()


def test_a_generator_given_to_ops_draws_as_in_eager():
    """Profiling drew from the module's generator and recomputation replayed the default one:
    outputs unlike eager's from the first step, silently (NOTE [Generators given to ops])."""
    torch.manual_seed(0)
    model, x = OwnGenerator(), torch.randn(4, 64, 8)
    eager = copy.deepcopy(model)
    opt, _ = at_least_peak(model, x)
    assert _recomputed_draws(opt) >= 2
    assert_same_grads(opt, model, eager, x, steps=3)
    assert torch.equal(model.g.get_state(), eager.g.get_state())


class _Seeded(nn.Module):
    """Noise from a generator the forward seeds (held, or made there): the same each call."""

    def __init__(self, make: bool) -> None:
        super().__init__()
        self.lin, self.make, self.g = nn.Linear(8, 8), make, torch.Generator().manual_seed(0)

    def forward(self, x):
        g = torch.Generator().manual_seed(1) if self.make else self.g.manual_seed(1)
        return self.lin(x) + torch.randn(x.shape, generator=g)


@pytest.mark.parametrize("make, says", [(False, "sets the state of model.g"),
                                        (True, "draws from a torch.Generator no module holds")])
def test_a_generator_seeded_in_the_forward_is_refused(make, says):
    """NOTE [Generators set in the forward]: seeded once at optimize(), the steps drew on from
    it: outputs unlike eager's from the second step, silently. The model's generator is left
    as it was."""
    model = _Seeded(make)
    before = model.g.get_state()
    with pytest.raises(monet_opt.CaptureError, match=f"{says}.*seed it before calling"):
        monet_opt.optimize(model, torch.randn(4, 8), 1 << 40, profile_dir=None)
    assert torch.equal(model.g.get_state(), before)
