"""NOTE [Unread recomputation] (solvers/prune.py): a schedule that recomputes something nobody
reads runs at its prediction, since what reaches the executor has no such step; the executor
refuses a schedule that would leave it holding a saved tensor nobody reads."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import monet_opt
import solvers
from tests.test_executor import HUGE


class _Dropped(nn.Module):
    """z = lin1(x); dropout; relu; a wide lin2 whose gradient is made last (NOTE [Results made
    late]), so that the step peaks at its end."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(64, 256), nn.Linear(256, 256)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.lin2(torch.relu(self.drop(self.lin1(x))))


def _padded(real):
    """solvers.solve, with the dropout's backward replaying its generator state (NOTE
    [Generator-state replay]) and the dropout recomputed at the backward's start from its
    input, kept for that alone: nothing reads what it makes, and the simulator frees the input
    there. The schedule is store-all otherwise."""
    def solve(problem, budget, *args, **kwargs):
        r = real(problem, budget, *args, **kwargs)
        v = next(k for k, v in enumerate(problem.variants) if v.name.startswith("dropout.replay"))
        plain = problem.with_variants({v})
        i = next(i for i in plain.forward_ops if plain.ops[i].is_random)
        t = plain.ops[i].inputs[0]
        read = {u for k in plain.backward_ops for u in plain.ops[k].inputs}
        assert t not in read and read.isdisjoint(plain.ops[i].outputs)
        s = solvers.schedule_from_kept(problem, plain.saved_for_backward, frozenset({v}))
        s = dataclasses.replace(s, kept=s.kept | {t}, backward=(i,) + s.backward)
        sim = solvers.simulate(problem, s)
        return dataclasses.replace(r, schedule=s, peak_bytes=sim.peak_bytes,
                                   objective_s=sim.time_s)
    return solve


def _run(x):
    torch.manual_seed(0)
    model = _Dropped()
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None)
    model.zero_grad(set_to_none=True)
    peak = monet_opt.measure_peak(lambda: opt(x).sum().backward(),
                                  monet_opt.resident_tensors(model, x))
    return opt.plan, peak


def test_an_unread_recomputation_runs_at_its_prediction(monkeypatch):
    """Before, the executor dropped the step but still saved its input and held it to the
    step's end, over the prediction by that input's bytes."""
    x = torch.randn(8, 64)
    monkeypatch.setattr(solvers, "solve", _padded(solvers.solve))
    plan, peak = _run(x)
    assert plan.recomputed_ops == 0 and peak == plan.predicted_peak_bytes


def test_the_executor_refuses_a_saved_tensor_nobody_reads(monkeypatch):
    monkeypatch.setattr(solvers, "solve", _padded(solvers.solve))
    monkeypatch.setattr(solvers, "without_unread", lambda problem, result, *budget: result)
    with pytest.raises(monet_opt.errors.InternalError, match="reads none of them"):
        _run(torch.randn(8, 64))
