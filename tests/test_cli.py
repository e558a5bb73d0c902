"""monet-opt precompute / list / explain, and the profiler's time limit and de-duplication."""
from __future__ import annotations

import collections
import contextlib
import copy
import io
import re
import statistics
import warnings
from pathlib import Path

import pytest
import torch

import monet_opt
import solvers
from monet_opt import cli, measured, profile_budget, profiler
from monet_opt import zoo as zoo_models
from monet_opt.cache import ProfileCacheWarning
from monet_opt.profiler import ProfileTimeLimitWarning
from tests import models

HUGE = 1 << 40
FACTORY = "tests.models:tiny_mlp"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def precompute(root: Path, shape: str, *more: str) -> str:
    code, out, err = run_cli("precompute", FACTORY, "--input-shape", shape, "--profile-dir",
                             str(root), "--profile-repeats", "1", "--time-limit-s", "5", *more)
    assert code == 0, err
    return out


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> tuple[Path, str]:
    """A profile directory with two profiles of tiny_mlp (batch 64 and 32)."""
    root = tmp_path_factory.mktemp("zoo") / "profiles"
    out = precompute(root, "64x8", "--fractions", "0.8,0.01")
    precompute(root, "32x8", "--limits", "1MiB")
    return root, out


def test_precompute_solves_each_limit_and_reports_infeasible_ones(zoo):
    _, out = zoo
    rows = [line for line in out.splitlines() if "of activations" in line]
    assert len(rows) == 2
    assert "optimal" in rows[0] or "feasible" in rows[0]
    assert "infeasible: the least feasible peak is" in rows[1]
    # 1 % of the activations is under what the step's sizes need: no longer solve would help
    assert "the step's sizes alone need" in rows[1] and "--time-limit-s" not in rows[1]


def test_optimize_then_neither_profiles_nor_solves(zoo, monkeypatch):
    root, out = zoo
    counts = collections.Counter()
    real_profile, real_solve = measured.profile, solvers.solve
    monkeypatch.setattr(measured, "profile", lambda *a, **k: counts.update(["profile"]) or
                        real_profile(*a, **k))
    monkeypatch.setattr(solvers, "solve", lambda *a, **k: counts.update(["solve"]) or
                        real_solve(*a, **k))
    limit = int(next(line for line in out.splitlines() if "80% of" in line).split()[2])
    opt = monet_opt.optimize(models.tiny_mlp(), torch.randn(64, 8), limit, profile_repeats=1,
                             time_limit_s=5, profile_dir=root)
    assert counts == {}
    assert opt.plan.predicted_peak_bytes <= limit


def test_a_share_asked_of_optimize_is_served_by_precompute(zoo, monkeypatch):
    """NOTE [Limits as shares]: "80% of activations" is the bytes precompute's --fractions 0.8
    solved, so nothing is profiled or solved again."""
    root, out = zoo
    solved = []
    real_solve = solvers.solve
    monkeypatch.setattr(solvers, "solve", lambda *a, **k: solved.append(a) or
                        real_solve(*a, **k))
    limit = int(next(line for line in out.splitlines() if "80% of" in line).split()[2])
    opt = monet_opt.optimize(models.tiny_mlp(), torch.randn(64, 8), "80% of activations",
                             profile_repeats=1, time_limit_s=5, profile_dir=root)
    assert solved == [] and opt.plan.memory_limit_bytes == limit
    again = precompute(root, "64x8", "--limits", "80% of activations")
    row = next(line for line in again.splitlines() if "80% of" in line)
    assert int(row.split()[2]) == limit


def test_precompute_under_autocast_serves_optimize_under_autocast(tmp_path, monkeypatch):
    """--autocast profiles the mixed-precision step; optimize() inside the same torch.autocast
    block then neither profiles nor solves, and outside it finds nothing cached."""
    root = tmp_path / "profiles"
    out = precompute(root, "64x8", "--fractions", "0.8", "--autocast", "bfloat16")
    limit = int(next(line for line in out.splitlines() if "80% of" in line).split()[2])
    counts = collections.Counter()
    real_profile = measured.profile
    monkeypatch.setattr(measured, "profile", lambda *a, **k: counts.update(["profile"]) or
                        real_profile(*a, **k))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        opt = monet_opt.optimize(models.tiny_mlp(), torch.randn(64, 8), limit,
                                 profile_repeats=1, time_limit_s=5, profile_dir=root)
        assert opt(torch.randn(64, 8)).dtype == torch.bfloat16
    assert counts == {}
    monet_opt.optimize(models.tiny_mlp(), torch.randn(64, 8), HUGE, profile_repeats=1,
                       time_limit_s=5, profile_dir=root)
    assert counts == {"profile": 1}


