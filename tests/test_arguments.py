"""optimize()'s plain arguments: each wrong one named before anything is traced
(monet_opt/arguments.py), and the forms taken."""
from __future__ import annotations

import math

import pytest
import torch

import monet_opt
from tests import models

HUGE = 1 << 40


@pytest.mark.parametrize("argument, bad, error", [
    ("variants", "relu.bool_mask", TypeError), ("variants", None, TypeError),
    ("time_limit_s", "30", ValueError), ("time_limit_s", None, ValueError),
    ("time_limit_s", math.nan, ValueError), ("profile_time_limit_s", "60", ValueError),
    ("profile_repeats", 0, ValueError), ("profile_repeats", 1.5, ValueError),
])
def test_optimize_names_a_wrong_argument(argument, bad, error):
    """Each was split into characters, not iterable, a failed comparison, taken (0 repeats) or
    blamed on the model (1.5), before monet_opt/arguments.py."""
    model, x, _ = models.small_cnn()
    with pytest.raises(error, match=f"monet_opt.optimize: {argument} must be"):
        monet_opt.optimize(model, x, HUGE, profile_dir=None, **{argument: bad})


@pytest.mark.parametrize("bad", ["", "  ", 5, False, b"profiles"])
def test_a_profile_dir_that_is_no_path_is_refused(bad):
    """"" cached into the working directory; 5 and bytes failed in pathlib."""
    model, x, _ = models.small_cnn()
    with pytest.raises(TypeError, match="profile_dir must be a path"):
        monet_opt.optimize(model, x, HUGE, profile_dir=bad)


def test_a_profile_dir_under_home_is_the_home_s(monkeypatch, tmp_path):
    from monet_opt.cache import ProfileCache
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ProfileCache("~/profiles").root == tmp_path / "profiles"


def test_numpy_numbers_are_taken():
    np = pytest.importorskip("numpy")
    assert monet_opt.parse_memory_limit(np.int64(4096)) == 4096


def test_measuring_says_what_it_takes():
    """Misused, measure_peak and resident_tensors raised bare TypeErrors from inside."""
    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    step = lambda: model(x).sum().backward()  # noqa: E731
    with pytest.raises(TypeError, match="step must be a function of no arguments"):
        monet_opt.measure_peak(model(x).sum())
    for resident in (model, 5, [model]):
        with pytest.raises(TypeError, match="pass monet_opt.resident_tensors"):
            monet_opt.measure_peak(step, resident)
    with pytest.raises(TypeError, match="call resident_tensors\\(model, inputs\\)"):
        monet_opt.resident_tensors(x, model)
    assert monet_opt.measure_peak(step, monet_opt.resident_tensors(model, x)) > 0
