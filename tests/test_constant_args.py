"""Numbers, flags, strings and None passed to the forward are constants of the step: another value
plans a step for it (NOTE [Constant arguments] in monet_opt/input_spec.py); they were refused."""
from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt.module import ReplanWarning

HUGE = 1 << 40


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f, self.drop = nn.Linear(16, 16), nn.Dropout(0.2)

    def forward(self, x, scale=1.0, act="tanh"):
        y = self.drop(self.f(x)) * scale
        return torch.tanh(y) if act == "tanh" else torch.relu(y)


def _step(module, owner, args, kwargs, seed):
    owner.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = module(*args, **kwargs)
    out.sum().backward()
    return out.detach(), [p.grad.clone() for p in owner.parameters()]


def test_constant_arguments_plan_a_step_each_and_train_like_eager():
    torch.manual_seed(0)
    model, x = Scaled().train(), torch.randn(4, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, (x, 2.0), HUGE, profile_dir=None, profile_repeats=1)
    calls = [((x, 2.0), {}, None), ((x, 3.0), {}, r"float32\[4x16\], 3\.0"),
             ((x, 2.0), {"act": "relu"}, r"act='relu'"), ((x, 2.0), {}, None),
             ((x, 2), {}, r"float32\[4x16\], 2 "),  # an int traces apart from a float
             ((x, 2.0), {"act": None}, r"act=None")]  # None is a leaf too
    for seed, (args, kwargs, replanned) in enumerate(calls):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = _step(opt, model, args, kwargs, seed)
        expected = _step(eager, eager, args, kwargs, seed)
        assert torch.equal(ours[0], expected[0])
        assert all(torch.equal(a, b) for a, b in zip(ours[1], expected[1]))
        replans = [str(w.message) for w in caught if issubclass(w.category, ReplanWarning)]
        assert len(replans) == (replanned is not None)
        if replanned:
            assert any(re.search(replanned, r) for r in replans)
            # a count passed as a number makes a plan per value (HF's num_items_in_batch as
            # an int: every step planned anew, with nothing said of the tensor that avoids it)
            assert all("pass it as a tensor (torch.tensor(n))" in r and "picks the code run "
                       "(a task's head, a branch) cannot be a tensor" in r for r in replans)


def test_another_constant_is_refused_when_asked():
    model, x = Scaled().train(), torch.randn(4, 16)
    opt = monet_opt.optimize(model, (x, 2.0), HUGE, profile_dir=None, profile_repeats=1,
                             new_shapes="error")
    with pytest.raises(monet_opt.PlanMismatchError, match=r"planned for inputs structured as "
                       r"\(float32\[4x16\], 2.0\) but was called with \(float32\[4x16\], 3.0\)"):
        opt(x, 3.0)


def test_a_nan_is_one_constant_whatever_object():
    """NOTE [NaN as a constant]: a fresh float("nan") at each call planned a step at each."""
    torch.manual_seed(0)
    model, x = Scaled().eval(), torch.randn(4, 16)
    opt = monet_opt.optimize(model, (x, float("nan")), HUGE, profile_dir=None,
                             profile_repeats=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplanWarning)
        for _ in range(3):
            out = opt(x, float("nan"))
            out.sum().backward()
            model.zero_grad(set_to_none=True)
    assert len(opt.plans) == 1 and out.isnan().all()
    with pytest.warns(ReplanWarning):
        opt(x, -float("nan")).sum().backward()  # its sign is another constant
    assert len(opt.plans) == 2


def test_other_arguments_are_refused_saying_what_to_do():
    model, x = Scaled().train(), torch.randn(4, 16)
    with pytest.raises(TypeError, match=r"bool, int, float, str or None .*found \['object'\]"):
        monet_opt.optimize(model, (x, object()), HUGE, profile_dir=None)


def test_a_list_of_numbers_is_described_as_it_is():
    """A plan's label (and a ReplanWarning's) showed a list of ints as "()"."""
    from monet_opt.cache_keys import describe_inputs
    x = torch.zeros(2, 3)
    assert describe_inputs((x, [2], (x, 1)), {"k": (1, 2)}) == \
        "float32[2x3], [2], (float32[2x3]), k=(1, 2)"
    assert describe_inputs((list(range(40)),), {}).endswith("...")


class _Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(16, 8)

    def forward(self, x, mask=None, *, scale=1.0):
        return self.f(x) * mask * scale if mask is not None else self.f(x)


def test_the_same_arguments_by_position_or_keyword_run_the_samples_plan():
    """NOTE [Arguments passed as the sample's]: after a sample of keywords, opt(x, mask=mask)
    and opt(x, mask) planned the step again, with a ReplanWarning saying the inputs changed."""
    torch.manual_seed(0)
    model, x, mask = _Masked(), torch.randn(4, 16), torch.rand(4, 8)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, {"mask": mask, "x": x}, HUGE, profile_dir=None)
    calls = (((x, mask), {}), ((x,), {"mask": mask}), ((), {"x": x, "mask": mask}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplanWarning)
        for args, kwargs in calls:
            assert all(torch.equal(a, b) for a, b in zip(
                _step(opt, model, args, kwargs, 0)[1], _step(eager, eager, args, kwargs, 0)[1]))
    assert len(opt.plans) == 1
    with pytest.warns(ReplanWarning):  # another argument is another step
        opt(x, mask, scale=2.0)


def test_a_model_hooked_sees_the_call_as_written():
    """A forward pre-hook sees the call's own form, so that form is planned."""
    torch.manual_seed(0)
    model, x, mask = _Masked(), torch.randn(4, 16), torch.rand(4, 8)
    seen = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(len(args)))
    opt = monet_opt.optimize(model, {"mask": mask, "x": x}, HUGE, profile_dir=None)
    with pytest.warns(ReplanWarning, match="Each structure of inputs"):
        opt(x, mask).sum().backward()
    assert seen[-1] == 2


def test_an_hf_model_called_by_position_runs_the_plan_of_its_keywords():
    """HF's forwards take **kwargs: an argument binding to a named parameter is passed as the
    sample passed it all the same."""
    from tests import models
    torch.manual_seed(0)
    model, x, _ = models.gpt2_tiny()
    opt = monet_opt.optimize(model, {"input_ids": x["input_ids"]}, HUGE, profile_dir=None,
                             profile_repeats=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplanWarning)
        opt(x["input_ids"]).logits.sum().backward()
    assert len(opt.plans) == 1
