"""`monet-opt bench`: an argument that cannot work is refused before anything is measured, and
one failing step of ours costs its point, not the run."""
from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from monet_opt.bench import measure, models, run
from monet_opt.errors import UsageError


def _settings(*argv: str) -> run.Settings:
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    argv = ("--models", "tiny_cnn", "--quick", *argv)
    return run.settings_from(parser.parse_args(argv), list(argv))


def test_an_out_folder_that_cannot_be_made_is_refused(tmp_path):
    """It was found only when bench.json was written, after the whole model was measured."""
    (tmp_path / "afile").write_text("kept")
    under_file = tmp_path / "afile" / "sub"
    with pytest.raises(UsageError, match=f"--out: cannot make the folder {under_file} "):
        _settings("--out", str(under_file), "--compile-budgets", "none")
    assert (tmp_path / "afile").read_text() == "kept"
    out = tmp_path / "new" / "out"
    assert _settings("--out", str(out), "--compile-budgets", "none").out == out
    assert out.is_dir(), "the folder is made up front"


def test_cuda_without_cuda_is_refused(tmp_path, monkeypatch):
    """It raised "Found no NVIDIA driver" at the model's move to the device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    with pytest.raises(UsageError, match="--device 'cuda', but torch sees no CUDA device"):
        _settings("--device", "cuda", "--out", str(out), "--compile-budgets", "none")
    assert not out.exists()


def test_an_unknown_compile_backend_is_refused_unless_nothing_compiles(tmp_path):
    """It was recorded "failed" at each budget, after our points had run."""
    out = tmp_path / "out"
    with pytest.raises(UsageError, match="--compile-backend: torch.compile has no backend 'nop'"):
        _settings("--out", str(out), "--compile-backend", "nop")
    assert not out.exists()
    assert _settings("--out", str(out), "--compile-backend", "nop",
                     "--compile-budgets", "none").compile_backend == "nop"
    # a backend list_backends() leaves out by default (tagged "debug") is one torch.compile takes
    assert _settings("--out", str(out), "--compile-backend",
                     "aot_eager_decomp_partition").compile_budgets


def test_a_failing_step_of_ours_is_a_failed_point_and_the_run_goes_on(tmp_path, monkeypatch):
    """ours() measured its plan outside the try that records a failure: one failing step ended
    the run with nothing written. A timeline that cannot be recorded is left out, likewise."""
    real = measure.first_step

    def first_step(runner, x, device):
        if runner.name == "monet_opt auto 100%":
            raise RuntimeError("simulated executor failure")
        return real(runner, x, device)

    def record(*args, **kwargs):
        raise RuntimeError("simulated timeline failure")

    monkeypatch.setattr(measure, "first_step", first_step)
    monkeypatch.setattr(run.timeline_mod, "record", record)
    s = _settings("--out", str(tmp_path), "--solvers", "auto", "--limits", "100,a90",
                  "--compile-budgets", "none", "--rounds", "1")
    r = run.bench_model(models.SPECS["tiny_cnn"],
                        dataclasses.replace(s, profile_dir=str(tmp_path / "profiles")))
    failed, ok = [p for p in r.points if p.family == "ours"]
    assert failed.setting == "100%" and failed.status == "failed"
    assert "RuntimeError: simulated executor failure" in failed.note
    assert failed.peak_bytes is None and failed.step_time_s is None
    assert ok.setting == "90% act" and ok.status == "ok" and ok.step_time_s > 0, ok.note
    assert r.timeline is None


def test_a_quick_run_writes_apart_from_the_committed_figures(monkeypatch, tmp_path):
    """--quick without --out merged its tiny runs into docs/benchmarks/bench.json, replacing
    the models' real runs there."""
    from monet_opt.bench import settings
    monkeypatch.setattr(settings, "QUICK_OUT", str(tmp_path / "quick"))
    assert _settings("--compile-budgets", "none").out == tmp_path / "quick"
