"""NOTE [The largest batch] (monet_opt/batch_size.py): the largest batch whose step a plan
fits under a limit, found in few tries, its plan within the limit when run; bad requests say
what to give instead."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import monet_opt
import solvers
from monet_opt import api, batch_size as lb
from solvers.peak_bound import least_peak_bound
from tests import models
from tests.models import SmallCNN, tiny_mlp
from tests.test_cli import run_cli

OPTIONS = dict(time_limit_s=2, profile_repeats=1)


def _images(batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(batch))


def _least_at(model, batch: int) -> int:
    """The least peak that no search under a limit just below it improves on. Under a limit
    store-all meets the search is brief (NOTE [The least peak where store-all fits]), and even
    a whole one is not always the least: small_cnn at batch 1, scratch counted, 144792 B under
    a limit of 1 B, where the search under 144791 B reached 144728 B."""
    least, limit = None, 1
    for _ in range(5):
        try:
            least = monet_opt.optimize(model, _images(batch), limit,
                                       **OPTIONS).plan.predicted_peak_bytes
        except monet_opt.InfeasibleBudgetError as caught:
            if least is not None:
                return least
            least = caught.min_feasible_bytes
        limit = least - 1
    raise AssertionError(f"the least peak kept going down, to {least} B")


def test_the_largest_batch_fits_and_the_next_does_not():
    torch.manual_seed(0)
    model = SmallCNN().train()
    limit = _least_at(model, 24)
    fit = lb.largest_batch(model, _images, limit, start=4, **OPTIONS)
    assert fit.proven and fit.batch >= 24
    assert [t.batch for t in fit.tries if t.fits][-1] == fit.batch
    assert any(t.batch == fit.batch + 1 and not t.fits for t in fit.tries)
    # the least peak's slope, not a walk one batch at a time (21 profiled tries from 4). The
    # sizes-alone tries (under a second each) see no kernel scratch (NOTE [Allocation events]),
    # so they sit further under the profiled least (at 24: 0.85 vs 1.42 MiB): 18 tries, not 16
    assert sum(t.profiled for t in fit.tries) <= 4 and len(fit.tries) <= 20, fit.text()
    x = _images(fit.batch)
    peak = monet_opt.measure_peak(lambda: fit.module(x).sum().backward(),
                                  monet_opt.resident_tensors(model, x))
    assert peak <= limit
    assert f"largest batch {fit.batch}" in fit.text()


@pytest.mark.parametrize("build", [models.small_cnn, models.resnet18_small,
                                   models.mobilenet_v2_small, models.gpt2_tiny,
                                   models.transformer_block])
def test_a_batch_refused_by_its_sizes_cannot_fit(build):
    """NOTE [A least peak from sizes]: the bound from the traced sizes alone is below the least
    peak optimize() reaches once the step is profiled (profiling only raises sizes and
    workspace), and below the profiled problem's own bound."""
    torch.manual_seed(0)
    model, x, _ = build()
    model.train()
    traced = least_peak_bound(monet_opt.lower_problem(model, x, timed=False))
    profiled = least_peak_bound(monet_opt.lower_problem(model, x, profile_repeats=1))
    with pytest.raises(monet_opt.InfeasibleBudgetError) as caught:
        monet_opt.optimize(model, x, 1, profile_dir=None, **OPTIONS)
    assert traced.bytes <= profiled.bytes <= caught.value.min_feasible_bytes


MIB = 1 << 20
FIXED = 1096 * MIB  # VGG-19's parameters and their gradients


