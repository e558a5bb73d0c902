"""NOTE [Writing into a dying input] (solvers/simulate.py): a ReLU or residual add whose input
dies at it writes into that input, as eager's `relu_` and `out += identity` do; the simulator
decides where, the executor runs exactly there, and training stays bitwise eager's."""
from __future__ import annotations

import collections
import copy
import random

import pytest
import torch
from torch import nn

import monet_opt
from solvers import (InvalidProblemError, Op, Problem, Schedule, Tensor, schedule_from_kept,
                     simulate)
from tests import models, problems
from tests.test_executor import HUGE, assert_same, run_steps

MB = 1 << 20


def _chain(overwrites: tuple[int, ...], kept_a: bool = False,
           forward_reader: bool = False) -> tuple[Problem, Schedule]:
    """a = f(); b = relu(a) (may overwrite a); [c = h(a)]; the backward reads b, and a where
    it is kept."""
    tensors = [Tensor("a", 4 * MB, 0), Tensor("b", 4 * MB, 1), Tensor("g", 1 * MB, 2)]
    ops = [Op("f", False, 1.0, (), (0,)), Op("relu", False, 1.0, (0,), (1,), overwrites=overwrites)]
    if forward_reader:
        tensors[2:2] = [Tensor("c", MB, 2)]
        tensors[3] = Tensor("g", MB, 3)
        ops.append(Op("h", False, 1.0, (0,), (2,)))
    g = len(tensors) - 1
    ops.append(Op("relu_bwd", True, 1.0, (1, 0) if kept_a else (1,), (g,)))
    problem = Problem(ops=tuple(ops), tensors=tuple(tensors), fixed_bytes=0, backward_outputs=(g,))
    return problem, Schedule(kept=frozenset({1, 0} if kept_a else {1}),
                             backward=(len(ops) - 1,))


def test_simulator_writes_into_an_input_only_where_it_dies():
    problem, schedule = _chain(overwrites=(0,))
    sim = simulate(problem, schedule)
    assert sim.overwrites == ((1, 0),)
    assert sim.live_bytes[1] == 4 * MB  # a's storage holds b
    plain = simulate(*_chain(overwrites=()))
    assert plain.overwrites == () and plain.live_bytes[1] == 8 * MB
    for dies_later in (_chain((0,), kept_a=True), _chain((0,), forward_reader=True)):
        sim = simulate(*dies_later)
        assert sim.overwrites == () and sim.live_bytes[1] == 8 * MB


def test_simulator_never_writes_into_a_forward_output():
    problem, schedule = _chain(overwrites=(0,))
    returned = Problem(ops=problem.ops, tensors=problem.tensors, fixed_bytes=0,
                       forward_outputs=(0,), backward_outputs=(2,))
    assert simulate(returned, schedule).overwrites == ()


def test_only_forward_ops_may_overwrite_an_input_of_their_output_size():
    problem, _ = _chain(overwrites=(0,))
    bad_size = problem.tensors[:1] + (Tensor("b", 2 * MB, 1),) + problem.tensors[2:]
    with pytest.raises(InvalidProblemError, match="Writing into a dying input"):
        Problem(ops=problem.ops, tensors=bad_size, fixed_bytes=0, backward_outputs=(2,))
    backward = problem.ops[:2] + (Op("relu_bwd", True, 1.0, (1,), (2,), overwrites=(1,)),)
    with pytest.raises(InvalidProblemError, match="Writing into a dying input"):
        Problem(ops=backward, tensors=problem.tensors, fixed_bytes=0, backward_outputs=(2,))


def _aten_calls(step) -> collections.Counter:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    return collections.Counter(e.name for e in prof.events())


