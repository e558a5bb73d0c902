"""A cached profile is served to the graph it was made from (check_structure in
monet_opt/cache_checks.py), also where the profiler withdrew operator variants or raised
outputs' bytes, and to no other graph."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt import measured
from monet_opt.cache_checks import Unusable, check_structure
from tests.problems import masked_chain


def _masked():
    return masked_chain(5)


def test_a_profile_with_variants_withdrawn_matches_its_graph():
    fresh = _masked()
    measured = dataclasses.replace(fresh, variants=tuple(
        dataclasses.replace(v, extra_time_s=v.extra_time_s + 1.0) for v in fresh.variants))
    check_structure(measured.only_variants({0, 2}), fresh)
    check_structure(measured, fresh)


def test_a_profile_of_another_graph_is_refused():
    fresh = _masked()
    renamed = dataclasses.replace(fresh, variants=(
        dataclasses.replace(fresh.variants[0], name="other"),) + fresh.variants[1:])
    with pytest.raises(Unusable, match="operator variants"):
        check_structure(renamed, fresh)
    moved = dataclasses.replace(fresh, variants=(
        dataclasses.replace(fresh.variants[0], reads=()),) + fresh.variants[1:])
    with pytest.raises(Unusable, match="operator variants"):
        check_structure(moved, fresh)
    smaller = dataclasses.replace(fresh, tensors=(
        dataclasses.replace(fresh.tensors[0], bytes=fresh.tensors[0].bytes - 1),)
        + fresh.tensors[1:])
    with pytest.raises(Unusable, match="tensor sizes"):
        check_structure(smaller, fresh)


def test_a_step_with_a_variant_withdrawn_is_served_from_the_directory(monkeypatch):
    """The profiler withdraws a variant that is not exact on the device (here: every ReLU
    mask, as if it were not) or that its time limit left unmeasured; the encode ops of those
    then read nothing. Compared with the freshly lowered graph, which still offers them, the
    profile never matched: every optimize() warned and profiled again."""
    acceptable, profiled = measured.acceptable, []
    monkeypatch.setattr(measured, "acceptable", lambda site, *a: not site.family.startswith(
        "relu.") and acceptable(site, *a))
    profile = measured.profile
    monkeypatch.setattr(measured, "profile", lambda *a, **k: profiled.append(1) or profile(*a, **k))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 4))
    x = torch.randn(512, 16)
    with pytest.warns(RuntimeWarning, match="did not reproduce"):
        first = monet_opt.optimize(model, x, 1 << 40, profile_repeats=1)
    assert profiled == [1] and not any(v.startswith("relu.") for v in first.plan.variants)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = monet_opt.optimize(model, x, 1 << 40, profile_repeats=1)
    assert profiled == [1] and again.plan == first.plan


def test_a_folder_that_cannot_be_searched(tmp_path, monkeypatch):
    """A profile folder the user may not search (mode 600 as another user): optimize() went on
    from profiling to a PermissionError where it looked for stale files. Now it plans, the
    files it cannot write warned of, as for a folder it cannot write."""
    import pathlib

    glob = pathlib.Path.glob

    def refused(self, pattern):
        if self.is_relative_to(tmp_path):
            raise PermissionError(13, "Permission denied", str(self))
        return glob(self, pattern)

    monkeypatch.setattr(pathlib.Path, "glob", refused)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = monet_opt.optimize(model, torch.randn(4, 8), 1 << 40, profile_dir=tmp_path,
                             profile_repeats=1)
    opt(torch.randn(4, 8)).sum().backward()
    assert model[0].weight.grad is not None