def test_precompute_channels_last_serves_a_channels_last_optimize(tmp_path, monkeypatch):
    """--channels-last profiles the model and batch made channels-last; optimize() of the
    channels-last model then neither profiles nor solves. A batch that is no image is refused."""
    root = tmp_path / "profiles"
    code, out, err = run_cli("precompute", "monet_opt.zoo:tiny_cnn", "--channels-last",
                             "--profile-dir", str(root), "--profile-repeats", "1",
                             "--time-limit-s", "5", "--fractions", "0.8")
    assert code == 0, err
    limit = int(next(line for line in out.splitlines() if "80% of" in line).split()[2])
    counts = collections.Counter()
    real_profile = measured.profile
    monkeypatch.setattr(measured, "profile", lambda *a, **k: counts.update(["profile"]) or
                        real_profile(*a, **k))
    torch.manual_seed(0)
    model, x = zoo_models.tiny_cnn()
    monet_opt.optimize(model.to(memory_format=torch.channels_last),
                       x.contiguous(memory_format=torch.channels_last), limit,
                       profile_repeats=1, time_limit_s=5, profile_dir=root)
    assert counts == {}
    code, _, err = run_cli("precompute", FACTORY, "--input-shape", "4x8", "--channels-last",
                           "--profile-dir", str(root))
    assert code == 2 and "needs an image batch" in err


def test_precompute_solves_the_problem_optimize_plans(tmp_path, monkeypatch):
    """NOTE [Problems as planned]: with dropout on CPU the step holds a generator state beyond
    the measured ops; precompute solved the profile's own problem, so optimize() solved again
    and precompute's peaks were under the step's. Now optimize() neither profiles nor solves,
    its plan is the one precompute printed, and list and explain show it."""
    factory, root = "tests.models:tiny_dropout_mlp", tmp_path / "profiles"
    code, out, err = run_cli("precompute", factory, "--input-shape", "64x8", "--profile-dir",
                             str(root), "--profile-repeats", "1", "--fractions", "0.9")
    assert code == 0, err
    row = next(line for line in out.splitlines() if "90% of" in line).split()
    limit, peak = int(row[2]), row[6] + " " + row[7]
    solved = []
    real_profile, real_solve = measured.profile, solvers.solve
    monkeypatch.setattr(measured, "profile", lambda *a, **k: solved.append("profile") or
                        real_profile(*a, **k))
    monkeypatch.setattr(solvers, "solve", lambda *a, **k: solved.append("solve") or
                        real_solve(*a, **k))
    opt = monet_opt.optimize(models.tiny_dropout_mlp(), torch.randn(64, 8),
                             "90% of activations", profile_repeats=1, profile_dir=root)
    assert solved == [] and opt.plan.memory_limit_bytes == limit
    assert monet_opt.format_bytes(opt.plan.predicted_peak_bytes) == peak
    code, listed, _ = run_cli("list", "--profile-dir", str(root))
    assert code == 0 and "as optimize() plans the step (+0 B fixed" in listed  # the states apart
    assert peak in next(line for line in listed.splitlines() if f" {limit} " in line)
    for asked in (str(limit), "90% of activations"):  # a share as optimize() takes it
        code, text, _ = run_cli("explain", "--profile-dir", str(root), "Sequential", asked)
        assert code == 0 and f"predicted peak    {peak}" in text


