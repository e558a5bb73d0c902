"""NOTE [Collectives in the forward] (monet_opt/collectives.py): a forward that all-reduces its
activations (tensor parallelism) had its collectives recomputed, a different number on each
rank: the ranks' collectives paired up wrongly and the gradients were silently off. Now a
collective's outputs are held, so each step issues the forward's collectives once, at every
limit, and trains bitwise like eager. Run in one gloo process (two ranks: tests/test_ddp.py's
way would take a minute more)."""
from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

import monet_opt
from solvers import registry
from solvers.milp import MilpOptions
from tests.test_ddp import _free_port
from tests.test_random_schedules import _random_solver


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x):
        h = funcol.all_reduce(torch.tanh(self.lin(x)), "avg", dist.group.WORLD)
        return torch.sin(h) * h


@pytest.fixture
def world():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield dist.distributed_c10d._get_default_group()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_collective_is_never_recomputed(world, monkeypatch, seed):
    """Schedules keeping a random part of what the backward reads (tests/test_random_schedules.py)
    recompute the rest, the collectives' readers among it."""
    monkeypatch.setitem(registry._REGISTRY, "milp", (_random_solver(seed), MilpOptions))
    torch.manual_seed(0)
    model, x = nn.Sequential(*[_Block() for _ in range(4)], nn.Linear(32, 4)), torch.randn(64, 32)
    eager = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = monet_opt.optimize(model, x, 1 << 30, solver="milp", profile_dir=None,
                                 profile_repeats=1)
    assert opt.plan.recomputed_ops > 0
    for _ in range(2):
        issued = []
        for module in (opt, eager):
            module.zero_grad(set_to_none=True)
            before = world._get_sequence_number_for_group()
            module(x).square().sum().backward()
            issued.append(world._get_sequence_number_for_group() - before)
        assert issued[0] == issued[1] > 0  # the forward's collectives, once
        for p, q in zip(model.parameters(), eager.parameters()):
            assert torch.equal(p.grad, q.grad)


class _StatSync(nn.Module):
    """A statistic all-reduced with c10d's in-place collective, no gradient through it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("mean", torch.zeros(8))

    def forward(self, x):
        h = self.lin(x)
        stat = h.detach().mean(0).clone()
        dist.all_reduce(stat)
        self.mean.mul_(0.9).add_(stat, alpha=0.1)
        return h


def test_a_c10d_collective_is_refused_as_one(world):
    """NOTE [Collectives drawn as random] (monet_opt/host_random.py): tracing it draws a work
    id from Python's random in torch's code, and it was refused as the forward's own random
    draw, advised to draw with torch."""
    with pytest.raises(monet_opt.CaptureError, match="(?s)calls a torch.distributed collective:"
                       ".*functional collectives"):
        monet_opt.optimize(_StatSync(), torch.randn(4, 8), 1 << 30, profile_dir=None,
                           profile_repeats=1)
