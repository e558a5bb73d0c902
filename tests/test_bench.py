"""`monet-opt bench`: the harness runs end to end and writes what it promises; the peers'
wrappers train like eager."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch
from torch import nn

import solvers
from monet_opt import alloc_events, cli, zoo
from monet_opt.bench import allocator, measure, models, peers, report, results, run
from monet_opt.errors import UsageError

PNG = b"\x89PNG\r\n\x1a\n"


def _other_run() -> results.ModelRun:
    """A run of another model already in the file, which the next run must keep."""
    meta = results.Meta(model="other", config="x", device="d", torch_version="t", command="c",
                         git_commit="g", date="now", threads=1, param_bytes=10, buffer_bytes=0,
                         input_bytes=1, grad_bytes=10, floor_bytes=21, eager_peak_bytes=100,
                         eager_step_time_s=1.0)
    eager = results.Point(model="other", method="eager", family="eager", setting="",
                          status="ok", peak_bytes=100, step_time_s=1.0, overhead=0.0)
    return results.ModelRun(meta=meta, points=(eager,))


def test_quick_run_writes_json_markdown_and_plots(tmp_path):
    results.save(tmp_path / results.JSON_NAME, {"other": _other_run()})
    argv = ["--models", "tiny_cnn", "--quick", "--out", str(tmp_path), "--solvers",
            "auto,no_such_solver", "--limits", "100,a90,min,min+20", "--compile-backend",
            "aot_eager_decomp_partition", "--compile-budgets", "0.5", "--rounds", "1"]
    assert run.main(argv) == 0

    data = json.loads((tmp_path / results.JSON_NAME).read_text())
    assert data["schema_version"] == results.SCHEMA_VERSION
    runs = results.load(tmp_path / results.JSON_NAME)
    assert set(runs) == {"other", "tiny_cnn"}, "merging must keep the models already there"
    r = runs["tiny_cnn"]
    m = r.meta
    assert m.torch_version == torch.__version__ and m.device.startswith("CPU")
    assert m.command.startswith("monet-opt bench --models tiny_cnn") and m.git_commit
    assert m.floor_bytes == m.param_bytes + m.buffer_bytes + m.input_bytes + m.grad_bytes
    assert any("no_such_solver" in s for s in m.skipped)
    assert m.timing_noise is not None and m.timing_noise >= 0  # NOTE [Timing noise]
    assert m.allocator == allocator.KEPT  # NOTE [CPU allocator] (this machine's glibc)
    assert runs["other"].meta.allocator.startswith("the C library's default")
    if "checkmate" not in solvers.available_solvers():
        assert any("checkmate" in s for s in m.skipped)

    by_family = {f: [p for p in r.points if p.family == f] for f in results.FAMILIES}
    eager = by_family["eager"][0]
    assert eager.peak_bytes == m.eager_peak_bytes and eager.overhead == 0.0
    # The profiler sees what the counter sees, plus scratch memory inside kernels.
    assert m.eager_peak_bytes <= eager.profiler_peak_bytes <= 1.1 * m.eager_peak_bytes
    assert [p.setting for p in by_family["ours"]] == ["100%", "90% act", "min", "min+20%"]
    most = by_family["ours"][1]  # the floor and 90 % of eager's activations
    activations = m.eager_peak_bytes - m.floor_bytes
    assert most.limit_bytes == m.floor_bytes + int(activations * 90.0 / 100)
    least, above = by_family["ours"][2:]
    # 20 % above the least reported so far: the "min" plan's own may be lower than the limit
    # it was asked at (the generator states it does not keep: NOTE [States kept only where used])
    assert least.limit_bytes < above.limit_bytes <= int(least.limit_bytes * 1.2)
    for p in by_family["ours"]:
        assert p.status == "ok", p.note
        assert p.peak_bytes <= p.limit_bytes
        assert abs(p.prediction_error) <= 0.02
        assert p.grad_rel_diff <= 1e-5
        assert p.step_time_s > 0 and p.eager_step_time_s == eager.step_time_s
        assert p.solve_time_s >= 0 and p.plan_time_s > 0
        assert p.predicted_overhead is not None and p.predicted_overhead > -1
    assert least.peak_bytes < eager.peak_bytes
    assert {p.method for p in by_family["checkpoint"]} == \
        {peer.name for peer in models.SPECS["tiny_cnn"].checkpoint}
    (compiled,) = by_family["compile"]
    assert compiled.status == "ok", compiled.note
    # every method by monet_opt.measure_peak where allocation events are on (NOTE [Allocation
    # events]); else compiled code by the profiler's events
    assert compiled.peak_instrument == (measure.EVENTS if alloc_events.enabled()
                                        else measure.PROFILER)
    assert compiled.setting == "budget 0.5"
    assert compiled.solve_time_s > 0 and compiled.step_time_s > 0
    assert r.timeline is not None and r.timeline.predicted and r.timeline.measured
    # The timeline's measured peak is the point's.
    ours_point = next(p for p in by_family["ours"] if p.setting == r.timeline.setting)
    assert max(b for _, b in r.timeline.measured) == ours_point.peak_bytes

    md = (tmp_path / "bench.md").read_text()
    assert "## tiny_cnn" in md and "## other" in md
    for text in (m.device, m.torch_version, m.git_commit, m.command, "| monet_opt auto | min |",
                 "| monet_opt auto | min+20% |", "Timing noise"):
        assert text in md
    for name in ("bench_frontier.png", "bench_frontier_tiny_cnn.png",
                 "bench_timeline_tiny_cnn.png", "bench_frontier_other.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG), name


@pytest.mark.parametrize("limit", ["half", "a", "min+", "min-10", "0"])
def test_a_limit_that_is_none_is_refused_before_anything_runs(tmp_path, limit, capsys):
    """A usage error: one line and status 2, as argparse's own (it exited 1)."""
    assert cli.main(["bench", "--models", "tiny_cnn", "--quick", "--out", str(tmp_path),
                     "--limits", f"100,{limit}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"monet-opt bench: error: --limits: limit '{limit}': give a share")
    assert len(err.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


@pytest.mark.parametrize("args, says", [
    (["--limits", "inf"], "--limits: limit 'inf'"),
    (["--compile-budgets", "x"], "--compile-budgets: give numbers from 0 to 1"),
    (["--compile-budgets", "1,1.5"], "--compile-budgets: give numbers from 0 to 1"),
    (["--size", "foo=2"], "--size: tiny_cnn takes batch, size, not foo"),
    (["--size", "batch=0"], "integers of at least 1"),
    (["--size", "=3"], "name=integer pairs"),
    (["--rounds", "0"], None), (["--time-limit", "0"], None), (["--time-limit", "inf"], None),
    (["--models", ","], "no model in ','"),
])
def test_a_bad_argument_is_refused_before_anything_runs(tmp_path, args, says, capsys):
    """Each failed after eager's run (OverflowError, ValueError, TypeError) or was taken silently
    (--rounds 0 and --time-limit 0 as the defaults, batch=0 benchmarked)."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as raised:  # argparse's usage error, ours alike
        run.main(["--models", "tiny_cnn", "--quick", "--out", str(out), *args])
    assert raised.value.code == 2 and (says or "") in capsys.readouterr().err
    assert not out.exists()
    (tmp_path / "file").write_text("kept")
    assert cli.main(["bench", "--models", "tiny_cnn", "--quick", "--out",
                     str(tmp_path / "file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "kept"


def test_channels_last_run_times_the_model_as_built_beside(tmp_path):
    """--channels-last: every method on the channels-last model (ours exact against its
    eager), eager on the model as built timed in the same block and reported."""
    argv = ["--models", "tiny_cnn", "--quick", "--out", str(tmp_path), "--solvers", "auto",
            "--limits", "100,min", "--compile-budgets", "none", "--rounds", "1",
            "--channels-last", "--no-merge"]
    assert run.main(argv) == 0
    r = results.load(tmp_path / results.JSON_NAME)["tiny_cnn"]
    assert r.meta.config.endswith("channels-last (model and input)")
    assert r.meta.as_built_step_time_s is not None and r.meta.as_built_step_time_s > 0
    ours = [p for p in r.points if p.family == "ours"]
    assert ours and all(p.status == "ok" and p.grad_rel_diff == 0.0 for p in ours)
    assert all(p.peak_bytes <= p.limit_bytes for p in ours)
    assert "model as built (contiguous)" in (tmp_path / "bench.md").read_text()
    with pytest.raises(UsageError, match="gpt2 takes dict, not an image batch"):
        run._channels_last("gpt2", nn.Linear(2, 2), {"input_ids": torch.zeros(1, 4)})


def test_min_is_the_least_the_solver_reports_when_asked(tmp_path, monkeypatch):
    """NOTE [The least peak, asked for]: "min" is solved at the least a solve at the floor
    reports (or a lower one seen before), not only at what the earlier limits saw."""
    import monet_opt
    limits: list[int] = []  # every limit optimize() was called with
    reported: dict[int, int] = {}  # limit -> the least peak its InfeasibleBudgetError gave

    def spy(model, x, limit, **kwargs):
        limits.append(limit)
        try:
            return optimize(model, x, limit, **kwargs)
        except monet_opt.InfeasibleBudgetError as exc:
            reported[limit] = exc.min_feasible_bytes
            raise

    optimize = monet_opt.optimize
    monkeypatch.setattr(monet_opt, "optimize", spy)
    argv = ["--models", "tiny_cnn", "--quick", "--out", str(tmp_path), "--solvers", "auto",
            "--limits", "100,min", "--compile-budgets", "none", "--rounds", "1", "--no-merge"]
    assert run.main(argv) == 0
    r = results.load(tmp_path / results.JSON_NAME)["tiny_cnn"]
    assert r.meta.floor_bytes in reported, limits
    _, least = [p for p in r.points if p.family == "ours"]
    assert least.setting == "min" and least.status == "ok", least.note
    assert least.limit_bytes <= reported[r.meta.floor_bytes]
    assert least.peak_bytes <= least.limit_bytes and limits[-1] == least.limit_bytes


def test_a_run_cut_while_compiling_keeps_what_was_timed(tmp_path, monkeypatch):
    """NOTE [A run cut short]: killed during torch.compile's second budget, the file holds the
    model's run with our points timed, the first budget's point, and the second named as not
    run; the models already in the file stay."""
    results.save(tmp_path / results.JSON_NAME, {"other": _other_run()})
    compiled = run.methods.compiled
    calls = []

    def cut(ctx, backend, budget, rounds):
        calls.append(budget)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as a lent machine's time limit ends the process
        return compiled(ctx, backend, budget, rounds)

    monkeypatch.setattr(run.methods, "compiled", cut)
    argv = ["--models", "tiny_cnn", "--quick", "--out", str(tmp_path), "--solvers", "auto",
            "--limits", "100,min", "--compile-backend", "aot_eager_decomp_partition",
            "--compile-budgets", "0.5,0.3", "--rounds", "1"]
    with pytest.raises(KeyboardInterrupt):
        run.main(argv)
    runs = results.load(tmp_path / results.JSON_NAME)
    assert set(runs) == {"other", "tiny_cnn"}
    r = runs["tiny_cnn"]
    ours = [p for p in r.points if p.family == "ours"]
    assert [p.setting for p in ours] == ["100%", "min"]
    assert all(p.status == "ok" and p.step_time_s > 0 for p in ours)
    assert [p.setting for p in r.points if p.family == "compile"] == ["budget 0.5"]
    assert [s for s in r.meta.skipped if "compile" in s] == \
        ["torch.compile budget 0.3: the run ended before it"]


def test_a_run_failing_while_timing_keeps_what_was_measured(tmp_path, monkeypatch):
    """NOTE [A run cut short]: the timing block failing lost every point of the model."""
    def fail(*args, **kwargs):
        raise RuntimeError("timing failed")

    monkeypatch.setattr(run.measure, "interleaved_times", fail)
    argv = ["--models", "tiny_cnn", "--quick", "--out", str(tmp_path), "--solvers", "auto",
            "--limits", "100,min", "--compile-budgets", "none", "--rounds", "1"]
    with pytest.raises(RuntimeError, match="timing failed"):
        run.main(argv)
    r = results.load(tmp_path / results.JSON_NAME)["tiny_cnn"]
    ours = [p for p in r.points if p.family == "ours"]
    assert [p.setting for p in ours] == ["100%", "min"]
    assert all(p.status == "ok" and p.peak_bytes and p.step_time_s is None for p in ours)
    assert "timing: the run ended before it" in r.meta.skipped


def test_a_run_names_what_it_replaces_of_the_models_run_in_the_file(tmp_path):
    """A model's run in bench.json is replaced whole: before anything runs, the bench names
    the points of the old run that the new one will not have."""
    def point(method, family, setting):
        return results.Point(model="other", method=method, family=family, setting=setting,
                             status="ok")
    old = dataclasses.replace(_other_run(), points=(
        point("eager", "eager", ""), point("monet_opt auto", "ours", "100%"),
        point("monet_opt auto", "ours", "33% act"), point("monet_opt milp", "ours", "min"),
        point("checkmate (our executor)", "checkmate", "min"),
        point("torch.compile inductor", "compile", "budget 0.5")))
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)

    def told(*argv):
        argv = ["--models", "tiny_cnn", "--out", str(tmp_path), *argv]
        return run.replacing(tmp_path / "bench.json", old,
                             run.settings_from(parser.parse_args(argv), argv))

    said = told("--limits", "min", "--solvers", "auto,milp", "--compile-budgets", "none")
    assert said.startswith(f"{tmp_path / 'bench.json'}: other's run of now (commit g)")
    assert said.endswith("with its points that this run does not have: monet_opt auto 100%, "
                         "monet_opt auto 33% act, checkmate (our executor) min, "
                         "torch.compile inductor budget 0.5 (--out another folder keeps them)")
    said = told("--limits", "100,a33,min", "--solvers", "auto,milp,checkmate",
                "--compile-budgets", "0.5")
    assert said.endswith("is replaced by this one")


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=100,
                     use_cache=False)
    return zoo._LogitsOnly(GPT2LMHeadModel(cfg).train()), {"input_ids": torch.randint(0, 100,
                                                                                      (2, 16))}


PEER_CASES = {
    "tiny_cnn": lambda: zoo.tiny_cnn(),
    "resnet50": lambda: zoo.resnet50(batch=2, size=32),
    "googlenet": lambda: zoo.googlenet(batch=2, size=32),
    "densenet121": lambda: zoo.densenet121(batch=2, size=32),
    "unet": lambda: zoo.unet(batch=1, height=16, width=16, base=4),
    "gpt2": _tiny_gpt2,
}


def _checkpoints(module: nn.Module) -> bool:
    hf = getattr(module, "model", None)
    return getattr(hf, "is_gradient_checkpointing", False) or any(
        type(m).__name__ in ("_Checkpointed", "_SequentialCheckpoint") for m in module.modules())


@pytest.mark.parametrize("name", sorted(PEER_CASES))
def test_checkpoint_peers_give_eager_gradients(name, monkeypatch):
    """No peer raises the peak beyond the generator states torch.utils.checkpoint keeps for
    its recomputations (5,056 B each on CPU), which the allocation events see (NOTE
    [Allocation events]; the live-bytes counter did not): on a tiny model checkpointing saves
    less than that."""
    states: list[int] = []
    get_state = torch.get_rng_state
    monkeypatch.setattr(torch, "get_rng_state",
                        lambda: states.append(0) or get_state())
    model, x = PEER_CASES[name]()
    eager = measure.runner_for("eager", model, model, x)
    ref, _ = measure.first_step(eager, x, torch.device("cpu"))
    eager_peak, _ = measure.peak_bytes(eager, x, torch.device("cpu"), compiled=False)
    for peer in models.SPECS[name].checkpoint:
        wrapped = peer.build(model)
        assert wrapped.module is not model
        assert _checkpoints(wrapped.module), f"{name} {peer.name}: nothing is checkpointed"
        assert [tuple(p.shape) for p in wrapped.params] == [tuple(p.shape)
                                                            for p in model.parameters()]
        runner = measure.runner_for(peer.name, wrapped.module, wrapped.module, x,
                                    params=wrapped.params)
        grads, _ = measure.first_step(runner, x, torch.device("cpu"))
        assert measure.grad_rel_diff(grads, ref) <= 1e-6, f"{name} {peer.name}"
        states.clear()
        peak, instrument = measure.peak_bytes(runner, x, torch.device("cpu"), compiled=False)
        kept = len(states) * get_state().numel() if instrument == measure.EVENTS else 0
        assert peak <= eager_peak + kept, f"{name} {peer.name}: checkpointing raised the peak"
        if name == "tiny_cnn" and peer.name == "checkpoint_sequential":
            assert peak < eager_peak, "checkpoint_sequential saved nothing"


def test_compile_peer_gives_eager_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 4)).train()
    x = torch.randn(8, 16)
    eager = measure.runner_for("eager", model, model, x)
    ref, _ = measure.first_step(eager, x, torch.device("cpu"))
    with peers.compile_settings(0.0):
        wrapped = peers.compiled(model, "aot_eager_decomp_partition")
        runner = measure.runner_for("compiled", wrapped.module, model, x)
        grads, _ = measure.first_step(runner, x, torch.device("cpu"))
        note, really = peers.compile_note()
    assert really, note
    assert measure.grad_rel_diff(grads, ref) <= 1e-5


def test_bench_file_from_another_schema_is_refused(tmp_path):
    (tmp_path / results.JSON_NAME).write_text(json.dumps({"schema_version": 0, "models": {}}))
    with pytest.raises(results.BenchFileError, match="schema version"):
        results.load(tmp_path / results.JSON_NAME)


def test_identical_plans_report_their_spread():
    """Points predicting the same peak and time ran one schedule: the report gives how far
    apart they measured; points that differ in either prediction are not grouped."""
    def point(method, setting, predicted, overhead):
        return results.Point(model="m", method=method, family="ours", setting=setting,
                             status="ok", predicted_peak_bytes=predicted[0],
                             predicted_overhead=predicted[1], overhead=overhead)
    same = [point("auto", "100%", (50, 0.0), 0.09), point("milp", "100%", (50, 0.0), -0.007),
            point("dp", "80%", (50, 0.0), 0.021)]
    other = [point("auto", "50%", (40, 0.1), 0.3), point("dp", "50%", (40, 0.2), -0.5)]
    lines = report.same_plan_spread(same + other)
    assert lines == ["Identical plans (same predicted peak and time): 3 points in 1 groups; the "
                     "widest measured 9.7 points apart (auto 100% +9.0%, milp 100% -0.7%, "
                     "dp 80% +2.1%)."]
    assert report.same_plan_spread(other) == []


def test_methods_are_compared_by_one_instrument_and_our_misses_are_flagged():
    """NOTE [One instrument for every method]: a plan counted at half of eager's activations
    whose allocation events (which the compiled peer was measured by) hold more is not "at
    half"; points over their prediction, and over their limit by the events, are named."""
    meta = dataclasses.replace(_other_run().meta, floor_bytes=100, eager_peak_bytes=300)

    def point(method, family, peak, events, overhead, limit=None, predicted=None):
        return results.Point(model="m", method=method, family=family, setting="s",
                             status="ok", peak_bytes=peak, profiler_peak_bytes=events,
                             overhead=overhead, limit_bytes=limit, predicted_peak_bytes=predicted,
                             prediction_error=None if predicted is None else
                             (predicted - peak) / peak)
    run_ = results.ModelRun(meta=meta, points=(
        point("eager", "eager", 300, 320, 0.0),
        point("monet_opt auto", "ours", 200, 230, 0.05, limit=200, predicted=200),
        point("monet_opt auto", "ours", 150, 170, 0.20, limit=160, predicted=149),
        point("torch.compile inductor", "compile", 205, 205, 0.10)))
    assert run_.eager_compared_bytes == 320 and run_.instrument.startswith("torch.profiler")
    text = "\n".join(report.summary(run_, ("B", 1)))
    # half of eager's activations by the events: 100 + 110 = 210; ours counted 200 holds 230
    assert "| monet_opt auto | +20.0% | 170.0 (68%), +20.0% |" in text
    assert "| torch.compile inductor | +10.0% | 205.0 (52%), +10.0% |" in text
    assert "2 of 2 within their limit" in text and "1 measured over their prediction" in text
    assert "By allocation events, 2 of 2 over their limit, by up to 30.0" in text
    table = "\n".join(report.table(run_.points, 100, 300, ("B", 1)))
    assert table.count("**over prediction**") == 1 and table.count("(over limit)") == 2


def test_sizes_are_name_integer_pairs():
    from monet_opt import zoo
    from monet_opt.bench import run
    assert zoo.parse_size("batch=64,size=160") == {"batch": 64, "size": 160}
    assert zoo.parse_size("") is None
    with pytest.raises(UsageError, match="name=integer pairs"):
        zoo.parse_size("batch=64,size")
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    argv = ["--models", "resnet50", "--size", "batch=2,size=32"]
    s = run.settings_from(parser.parse_args(argv), argv)
    model, x, config = run.models.SPECS["resnet50"].build(s.regime, s.size)
    assert tuple(x.shape) == (2, 3, 32, 32) and config == "monet_opt.zoo.resnet50(batch=2, size=32)"