def test_a_damaged_problem_file_is_written_again(tmp_path):
    """A problem file cut short was skipped by `list` (its schedules shown as none) and never
    written again, though optimize() and precompute solved on; now the next use rewrites it."""
    factory, root = "tests.models:tiny_dropout_mlp", tmp_path / "profiles"
    argv = ("precompute", factory, "--input-shape", "64x8", "--profile-dir", str(root),
            "--profile-repeats", "1", "--fractions", "0.9")
    assert run_cli(*argv)[0] == 0
    path, = root.glob("*/problem-*.json")
    whole = path.read_bytes()
    path.write_bytes(whole[:100])
    with pytest.warns(ProfileCacheWarning, match="truncated.*; written again"):
        monet_opt.optimize(models.tiny_dropout_mlp(), torch.randn(64, 8),
                           "90% of activations", profile_repeats=1, profile_dir=root)
    assert path.read_bytes() == whole
    code, listed, err = run_cli("list", "--profile-dir", str(root))
    assert code == 0 and err == "" and "as optimize() plans the step" in listed


def test_list_shows_profiles_and_schedules(zoo):
    root, _ = zoo
    code, out, err = run_cli("list", "--profile-dir", str(root))
    assert code == 0 and err == ""
    assert out.count("Sequential-") == 2
    assert "inputs float32[64x8]" in out and "inputs float32[32x8]" in out
    # the 80 % limit's schedule: optimal, or feasible where the solver's time ran out (CI load)
    assert "infeasible" in out and re.search(r"\s(optimal|feasible)\s", out)


def test_explain_prints_a_cached_plan(zoo):
    root, out = zoo
    limit = next(line for line in out.splitlines() if "80% of" in line).split()[2]
    folder = next(p.name for p in root.iterdir() if (p / "profile.json").read_text().count(
        "64x8"))
    code, listed, _ = run_cli("explain", "--profile-dir", str(root), folder)
    assert code == 0 and limit in listed
    code, text, _ = run_cli("explain", "--profile-dir", str(root), folder, limit)
    assert code == 0
    assert "monet_opt plan: solver" in text and "predicted peak" in text and "addmm" in text
    # LIMIT after an option (argparse had it as an unrecognized argument)
    assert run_cli("explain", folder, "--profile-dir", str(root), limit)[:2] == (0, text)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as raised:
        cli.main(["explain", folder, "--profile-dir", str(root), limit, "7"])
    assert raised.value.code == 2 and "unrecognized arguments: 7" in err.getvalue()
    # as list shows it (rounded), and as precompute was asked: a share (journey probe: both
    # were refused, the first with a hint to precompute a limit 70 B from the cached one)
    shown = monet_opt.format_bytes(int(limit)).replace(" ", "")
    assert run_cli("explain", folder, "--profile-dir", str(root), shown)[:2] == (0, text)
    assert run_cli("explain", folder, "--profile-dir", str(root),
                   "80% of activations")[:2] == (0, text)


@pytest.mark.parametrize("argv, message", [
    (("precompute", "tests.models"), "write MODULE:FACTORY"),
    (("precompute", "no_such_module:f", "--input-shape", "2x8"), "cannot import"),
    (("precompute", "tests.models:nope", "--input-shape", "2x8"), "has no 'nope'"),
    (("precompute", "torch.nn:Linear", "--input-shape", "2x8"), "without arguments"),
    (("precompute", FACTORY, "--input-shape", "2xq8"), "bad input shape"),
    (("precompute", FACTORY), "give --input-shape"),
    (("precompute", FACTORY, "--input-shape", "2x8", "--limits", "lots"), "bad --limits"),
    (("explain", "Nothing"), "no profile 'Nothing'"),
    (("explain", "Seq"), "matches 2 profiles"),
    (("explain", "Sequential", "--solver", "chen"), "matches 2 profiles"),
    # each was a Python traceback
    (("precompute", FACTORY, "--input-shape", "2x\u00b2"), "bad input shape"),
    (("precompute", FACTORY, "--input-shape", "2x8", "--device", "bogus"), "bad --device"),
    (("largest-batch", FACTORY, "--input-shape", "2x8", "--limit", "1MiB", "--device",
      "bogus"), "bad --device"),
    (("precompute", "./tests/models.py:mlp", "--input-shape", "2x8"), "cannot import"),
    (("precompute", FACTORY, "--input-shape", "2x8", "--device", "meta"), "cpu or cuda"),
    # an empty list (an unset shell variable) solved the default limits
    (("precompute", FACTORY, "--input-shape", "2x8", "--limits", ""), "--limits is empty"),
    (("precompute", FACTORY, "--input-shape", "2x8", "--fractions", " "), "--fractions is empty"),
    (("precompute", FACTORY, "--input-shape", "2x8", "--fractions", "50"), "50% is 0.5"),
])
def test_errors_exit_2_with_one_line(zoo, argv, message):
    root, _ = zoo
    code, out, err = run_cli(*argv, "--profile-dir", str(root))
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_model_error_is_said_without_a_traceback(tmp_path):
    """A model with nothing to train (NoBackwardError) printed a whole traceback."""
    code, _, err = run_cli("precompute", "tests.models:frozen_mlp", "--input-shape", "2x8",
                           "--profile-dir", str(tmp_path))
    assert code == 1 and "Traceback" not in err
    assert "\nmonet-opt precompute: NoBackwardError: " in err and "requires grad" in err