def _vgg_like(b: int) -> int:
    """Shaped after VGG-19 at 64² as solved on the CPU (132: 1,104.9 MiB at the fully
    connected layers' gradients; 528: 2,265.3 MiB at the first convolutions), within 1 % of
    those: flat, then steep."""
    return int(max(FIXED + 9 * MIB + b * MIB // 16, 620 * MIB + b * 3.08 * MIB))


CURVES = [
    (_vgg_like, 1280 * MIB, 33),
    (_vgg_like, 1280 * MIB, 528),
    (_vgg_like, 4000 * MIB, 8),
    (lambda b: FIXED + b * 5 * MIB, 1500 * MIB, 8),                       # proportional
    (lambda b: FIXED + 40 * MIB + b * 5 * MIB, 1500 * MIB, 200),          # an offset
    (lambda b: FIXED + b * (5 + (b * 7919) % 3) * MIB, 2000 * MIB, 8),    # noisy
]
CURVE_IDS = ["vgg", "vgg_from_above", "vgg_steep", "linear", "offset", "noisy"]


def _search(monkeypatch, least, limit, start, bound, estimate=None):
    """largest_batch with its tries stubbed: `least` the least peak a plan reaches, `bound`
    its size bound, `estimate` what a brief solve of its sizes reaches (default: `least`)."""
    def stub(model, make_input, batch, limit_, options):
        n = least(batch)
        return lb.Try(batch, n <= limit_, n, None, 0.0), (object() if n <= limit_ else None)

    def estimated(model, make_input, batch, limit_, options):
        n = (estimate or least)(batch)
        return lb.Try(batch, n <= limit_, n, None, 0.0, profiled=False, estimated=True)

    def traced(model, make_input, batch, limit_, options):
        n = bound(batch)
        assert n <= least(batch)  # a bound
        return lb.Try(batch, n <= limit_, n, None, 0.0, profiled=False)

    monkeypatch.setattr(lb, "_try", stub)
    monkeypatch.setattr(lb, "_sized", traced)
    monkeypatch.setattr(lb, "_estimated", estimated)
    monkeypatch.setattr(lb, "_batchless_bytes", lambda model: FIXED)
    fit = lb.largest_batch(tiny_mlp(), lambda b: torch.zeros(b, 4), limit, start=start)
    for t in fit.tries:  # traced against the limit scaled to a try's least peak: said so
        assert t.held_to is None or (t.held_to != limit and "scaled to a try" in t.text())
    # a crossing: the largest batch that fits, where the least peak rises with the batch
    assert fit.proven and least(fit.batch) <= limit < least(fit.batch + 1), fit.text()
    return tuple([t.batch for t in fit.tries if keep(t)]
                 for keep in (lambda t: t.profiled, lambda t: t.is_bound, lambda t: t.estimated))


@pytest.mark.parametrize("least,limit,start", CURVES, ids=CURVE_IDS)
@pytest.mark.parametrize("gap", [0.0, 0.01, 0.03, 0.15, 0.4])
def test_the_search_finds_the_crossing_in_few_tries(monkeypatch, least, limit, start, gap):
    """The search alone, on least-peak curves of the shapes met, and size bounds below them by
    a share `gap` of what they hold above the batchless memory (VGG-19 64²: 2.7 % at 528; the
    bench's CNNs at their CPU sizes, traced: 26-42 %)."""
    profiled, traced, _ = _search(monkeypatch, least, limit, start,
                                  lambda b: int(FIXED + (least(b) - FIXED) * (1 - gap)))
    # the largest batch the bound allows, then (where it did not fit) the bound scaled to its
    # least peak: the answer and the next; on the noisy curve one more
    noisy = least is CURVES[-1][0]
    assert len(profiled) <= (4 if noisy else 3), (profiled, traced)
    assert len(traced) <= (24 if noisy else 12), (profiled, traced)


@pytest.mark.parametrize("least,limit,start", CURVES, ids=CURVE_IDS)
@pytest.mark.parametrize("seen", [0.0, 0.3])
@pytest.mark.parametrize("error", [-0.05, 0.0, 0.1, 0.3])
def test_estimates_keep_the_tries_few_where_the_bound_sees_little(monkeypatch, least, limit,
                                                                  start, seen, error):
    """NOTE [The largest batch], 2.: where the size bound sees little of the least peak (a
    transformer's: `seen` of what it holds above the batchless memory), brief solves of the
    sizes, under or over the least peak by `error` of that, choose the first try."""
    profiled, traced, guessed = _search(
        monkeypatch, least, limit, start, lambda b: int(FIXED + (least(b) - FIXED) * seen),
        estimate=lambda b: int(FIXED + (least(b) - FIXED) * (1 + error)))
    noisy = least is CURVES[-1][0]  # its least peak falls as well as rises with the batch
    assert len(profiled) <= (5 if noisy else 3), (profiled, guessed)
    assert len(guessed) <= (16 if noisy else 10), (profiled, len(guessed), guessed)


@pytest.mark.parametrize("least,limit,start", CURVES, ids=CURVE_IDS)
def test_a_bound_that_sees_nothing_leaves_the_search_to_the_tries(monkeypatch, least, limit,
                                                                  start):
    """Where the size bound is the batchless memory alone (every batch may fit by it: a
    transformer's bound is the step's floor at the bench's sizes), the tries alone find the
    crossing, from the largest batch."""
    profiled, _, _ = _search(monkeypatch, least, limit, start, lambda b: FIXED)
    assert len(profiled) <= 8, profiled


def test_a_batch_the_device_cannot_hold_does_not_fit(monkeypatch):
    """A try that runs the device out of memory is a batch that does not fit: halfway then."""
    optimize = api.optimize

    def small_device(model, x, limit, **kwargs):
        if x.shape[0] > 10:
            raise torch.OutOfMemoryError("CUDA out of memory (a stand-in)")
        return optimize(model, x, limit, **kwargs)

    monkeypatch.setattr(api, "optimize", small_device)
    torch.manual_seed(0)
    fit = lb.largest_batch(SmallCNN().train(), _images, 1 << 40, start=8, max_batch=40,
                           **OPTIONS)
    assert fit.batch == 10 and fit.proven
    assert any(t.least_bytes is None for t in fit.tries)
    assert "unknown (the device ran out of memory)" in fit.text()


def test_not_even_one_fits():
    torch.manual_seed(0)
    model = SmallCNN().train()
    least = _least_at(model, 1)
    with pytest.raises(monet_opt.InfeasibleBudgetError) as alone:
        monet_opt.optimize(model, _images(1), least - 1, **OPTIONS)
    with pytest.raises(monet_opt.InfeasibleBudgetError) as caught:
        lb.largest_batch(model, _images, least - 1, start=2, **OPTIONS)
    # optimize()'s own least there (above `least` by the state of a dropout it would recompute,
    # counted in every solve: NOTE [States kept only where used])
    assert caught.value.min_feasible_bytes == alone.value.min_feasible_bytes >= least
    assert "not even a batch of 1" in "".join(caught.value.__notes__)
    assert "solver 'auto'" in str(caught.value)  # it named a solver 'largest_batch'
    assert "smaller batch" not in str(caught.value)  # it said to use one


class _InFours(torch.nn.Module):
    """Takes batches of a multiple of 4 alone."""

    def __init__(self) -> None:
        super().__init__()
        self.f = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.f(x).reshape(-1, 4, 8).sum(1)


def test_a_batch_the_model_cannot_take_is_named():
    """A batch the search made that the model refuses raised a CaptureError saying to fix the
    sample input, which the caller never gave, and not which batch it was."""
    with pytest.raises(monet_opt.CaptureError) as caught:
        lb.largest_batch(_InFours(), lambda b: torch.randn(b, 8), 1 << 30, start=3, **OPTIONS)
    assert "largest_batch: at a batch of 3" in "".join(caught.value.__notes__)


def test_requests_that_cannot_be_served_say_why():
    model = SmallCNN().train()
    for share in ("50% of activations", "50%"):
        with pytest.raises(ValueError, match="share of one step"):
            lb.largest_batch(model, _images, share)
    for bad in (0, "0.5"):  # the message offered shares, which are refused
        with pytest.raises(ValueError, match=r"(?s)positive whole number of bytes(?!.*share)"):
            lb.largest_batch(model, _images, bad)
    with pytest.raises(ValueError, match="make_input"):
        lb.largest_batch(model, lambda b: torch.randn(4, 3, 16, 16), "1GiB")
    with pytest.raises(ValueError, match="start <= max_batch"):
        lb.largest_batch(model, _images, "1GiB", start=8, max_batch=4)
    # optimize()'s options, before a batch is traced (they failed after the size search)
    never = lambda b: pytest.fail("traced")  # noqa: E731
    with pytest.raises(ValueError, match="unknown solver 'fast'"):
        lb.largest_batch(model, never, "1GiB", solver="fast")
    with pytest.raises(TypeError, match="'time_limit' is not one of optimize"):
        lb.largest_batch(model, never, "1GiB", time_limit=5)


def test_sizes_under_a_mib_are_shown():
    """A small model's tries all read "0.0 MiB"."""
    line = lb.Try(4, True, 300_000, 400_000, 0.5).text()
    assert "292.97 KiB" in line and "390.62 KiB" in line


def test_the_command_line_prints_each_try_and_the_answer(tmp_path):
    torch.manual_seed(0)  # as the command builds it
    limit = monet_opt.optimize(tiny_mlp(), torch.randn(32, 8), 1 << 40,
                               **OPTIONS).plan.min_feasible_bytes
    common = ("largest-batch", "tests.models:tiny_mlp", "--input-shape", "8x8",
              "--time-limit-s", "2", "--profile-dir", str(tmp_path))
    code, out, err = run_cli(*common, "--limit", str(limit))
    assert code == 0, err
    # batches traced for their size bounds from --input-shape's, then tried
    assert "batch      8: may fit" in out and "not profiled" in out
    assert ": fits " in out and "largest batch" in out.splitlines()[-1]
    # each try on stderr as it ends, the same lines as the summary's
    tried = [line.removeprefix("monet-opt: largest_batch: ") for line in err.splitlines()
             if line.startswith("monet-opt: largest_batch: batch")]
    assert tried and [f"  {line}" for line in tried] == out.splitlines()[:-1]
    code, out, err = run_cli(*common, "--limit", "50% of peak")
    assert code == 2 and "share of one step" in err and len(err.strip().splitlines()) == 1


def test_an_estimate_the_dp_has_no_time_for_is_the_size_bound(monkeypatch):
    """NOTE [The largest batch], 2.: where the DP ends without a least peak (its time out on a
    large step), the estimate is the batch's size bound, held against the limit as any."""
    model, images = tiny_mlp(), lambda b: torch.zeros(b, 8)
    bound = least_peak_bound(monet_opt.lower_problem(model, images(3), timed=False)).bytes
    solve = solvers.solve

    def dp_out_of_time(problem, limit, solver="auto", **kwargs):
        result = solve(problem, limit, solver, **kwargs)
        return result if solver != "dp" else dataclasses.replace(
            result, status=solvers.Status.TIMEOUT, schedule=None, min_feasible_bytes=None)
    monkeypatch.setattr(solvers, "solve", dp_out_of_time)
    for limit in (bound, bound - 1):
        guess = lb._estimated(model, images, 3, limit, {})
        assert guess.estimated and guess.least_bytes == bound and guess.fits == (limit == bound)