@pytest.mark.parametrize("at", [None, 0.2])
def test_resnet_relus_and_adds_run_in_place_bitwise_within_the_prediction(at):
    """Store-all and a tight plan (recomputed ReLUs overwrite recomputed inputs): the step runs
    relu_ and add_, measures its prediction to the byte and trains bitwise like eager."""
    torch.manual_seed(0)
    base, _, loss_fn = models.resnet18_small()
    x = torch.randn(8, 3, 96, 96)  # activations enough of the peak to recompute some
    full = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, profile_dir=None)
    limit = HUGE
    if at is not None:  # this far from the least peak to store-all (NOTE [Limits between the
        p = full.plan   # least peak and store-all] in tests/limits.py)
        limit = p.min_feasible_bytes + int(at * (p.store_all_peak_bytes - p.min_feasible_bytes))
    opt = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1, profile_dir=None,
                             time_limit_s=5)
    step = lambda: loss_fn(opt(x)).backward()  # noqa: E731
    calls = _aten_calls(step)
    assert {"aten::relu_", "aten::add_"} <= set(calls)
    # every relu_ is an overwrite; add_ also sums gradients (NOTE [In-place accumulation])
    assert calls["aten::relu_"] < opt.plan.in_place_runs <= calls["aten::relu_"] + \
        calls["aten::add_"]
    assert f"in place          {opt.plan.in_place_runs} op runs" in opt.plan.explain()
    opt.model.zero_grad(set_to_none=True)
    peak = monet_opt.measure_peak(step, monet_opt.resident_tensors(opt.model, x))
    assert peak == opt.plan.predicted_peak_bytes <= limit
    opt.model.zero_grad(set_to_none=True)
    eager = copy.deepcopy(base)
    for _ in range(2):  # the same two steps' BatchNorm statistics as above
        loss_fn(eager(x)).backward()
    eager.zero_grad(set_to_none=True)
    assert_same(run_steps(opt, opt.model, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                exact=True, what="in-place ReLUs and adds vs eager")


class ReadAfter(nn.Module):
    """h is read after its ReLU: the ReLU must not write into it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        h = self.fc(x)
        return torch.relu(h) * h + torch.relu(h + 1.0)


def test_an_input_read_later_is_not_overwritten():
    torch.manual_seed(0)
    base, x = ReadAfter(), torch.randn(8, 64)
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, profile_dir=None)
    loss_fn = lambda out: out.sum()  # noqa: E731
    eager = copy.deepcopy(base)
    assert_same(run_steps(opt, opt.model, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                exact=True, what="ReLU of a tensor read after it")


def _dies_at(problem: Problem, steps: tuple[int, ...], k: int, t: int) -> bool:
    """Step k reads the copy of t that no later step reads before t is made again, made in
    k's phase, and t is no forward output: NOTE [Writing into a dying input], said directly."""
    n_fwd = len(problem.forward_ops)
    made = max(j for j in range(k) if t in problem.ops[steps[j]].outputs)
    for j in range(k + 1, len(steps)):
        if t in problem.ops[steps[j]].outputs:
            break
        if t in problem.ops[steps[j]].inputs:
            return False
    return (made < n_fwd) == (k < n_fwd) and t not in problem.forward_outputs


@pytest.mark.parametrize("seed", range(12))
def test_random_schedules_overwrite_exactly_where_an_input_dies(seed):
    rng = random.Random(seed)
    free, plain = problems.with_overwrites(problems.autodiff_problem(14, rng), rng)
    forward = list(free.forward_tensors)
    for _ in range(6):
        schedule = schedule_from_kept(free, frozenset(rng.sample(forward, rng.randint(0, 14))))
        got, base = simulate(free, schedule), simulate(plain, schedule)
        expected = []
        for k, i in enumerate(got.steps):
            dying = [t for t in free.ops[i].overwrites if _dies_at(free, got.steps, k, t)]
            if dying:
                expected.append((k, dying[0]))
        assert got.overwrites == tuple(expected)
        assert got.time_s == base.time_s
        saved = dict(got.overwrites)
        assert [b - g for b, g in zip(base.live_bytes, got.live_bytes)] == \
            [free.tensors[saved[k]].bytes if k in saved else 0 for k in range(len(got.steps))]