def test_explain_limit_without_schedule(zoo):
    root, _ = zoo
    folder = sorted(p.name for p in root.iterdir())[0]
    code, _, err = run_cli("explain", "--profile-dir", str(root), folder, "3MiB")
    assert code == 2 and "no cached auto schedule at 3.00 MiB" in err
    assert "monet-opt precompute" in err


def test_list_missing_empty_and_damaged_directories(tmp_path):
    code, out, _ = run_cli("list", "--profile-dir", str(tmp_path / "none"))
    assert code == 0 and "no profile directory" in out
    (tmp_path / "empty").mkdir()
    code, out, _ = run_cli("list", "--profile-dir", str(tmp_path / "empty"))
    assert code == 0 and "no usable profiles" in out
    bad = tmp_path / "bad" / "Model-0123456789abcdef"
    bad.mkdir(parents=True)
    (bad / "profile.json").write_text('{"kind": "monet_opt.profile", "schema')
    code, out, err = run_cli("list", "--profile-dir", str(tmp_path / "bad"))
    assert code == 0 and "warning:" in err and "truncated" in err


# ---- the profiler ----------------------------------------------------------------------------

def test_budget_lowers_repeats_to_fit_the_time_left():
    budget = profile_budget.Budget(3, 1.0, total=10, name="m")
    assert budget.repeats_now() == 3  # nothing measured yet
    budget.timed(0.01)  # 10 ops x (1 + 3) x 10 ms fits in 1 s
    assert budget.repeats_now() == 3
    budget.timed(0.05)  # mean 30 ms: 10 x 4 x 30 ms does not fit, 10 x 3 x 30 ms does
    assert budget.repeats_now() == 2
    budget.timed(0.5)   # mean 187 ms: not even one repeat fits: one cold timed call
    assert budget.repeats_now() == 0
    assert not budget.over()  # never over before the first op is done
    budget.limit_s = 0.0
    budget.op_done(0)
    assert budget.over()


def test_time_limit_estimates_ops_and_still_trains_exactly():
    torch.manual_seed(0)
    model, x = models.tiny_mlp(), torch.randn(64, 8)
    eager = copy.deepcopy(model)
    before = copy.deepcopy(model.state_dict())
    # variants off: the time limit leaves variants unmeasured, so they would not be offered
    least = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_repeats=1, variants=False,
                               profile_dir=None).plan.min_feasible_bytes
    with pytest.warns(ProfileTimeLimitWarning, match=r"after 1 of \d+ ops; \d+ op times are "
                                                     r"estimates"):
        opt = monet_opt.optimize(model, x, least, profile_repeats=1, profile_dir=None,
                                 variants=False, profile_time_limit_s=1e-9)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert opt.plan.predicted_peak_bytes <= least and opt.plan.recomputed_ops > 0
    assert all(r.time_s > 0 for r in opt.plan.rows if r.bytes > 0)  # every op has a time
    for module, owner in ((opt, model), (eager, eager)):
        torch.manual_seed(1)
        module(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_a_time_limit_bounds_many_repeats(monkeypatch):
    """profile_repeats=100000 with a 1 s limit ran past 300 s: the first op took every repeat
    (no mean was known yet to project from), and a recomputation's cold timing of an op met
    before took them all again."""
    assert profile_budget.Budget(100000, 1.0, 9, "m").repeats_now() == \
        profile_budget.FIRST_REPEATS
    asked = []
    for name in ("_samples", "_cold_samples"):
        real = getattr(profiler, name)
        monkeypatch.setattr(profiler, name, lambda *a, real=real: asked.append(a[-1]) or real(
            *a[:-1], min(a[-1], 2)))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                torch.nn.ReLU(), torch.nn.Linear(8, 2))
    monet_opt.optimize(model, torch.randn(4, 8), HUGE, profile_repeats=100000, profile_dir=None,
                       profile_time_limit_s=0.1, variants=False)
    assert asked and max(asked) < 100000, asked


