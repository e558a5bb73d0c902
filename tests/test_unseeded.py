"""NOTE [Outputs beside the loss] (monet_opt/unseeded.py): the logits a step returns beside
its loss are planned as handed no gradient, as `loss.backward()` hands them none."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import monet_opt
from tests.test_executor import HUGE

VOCAB, BATCH, TOKENS = 4000, 2, 64
LOGITS_BYTES = BATCH * TOKENS * VOCAB * 4


class LanguageModel(nn.Module):
    """nanoGPT's form: (loss, logits), the logits the largest tensor of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.hidden = nn.Embedding(VOCAB, 32), nn.Linear(32, 32)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor):
        logits = self.head(torch.tanh(self.hidden(self.embed(ids))))
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        return loss, logits.float()  # the cast is a no-op but under autocast (accelerate's)


class LossOnly(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(ids, labels)[0]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(torch.randint(0, VOCAB, (BATCH, TOKENS)) for _ in range(2))


def _least(model: nn.Module, batch) -> monet_opt.OptimizedModule:
    full = monet_opt.optimize(model, batch, HUGE, profile_repeats=1, profile_dir=None)
    return monet_opt.optimize(model, batch, full.plan.min_feasible_bytes, profile_repeats=1,
                              profile_dir=None, time_limit_s=5)


@pytest.mark.parametrize("autocast", [False, True])
def test_logits_beside_the_loss_cost_no_more_than_the_loss_alone(autocast):
    """The least peak is the loss-only module's (before: one logits-sized tensor more, zeros
    made for the gradient the logits were not handed), and it measures its prediction with
    eager's gradients. Under autocast the float32 logits returned are a cast of bfloat16 ones,
    whose gradient is cast back before it is added (accelerate's outputs alike)."""
    torch.manual_seed(0)
    model, batch = LanguageModel(), _batch()
    eager = copy.deepcopy(model)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        alone = _least(LossOnly(copy.deepcopy(model)), batch).plan.predicted_peak_bytes
        least = _least(model, batch)
        loss = least(*batch)[0]
    if not autocast:  # under it the model makes a float32 copy of its logits besides
        assert abs(least.plan.predicted_peak_bytes - alone) <= 4  # before: + LOGITS_BYTES
    del loss
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        measured = monet_opt.measure_peak(lambda: least(*batch)[0].backward(),
                                          monet_opt.resident_tensors(model, batch))
        eager_loss = eager(*batch)[0]
    assert 0 <= least.plan.predicted_peak_bytes - measured <= 8  # NOTE [The loss scalar]
    eager_loss.backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                             eager.parameters()))


def test_logits_handed_a_gradient_after_all_are_added_in_and_warned_about():
    """A loss that reads the logits outside the step too gets eager's gradients, and a warning
    that this step can peak over its plan by the logits' gradient."""
    torch.manual_seed(0)
    model, batch = LanguageModel(), _batch()
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, batch, HUGE, profile_repeats=1, profile_dir=None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loss, logits = opt(*batch)
        (loss + logits.square().mean()).backward()
    said = [str(w.message) for w in seen if "beside the loss" in str(w.message)]
    assert len(said) == 1 and f"{LOGITS_BYTES:,} B gradient" in said[0]
    loss, logits = eager(*batch)
    (loss + logits.square().mean()).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                             eager.parameters()))


class Features(nn.Module):
    """A loss beside the feature maps it reads, as output_hidden_states returns them: `h`'s
    gradient adds `g`'s branch into one the head's branch still reads (GPT-2's residual
    stream alike), or, with `copied`, h's and its copy's into each other."""

    def __init__(self, copied: bool) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 10)
        self.copied = copied

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        h = torch.tanh(self.a(x))
        g = h.clone() if self.copied else torch.tanh(self.b(h))
        return F.cross_entropy(self.head(h + g), y), h, g


@pytest.mark.parametrize("copied", [False, True])
def test_features_beside_the_loss_get_eager_s_gradients(copied):
    """NOTE [A sum is a tensor of its own]: handed on itself, the branch's gradient was written
    into in place while still read (3 of 6 gradients wrong); two such outputs added to each
    other failed to compile (a SyntaxError in the backward's code)."""
    torch.manual_seed(0)
    model = Features(copied)
    eager = copy.deepcopy(model)
    x, y = torch.randn(8, 16), torch.randint(0, 10, (8,))
    opt = monet_opt.optimize(model, (x, y), HUGE, profile_repeats=1, profile_dir=None)
    opt(x, y)[0].backward()
    eager(x, y)[0].backward()
    assert all(p.grad is q.grad is None or torch.equal(p.grad, q.grad)  # b: unused if copied
               for p, q in zip(model.parameters(), eager.parameters()))


class Reshaped(nn.Module):
    """Intermediates beside the loss whose gradient sums are laid out otherwise: `h`'s comes
    back transposed and the traced sum is contiguous ("transposed"); `h`'s bfloat16 cast
    returned where h's gradient is a sum the plan may write into the cast's ("cast")."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)
        self.w = nn.Parameter(torch.randn(4, 6))
        self.kind = kind

    def forward(self, x: torch.Tensor):
        h = self.a(x)
        if self.kind == "transposed":
            return torch.matmul(h.transpose(1, 2), self.w).pow(2).mean(), h
        return (h + self.b(h)).pow(2).mean(), h.to(torch.bfloat16)


@pytest.mark.parametrize("kind", ["transposed", "cast"])
def test_intermediates_laid_out_otherwise_train_as_eager(kind):
    """NOTE [A sum is a tensor of its own]: the copy handed on kept the operand's transposed
    strides and the backward's view of it failed; the cast's 0 bytes the plan was to write
    the sum into were refused as an invalid problem."""
    torch.manual_seed(0)
    model = Reshaped(kind)
    eager = copy.deepcopy(model)
    x = torch.randn(2, 4, 32)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    opt(x)[0].backward()
    eager(x)[0].backward()
    assert all(p.grad is q.grad is None or torch.equal(p.grad, q.grad)
               for p, q in zip(model.parameters(), eager.parameters()))
