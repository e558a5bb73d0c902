"""A random op whose result nothing reads: eager draws it all the same, and so does the step
(rewrite._read_unread_results; every optimize() of such a model failed in torch's partitioner:
"Expected native_dropout_default to be a tensor")."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40


class _UnreadBranch(nn.Module):
    """Three embeddings, the loss reading two: the third's dropout draws, unread."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.drop = nn.Linear(16, 32), nn.Dropout(0.3)
        self.head = nn.Linear(32, 32)

    def forward(self, a, b, c):
        ea, eb, _ = (self.head(self.drop(torch.tanh(self.embed(t)))) for t in (a, b, c))
        return nn.functional.cosine_embedding_loss(ea, eb, torch.ones(a.shape[0]))


@pytest.mark.parametrize("limit", ["least", HUGE])
def test_an_unread_dropout_draws_as_eager_and_trains_bitwise(limit):
    torch.manual_seed(0)
    model, inputs = _UnreadBranch(), tuple(torch.randn(8, 16) for _ in range(3))
    eager = copy.deepcopy(model)
    if limit == "least":
        limit = monet_opt.optimize(copy.deepcopy(model), inputs, HUGE, profile_dir=None,
                                   time_limit_s=5).plan.min_feasible_bytes
    opt = monet_opt.optimize(model, inputs, limit, profile_dir=None, time_limit_s=5)
    for step in range(2):
        states = []
        for module in (opt, eager):
            torch.manual_seed(step)
            module(*inputs).backward()
            states.append(torch.get_rng_state())
        assert torch.equal(*states)  # the unread mask was drawn, as eager draws it
        for p, q in zip(model.parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad)
            p.grad = q.grad = None
    peak = monet_opt.measure_peak(lambda: opt(*inputs).backward(),
                                  monet_opt.resident_tensors(model, inputs))
    assert peak <= opt.plan.memory_limit_bytes