def test_time_limited_profile_is_cached_apart(monkeypatch):
    counts = collections.Counter()
    real = measured.profile
    monkeypatch.setattr(measured, "profile", lambda *a, **k: counts.update(["p"]) or real(*a, **k))
    model, x = models.tiny_mlp(), torch.randn(16, 8)
    with pytest.warns(ProfileTimeLimitWarning):
        monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_time_limit_s=1e-9)
    monet_opt.optimize(model, x, HUGE, profile_repeats=1)  # never served the estimated one
    assert counts["p"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the complete profile is used: nothing estimated
        monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_time_limit_s=1e-9)
    assert counts["p"] == 2
    assert len(list(Path("profiles").glob("*/profile.json"))) == 2


def test_identical_calls_are_timed_once(monkeypatch):
    """A signature's repeats run once; each later op of it runs once, for its value, and that
    run is one more sample (NOTE [Noisy samples])."""
    results, timed, met = [], collections.Counter(), collections.Counter()
    real_profile, real_call, real_signature = measured.profile, profiler._call, profiler.signature
    monkeypatch.setattr(measured, "profile", lambda *a, **k: results.append(real_profile(*a, **k))
                        or results[-1])
    monkeypatch.setattr(profiler, "SPREAD", float("inf"))  # no second round of repeats

    def counting(target, args, kwargs, cuda):
        if isinstance(target, torch._ops.OpOverload):
            timed[real_signature(target, args, kwargs)] += 1
        return real_call(target, args, kwargs, cuda)

    def meeting(target, args, kwargs):
        met[real_signature(target, args, kwargs)] += 1
        return real_signature(target, args, kwargs)
    monkeypatch.setattr(profiler, "_call", counting)
    monkeypatch.setattr(profiler, "signature", meeting)
    opt = monet_opt.optimize(models.tiny_mlp(), torch.randn(16, 8), HUGE, profile_repeats=2,
                             profile_dir=None)
    assert timed == {sig: 2 + n - 1 for sig, n in met.items()}
    assert max(met.values()) > 1  # the identical layers met again
    assert results[0].timed_signatures == len(timed) < len(opt.plan.rows) - 4
    hidden = [r.time_s for r in opt.plan.rows if r.name in ("addmm_1", "addmm_2")]
    assert len(hidden) == 2 and hidden[0] == hidden[1]  # identical layers, one time


def test_disagreeing_samples_are_taken_again(monkeypatch):
    """NOTE [Noisy samples]: a burst that slows two of three calls does not make the time."""
    def scripted(durations):
        it = iter(durations)
        return lambda target, args, kwargs, cuda: (None, next(it))
    monkeypatch.setattr(profiler, "_call", scripted([1.0, 20.0, 20.0, 1.0, 1.0, 1.0]))
    samples = profiler._samples(None, (), {}, False, 3)
    assert samples == [1.0, 20.0, 20.0, 1.0, 1.0, 1.0] and statistics.median(samples) == 1.0
    monkeypatch.setattr(profiler, "_call", scripted([1.0, 1.2, 1.4]))  # within SPREAD
    assert profiler._samples(None, (), {}, False, 3) == [1.0, 1.2, 1.4]


def test_list_and_explain_read_a_profile_dir_under_home(zoo, monkeypatch):
    """`--profile-dir ~/...` reached precompute and optimize() as the home's, but list said
    "no profile directory at ~/pd/" and explain "no profile"."""
    root, _ = zoo
    monkeypatch.setenv("HOME", str(root.parent))
    code, out, _ = run_cli("list", "--profile-dir", f"~/{root.name}")
    assert code == 0 and out.count("Sequential-") == 2
    folder = next(p.name for p in root.iterdir() if (p / "profile.json").exists())
    code, _, err = run_cli("explain", "--profile-dir", f"~/{root.name}", folder)
    assert code == 0, err
