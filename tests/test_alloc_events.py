"""NOTE [Allocation events] (monet_opt/alloc_events.py): by default, on CPU
an op's workspace and a step's peak are read from the allocator's events, so plans count
kernels' scratch and a plan's measured peak, scratch included, stays within its limit."""
from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

import monet_opt
from monet_opt import alloc_events
from monet_opt.memory import LiveBytes, counted, measure_peak, resident_tensors


@pytest.fixture(autouse=True)
def _events_on(monkeypatch):
    monkeypatch.delenv(alloc_events.SWITCH, raising=False)  # the default: on


def _conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


def _step(module: nn.Module, x: torch.Tensor) -> None:
    module(x).sum().backward()


def test_a_convolution_has_scratch_the_counter_does_not_see():
    x, w = torch.randn(4, 32, 24, 24), torch.randn(32, 32, 3, 3)
    conv = functools.partial(torch.ops.aten.convolution.default, x, w, None, [1, 1], [1, 1],
                             [1, 1], False, [0, 0], 1)
    conv()
    out, workspace = counted(conv, False, (x, w))
    assert out.shape == (4, 32, 24, 24)
    assert workspace > 0  # oneDNN reorders into scratch; the counter saw 0
    with LiveBytes([x, w]) as counter:
        conv()
    assert counter.peak - counter.live <= out.untyped_storage().nbytes()


def test_frees_count_of_what_it_knows_only():
    events = [(1, 0, 10, 100), (2, 1, 99, -50), (3, 2, 7, -30), (4, 3, 11, 40),
              (5, 4, 10, -100), (6, 5, 12, 20)]
    window = alloc_events.Allocations()
    window._take(events)  # 99 was allocated before the window and is not held: not counted
    assert (window.peak, window.net) == (140, 60)
    held = alloc_events.Allocations()
    held._live = {7: 30}
    held._take(events)
    assert (held.peak, held.net) == (110, 30)


def test_a_window_inside_another_counts_in_both():
    x = torch.randn(64, 64)
    with alloc_events.Allocations([x]) as outer:
        a = torch.randn(256, 256)  # 256 KiB
        with alloc_events.Allocations() as inner:
            b = torch.randn(512, 512)  # 1 MiB
            del a
        c = torch.randn(128, 128)
        del b, x
    assert (inner.peak, inner.net) == (1 << 20, (1 << 20) - (1 << 18))
    assert outer.peak == (1 << 18) + (1 << 20)
    # x was allocated outside the window: the allocator reports its free only where it
    # recorded x's size (a profiler recording memory when x was made; in a fresh process not)
    assert outer.net in (1 << 16, (1 << 16) - (1 << 14))
    del c


def test_a_window_puts_no_callback_on_ops(monkeypatch):
    """NOTE [No op events in a window]: a scope begun in one of a window's profiler sessions
    and ended in the next wrote into the first's freed events; a window records allocations
    only, so no scope takes a pointer into it, and its figures are those of the events."""
    sessions = []
    stop = alloc_events._disable_profiler

    def kept():
        results = stop()
        sessions.append({e.tag for e in results.experimental_event_tree()})
        return results
    monkeypatch.setattr(alloc_events, "_disable_profiler", kept)
    x, w = torch.randn(256, 64), torch.randn(64, 64, requires_grad=True)
    with alloc_events.Allocations() as outer:
        with torch.autograd.profiler.record_function("spans the inner window"):
            y = (x @ w).relu()
            with alloc_events.Allocations() as inner:
                z = torch.randn(128, 128)
            y.sum().backward()
    assert len(sessions) == 3  # the outer's first session, the inner's, the outer's second
    assert set().union(*sessions) == {torch._C._profiler._EventType.Allocation}
    assert (inner.peak, inner.net) == (1 << 16, 1 << 16)
    assert outer.peak >= (1 << 16) + 2 * y.untyped_storage().nbytes()
    del z


def test_plans_count_scratch_and_hold_their_limits(tmp_path):
    model, x = _conv_net(), torch.randn(8, 3, 16, 16)
    resident = resident_tensors(model, x)
    eager = measure_peak(lambda: _step(model, x), resident)
    model.zero_grad(set_to_none=True)
    with LiveBytes(resident) as counter:
        _step(model, x)
    model.zero_grad(set_to_none=True)
    assert eager > counter.peak  # the events see the convolutions' scratch
    opt = monet_opt.optimize(model, x, "100% of peak", profile_dir=tmp_path)
    assert opt.plan.predicted_peak_bytes >= eager  # scratch counted in the plan
    least = monet_opt.optimize(model, x, opt.plan.min_feasible_bytes, profile_dir=tmp_path)
    for module in (opt, least):
        _step(module, x)
        model.zero_grad(set_to_none=True)
        measured = measure_peak(lambda: _step(module, x), resident)
        model.zero_grad(set_to_none=True)
        assert measured <= module.plan.memory_limit_bytes
        assert measured == module.plan.predicted_peak_bytes


