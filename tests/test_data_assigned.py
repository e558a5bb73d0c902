"""NOTE [Parameters assigned through .data] (monet_opt/data_assigned.py): a forward that moves
parameters by assigning their `.data` (MoCo's momentum encoder) trains like eager."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import monet_opt
from tests.records import assert_same, at_least_peak

HUGE = 1 << 40


def _encoder() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 16))


class MoCo(nn.Module):
    """MoCo's forward, as its authors wrote it: the key encoder moved toward the query encoder
    by `.data` assignment, the keys enqueued (with tensor indices: `int(queue_ptr)` does not
    trace), the contrastive loss returned."""

    def __init__(self, queue: int = 64, m: float = 0.99) -> None:
        super().__init__()
        self.m, self.size = m, queue
        self.encoder_q, self.encoder_k = _encoder(), _encoder()
        for q, k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            k.data.copy_(q.data)
            k.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(16, queue), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
                pk.data = pk.data * self.m + pq.data * (1.0 - self.m)
            k = F.normalize(self.encoder_k(im_k), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone()], dim=1) / 0.1
        with torch.no_grad():
            at = (self.queue_ptr + torch.arange(k.shape[0])) % self.size
            self.queue.index_copy_(1, at, k.T.contiguous())
            self.queue_ptr.add_(k.shape[0]).remainder_(self.size)
        return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))


def _train(module, net, batches):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    record = []
    for a, b in batches:
        loss = module(a, b)
        loss.backward()
        record.append({"loss": loss.detach(), **{n: p.grad.clone() for n, p in
                                                 net.named_parameters() if p.grad is not None}})
        opt.step()
        opt.zero_grad(set_to_none=True)
    return record, {k: v.clone() for k, v in net.state_dict().items()}


def test_a_momentum_encoder_moved_through_data_trains_like_eager():
    """Three steps at the least plan bitwise eager's, the key encoder and the queue too. The
    assignment left no op in the traced step: the key encoder never moved, and every
    parameter drifted from eager's from the first step, silently."""
    torch.manual_seed(0)
    model = MoCo()
    eager = copy.deepcopy(model)
    sample = (torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16))
    opt, _ = at_least_peak(model, sample)
    assert torch.equal(model.encoder_k[0].weight, eager.encoder_k[0].weight)  # not moved yet
    batches = [(torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16)) for _ in range(3)]
    assert_same(_train(opt, model, batches), _train(eager, eager, batches), exact=True)
    assert not torch.equal(model.encoder_k[0].weight, model.encoder_q[0].weight)


class Resized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.fc.bias.data = torch.zeros(2)
        return self.fc(x)


def test_data_of_another_shape_is_refused():
    with pytest.raises(monet_opt.CaptureError, match=r"assigns a torch.float32 \[2\] tensor to "
                       r"'fc.bias'.data \(torch.float32 \[4\]\).*update it in place"):
        monet_opt.optimize(Resized(), torch.randn(2, 4), HUGE, profile_dir=None,
                           profile_repeats=1)
