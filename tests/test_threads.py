"""NOTE [Patches other threads see]: what optimize() patches while it traces (classes' forwards,
the checkpoint's apply, global module hooks) acts on the tracing thread alone. Another thread
stepping meanwhile is run from inside the traced forward, so that it steps during the trace
every time, not by chance."""
from __future__ import annotations

import copy
import threading

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import monet_opt

HUGE = 1 << 40


class _Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU())

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)


class _SteppingOthers(nn.Module):
    """Each forward (while optimize() traces it) runs `step` in another thread, to its end."""

    def __init__(self, step) -> None:
        super().__init__()
        self.l, self.step, self.ran = nn.Linear(8, 8), step, 0

    def forward(self, x):
        other = threading.Thread(target=self.step, daemon=True)
        other.start()
        other.join(timeout=30)
        assert not other.is_alive(), "the other thread's step did not end"
        self.ran += 1
        return self.l(x).relu()


def _trace_while(step) -> int:
    """How often `step` ran in another thread while optimize() traced a model."""
    model = _SteppingOthers(step)
    monet_opt.optimize(model, torch.randn(4, 8), HUGE, profile_dir=None, profile_repeats=1)
    return model.ran


def test_an_eager_model_in_another_thread_updates_its_statistics_as_alone():
    """Eager BatchNorm in a checkpoint in another thread: its statistics were updated twice more
    a step while optimize() traced (num_batches_tracked 4,769 where alone 3,198)."""
    torch.manual_seed(0)
    model, x = _Checkpointed(), torch.randn(4, 8)
    alone = copy.deepcopy(model)
    ran = _trace_while(lambda: model(x).sum().backward())
    assert ran >= 1
    for _ in range(ran):
        alone(x).sum().backward()
    norm, eager = model.block[1], alone.block[1]
    assert norm.num_batches_tracked.item() == eager.num_batches_tracked.item() == 2 * ran
    assert torch.equal(norm.running_mean, eager.running_mean)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           alone.parameters()))


def test_an_optimized_module_in_another_thread_plans_nothing_new():
    """An optimized module stepping in another thread saw the trace's global hooks and its
    BatchNorm class's forward replaced, and planned a step again each time."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU()), torch.randn(4, 8)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)

    def step():
        model.zero_grad(set_to_none=True)  # else the next step begins with gradients in place
        opt(x).sum().backward()
    assert _trace_while(step) >= 1
    assert len(opt.plans) == 1, list(opt.plans)