def test_quiet_and_inside_a_users_profiler(capfd):
    model, x = _conv_net(), torch.randn(2, 3, 16, 16)
    resident = resident_tensors(model, x)
    capfd.readouterr()
    events = measure_peak(lambda: _step(model, x), resident)
    assert capfd.readouterr().err == ""  # kineto's start and stop lines silenced
    model.zero_grad(set_to_none=True)
    with LiveBytes(resident) as counter:
        _step(model, x)
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        assert not alloc_events.available()
        inside = measure_peak(lambda: _step(model, x), resident)
        model.zero_grad(set_to_none=True)
        # no scratch counted there; the profiler says so once per plan, not once per op
        # (tests/test_profiler_plans.py)
        assert counted(lambda: torch.ones(3), False)[1] == 0
    assert inside == counter.peak <= events
    assert alloc_events.available()


def test_a_step_that_plans_inside_a_measurement_counts_scratch(tmp_path):
    """The plan for a new batch size is made inside measure_peak's window (the profiler's
    windows open inside it): it counts scratch as one made outside does."""
    model, x, wider = _conv_net(), torch.randn(4, 3, 16, 16), torch.randn(6, 3, 16, 16)
    opt = monet_opt.optimize(model, x, 1 << 30, profile_dir=None)
    resident = resident_tensors(model, wider)
    with pytest.warns(monet_opt.ReplanWarning):
        first = measure_peak(lambda: _step(opt, wider), resident)
    model.zero_grad(set_to_none=True)
    plan = list(opt.plans.values())[-1]
    again = measure_peak(lambda: _step(opt, wider), resident)
    model.zero_grad(set_to_none=True)
    assert again == plan.predicted_peak_bytes < first  # the first step profiled too
    alone = monet_opt.optimize(_conv_net(), wider, 1 << 30, profile_dir=None)
    assert alone.plan.predicted_peak_bytes == plan.predicted_peak_bytes


def test_switched_off_plans_count_what_ops_return(monkeypatch, tmp_path):
    """MONET_OPT_CPU_SCRATCH=0: plans and measure_peak by the live-bytes counter, as before
    2026-12-02."""
    monkeypatch.setenv(alloc_events.SWITCH, "0")
    model, x = _conv_net(), torch.randn(4, 3, 16, 16)
    opt = monet_opt.optimize(model, x, 1 << 30, profile_dir=tmp_path)
    resident = resident_tensors(model, x)
    _step(opt, x)
    model.zero_grad(set_to_none=True)
    with LiveBytes(resident) as counter:
        _step(opt, x)
    model.zero_grad(set_to_none=True)
    assert measure_peak(lambda: _step(opt, x), resident) == counter.peak \
        == opt.plan.predicted_peak_bytes


def test_switched_off_optimize_can_be_measured(monkeypatch, tmp_path):
    """MONET_OPT_CPU_SCRATCH=0: optimize() run inside measure_peak (the live-bytes counter,
    which then watched the trace's fake tensors: "invalid python storage", CaptureError) plans
    as outside it, its profiling counted."""
    monkeypatch.setenv(alloc_events.SWITCH, "0")
    model, x = _conv_net(), torch.randn(4, 3, 16, 16)
    resident = resident_tensors(model, x)
    made = {}
    peak = measure_peak(lambda: made.setdefault("opt", monet_opt.optimize(
        model, x, 1 << 30, profile_dir=tmp_path / "a")), resident)
    outside = monet_opt.optimize(model, x, 1 << 30, profile_dir=tmp_path / "b")
    assert made["opt"].plan.predicted_peak_bytes == outside.plan.predicted_peak_bytes
    assert peak > sum(t.untyped_storage().nbytes() for t in resident)


def test_the_allocators_warning_is_not_printed():
    """NOTE [The allocator's one warning]: a window that frees memory made before it (a step
    freeing the one before's) printed the CPU allocator's warning once per process."""
    code = ("import torch\nfrom monet_opt import alloc_events\n"
            "made = torch.randn(1000)\n"
            "with alloc_events.Allocations() as window:\n    del made\n"
            "print(window.peak, window.net)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0", "0"]
    assert "Memory block of unknown size" not in run.stderr, run.stderr
