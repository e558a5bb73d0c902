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
    ("time_limit_s", math.nan, ValueError), ("time_limit_s", math.inf, ValueError),
    ("profile_time_limit_s", "60", ValueError),
    ("profile_repeats", 0, ValueError), ("profile_repeats", 1.5, ValueError),
    # "False" turned the lossy variants on: gradients 0.0153 from eager's
    ("allow_lossy", "False", TypeError), ("allow_lossy", None, TypeError),
])
def test_optimize_names_a_wrong_argument(argument, bad, error):
    """Each was split into characters, not iterable, a failed comparison, taken (0 repeats) or
    blamed on the model (1.5), before monet_opt/arguments.py."""
    model, x, _ = models.small_cnn()
    with pytest.raises(error, match=f"monet_opt.optimize: {argument} must be"):
        monet_opt.optimize(model, x, HUGE, profile_dir=None, **{argument: bad})


@pytest.mark.parametrize("huge", [10 ** 100, 10 ** 400, 1e300])
def test_a_limit_past_any_memory_is_refused_before_the_trace(huge):
    """10**400 B was taken, traced, profiled and solved, then failed printing the plan
    (OverflowError); 1e300 was printed in explain() with 300 digits."""
    model, x, _ = models.small_cnn()
    with pytest.raises(ValueError, match=r"under 10\*\*100"):
        monet_opt.optimize(model, x, huge, profile_dir=None)


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


def test_numpy_numbers_are_taken(tmp_path):
    """numpy's int64 as profile_repeats failed writing the profile's key (not JSON), a
    Fraction as time_limit_s printing the solve's progress."""
    import fractions
    np = pytest.importorskip("numpy")
    assert monet_opt.parse_memory_limit(np.int64(4096)) == 4096
    # np.float32 was refused where 3e8 and np.float64 were taken
    assert monet_opt.parse_memory_limit(np.float32(3e8)) == 300_000_000
    model, x, _ = models.small_cnn()
    opt = monet_opt.optimize(model, x, "80% of activations", profile_dir=tmp_path,
                             profile_repeats=np.int64(1), time_limit_s=fractions.Fraction(5))
    assert opt.plan.predicted_peak_bytes <= opt.plan.memory_limit_bytes


def test_a_solver_stopped_before_any_schedule_says_so():
    """solver="dp" at time_limit_s=1e-3 found no schedule and no least peak: a bare TypeError
    (int(None)) from InfeasibleBudgetError."""
    model, x, _ = models.small_cnn()
    with pytest.raises(monet_opt.InfeasibleBudgetError, match="found no schedule") as caught:
        monet_opt.optimize(model, x, "50% of activations", solver="dp", time_limit_s=1e-6,
                           profile_dir=None)
    assert caught.value.min_feasible_bytes is None


def test_largest_batch_takes_max_batch_alone_and_refuses_fractions():
    """max_batch=5 alone was refused ("got start=8"); start=2.5 reached make_input."""
    model, _, _ = models.small_cnn()
    make = lambda b: torch.randn(b, 3, 16, 16)  # noqa: E731
    fit = monet_opt.largest_batch(model, make, "1GiB", max_batch=3, profile_dir=None)
    assert fit.batch == 3
    for bad in ({"start": 2.5}, {"max_batch": 16.0}):
        with pytest.raises(TypeError, match="must be ints"):
            monet_opt.largest_batch(model, make, "1GiB", profile_dir=None, **bad)
    with pytest.raises(ValueError, match="returned no tensor"):  # said "the same shapes"
        monet_opt.largest_batch(model, lambda b: b, "1GiB", profile_dir=None)


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


def _coo():
    return torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.ones(2), (2, 2))


@pytest.mark.parametrize("make, message", [
    # each failed inside torch or was blamed on something else
    (lambda: _coo().to_sparse_csr(), "layout torch.sparse_csr"),
    (lambda: _coo().requires_grad_(), "sparse input that requires grad"),
    (lambda: torch.nested.nested_tensor([torch.ones(2, 2), torch.ones(3, 2)]), "nested tensor"),
])
def test_inputs_of_unplannable_layouts_say_what_to_pass(make, message):
    with pytest.raises(TypeError, match=message):
        monet_opt.optimize(torch.nn.Linear(2, 2), (torch.ones(2, 2), make()), HUGE,
                           profile_dir=None)


def test_a_solver_that_searches_nothing_is_not_told_to_search_longer():
    """solver='store_all' under its peak was told "a solve longer than time_limit_s may find
    it", which no time changes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    x = torch.randn(64, 64)
    full = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1).plan
    assert full.min_feasible_bytes < full.store_all_peak_bytes
    with pytest.raises(monet_opt.InfeasibleBudgetError) as raised:
        monet_opt.optimize(model, x, full.min_feasible_bytes, profile_dir=None,
                           profile_repeats=1, solver="store_all")
    assert "solver='auto' may find" in str(raised.value)
    assert "longer" not in str(raised.value)
