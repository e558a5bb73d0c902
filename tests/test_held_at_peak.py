"""NOTE [Held at the peak] (monet_opt/peak_held.py): what a schedule holds at a step, read off
the one simulator, sums to its simulated live bytes; plans and refused limits say it."""
from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

import monet_opt
from monet_opt.peak_held import held_at
from solvers import Problem, Schedule, alive_at, schedule_from_kept, simulate
from tests.problems import autodiff_problem, with_masks
from tests.test_overwrite import _chain
from tests.test_solvers import _accumulating


def _assert_sums(problem: Problem, schedule: Schedule) -> None:
    sim = simulate(problem, schedule)
    plain = problem.with_variants(schedule.variants)
    for k, i in enumerate(sim.steps):
        held = sum(plain.tensors[t].bytes for t, _ in alive_at(problem, schedule, k))
        op = plain.ops[i]
        extra = op.first_extra_bytes if k < len(problem.forward_ops) else op.extra_bytes
        assert problem.fixed_bytes + held + extra == sim.live_bytes[k], k


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 16), seed=st.integers(0, 10**6), keep=st.floats(0.0, 1.0))
def test_what_is_alive_sums_to_the_simulated_bytes(n, seed, keep):
    rng = random.Random(seed)
    p = with_masks(autodiff_problem(n, rng), rng)
    kept = {t for t in p.forward_tensors if rng.random() < keep}
    groups = {}
    for v, variant in enumerate(p.variants):  # at most one variant per read
        if rng.random() < 0.5:
            groups.setdefault(variant.group, v)
    _assert_sums(p, schedule_from_kept(p, kept, frozenset(groups.values())))


def test_an_input_written_into_is_held_once():
    """NOTE [Writing into a dying input]: the ReLU's output sits in its input's storage."""
    problem, schedule = _chain(overwrites=(0,))
    assert [t for t, _ in alive_at(problem, schedule, 1)] == [1]
    _assert_sums(problem, schedule)
    _assert_sums(_accumulating(), Schedule(frozenset({0}), (1, 2, 3)))  # in-place accumulation
    with pytest.raises(IndexError):
        alive_at(problem, schedule, 3)


def test_an_output_written_into_a_dying_input_is_said_so():
    """The workspace is the op's own; what its output shares with its input is said apart."""
    base = _accumulating()
    ops = base.ops[:3] + (dataclasses.replace(base.ops[3], workspace_bytes=50),)
    problem = dataclasses.replace(base, ops=ops)
    schedule = Schedule(frozenset({0}), (1, 2, 3))
    held = held_at(problem, schedule)
    assert held.total_bytes == simulate(problem, schedule).peak_bytes == 230
    assert held.op == "acc, backward" and held.workspace_bytes == 50
    assert "workspace 50 B, less 40 B its output shares with a dying input" in held.text()


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.Tanh(),
                         nn.Linear(256, 256), nn.Sigmoid(), nn.Linear(256, 4))


def test_a_plan_says_what_it_holds_at_its_peak():
    """At store-all and at the least peak (which the profile directory remembers: NOTE [Least
    peaks remembered]), in this test's own directory."""
    model, x = _net(), torch.randn(2048, 64)
    full = monet_opt.optimize(model, x, 1 << 40, profile_repeats=1)
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        monet_opt.optimize(model, x, full.plan.fixed_bytes, profile_repeats=1, time_limit_s=5)
    least = monet_opt.optimize(model, x, info.value.min_feasible_bytes, profile_repeats=1,
                               time_limit_s=5)
    assert least.plan.predicted_peak_bytes < full.plan.predicted_peak_bytes
    for plan in (full.plan, least.plan):
        held = plan.held_at_peak
        assert held.total_bytes == plan.predicted_peak_bytes
        assert held.fixed_bytes == plan.fixed_bytes
        assert held.gradients.bytes <= plan.gradient_bytes
        assert "held there" in plan.explain() and held.text() in plan.explain()
    assert full.plan.held_at_peak.recomputed.tensors == 0  # nothing is recomputed there


def test_a_refused_limit_says_what_the_least_peak_holds():
    model, x = _net(), torch.randn(2048, 64)
    fixed = monet_opt.optimize(model, x, 1 << 40, profile_dir=None,
                               profile_repeats=1).plan.fixed_bytes
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:  # below the parameters' own
        monet_opt.optimize(model, x, fixed, profile_dir=None, profile_repeats=1, time_limit_s=5)
    held = info.value.held
    assert held is not None and held.total_bytes == info.value.min_feasible_bytes
    made = held.total_bytes - held.fixed_bytes - held.gradients.bytes
    assert f"At that peak ({held.op})" in str(info.value)
    assert f"activations and workspace {monet_opt.format_bytes(made)}" in str(info.value)


class _Updated(nn.Module):
    """A buffer the forward updates in place and then reads: a copy is made of it where a plan
    recomputes what reads it (NOTE [Buffers the step updates])."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)
        self.register_buffer("scale", torch.ones(32))

    def forward(self, x):
        h = torch.tanh(self.a(x))
        with torch.no_grad():
            self.scale.mul_(0.9).add_(h.mean(0), alpha=0.1)
        return self.c(torch.tanh(self.b(h * self.scale)))


def test_the_least_peak_is_explained_where_it_makes_fewer_copies():
    """The least peak is that of the copies the least schedule's forward makes (NOTE [Copies
    counted as made]); what it holds was read with every copy counted, so it did not add up and
    the error left "At that peak" out (a tracked InstanceNorm 3D U-Net, sci-ML probe,
    2026-12-07). It is read with the copies made now."""
    torch.manual_seed(0)
    model, x = _Updated(), torch.randn(64, 16)
    least = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                               profile_repeats=1).plan.min_feasible_bytes
    with pytest.raises(monet_opt.InfeasibleBudgetError, match="At that peak") as caught:
        monet_opt.optimize(model, x, least * 9 // 10, profile_dir=None, profile_repeats=1,
                           time_limit_s=3)
    assert caught.value.held is not None
    assert caught.value.held.total_bytes == caught.value.min_feasible_bytes


@pytest.mark.parametrize("solver", ["checkmate", "store_all", "chen"])
def test_a_solver_with_no_least_schedule_refuses_plainly(solver):
    """A named solver that reports no least-peak schedule raised AttributeError ('bool' object
    has no attribute 'total_bytes') where it should refuse the limit (reorder probe)."""
    torch.manual_seed(0)
    model, x = _Updated(), torch.randn(64, 16)
    with pytest.raises(monet_opt.InfeasibleBudgetError, match="is below the least peak"):
        monet_opt.optimize(model, x, 1000, solver=solver, profile_dir=None, profile_repeats=1,
                           time_limit_s=3)
