"""NOTE [Steps in flight]: a step that begins while an earlier one waits for its backward
warns, since the plan covers one step; otherwise nothing is said."""
from __future__ import annotations

import copy
import threading
import warnings

import pytest
import torch

import monet_opt
from monet_opt import capture
from tests.models import small_cnn

HUGE = 1 << 40


def _half(base, x) -> monet_opt.OptimizedModule:
    full = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_dir=None, profile_repeats=1)
    p = full.plan  # halfway from the least peak to store-all: some recomputed, and reachable
    #                (NOTE [Limits between the least peak and store-all] in tests/limits.py)
    limit = (p.min_feasible_bytes + p.store_all_peak_bytes) // 2
    return monet_opt.optimize(copy.deepcopy(base), x, limit, profile_dir=None,
                              profile_repeats=1, time_limit_s=5)


def _in_flight_warnings(fn) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [w for w in seen if w.category is monet_opt.StepsInFlightWarning]


def test_two_forwards_before_a_backward_warn():
    """Two forwards, then one backward: warned, at the second forward's line; the peak passes
    the plan's prediction (what the warning is about) and the gradients are eager's."""
    torch.manual_seed(0)
    base, x, loss_fn = small_cnn()
    opt, eager = _half(base, x), copy.deepcopy(base)
    x2 = torch.randn_like(x)
    resident = monet_opt.resident_tensors(opt.model, x)
    peaks = []

    def two_forwards():
        torch.manual_seed(1)
        peaks.append(monet_opt.measure_peak(
            lambda: (loss_fn(opt(x)) + loss_fn(opt(x2))).backward(), resident))
    seen = _in_flight_warnings(two_forwards)
    assert len(seen) == 1 and seen[0].filename == __file__, [str(w.message) for w in seen]
    assert "1 earlier step(s)" in str(seen[0].message)
    assert peaks[0] > opt.plan.predicted_peak_bytes
    torch.manual_seed(1)
    (loss_fn(eager(x)) + loss_fn(eager(x2))).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(opt.model.parameters(),
                                                          eager.parameters()))


def test_steps_one_after_another_are_quiet():
    """Each backward before the next forward, a forward whose graph was dropped, one under
    no_grad, and a retained graph's second backward: no warning. An output kept alive without
    its backward: warned at the next step."""
    base, x, loss_fn = small_cnn()
    opt = monet_opt.optimize(base, x, HUGE, profile_dir=None, profile_repeats=1)

    def quiet():
        for _ in range(2):
            loss_fn(opt(x)).backward()
        opt(x)  # dropped at once
        with torch.no_grad():
            opt(x)
        loss = loss_fn(opt(x))
        loss.backward(retain_graph=True)
        loss_fn(opt(x)).backward()
        loss.backward()
    assert not _in_flight_warnings(quiet)
    kept = opt(x)
    assert len(_in_flight_warnings(lambda: loss_fn(opt(x)).backward())) == 1
    del kept
    assert not _in_flight_warnings(lambda: loss_fn(opt(x)).backward())


def test_steps_of_two_threads_at_once_warn():
    """Forwards that overlap in two threads: neither step was watched yet when the other
    began, so half such pairs went unwarned (NOTE [Steps in flight])."""
    torch.manual_seed(0)
    model, x, loss_fn = small_cnn()
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    for _ in range(6):
        begun, ended = threading.Barrier(2), threading.Barrier(2)

        def work():
            begun.wait(timeout=30)
            loss = loss_fn(opt(x))
            ended.wait(timeout=30)  # both forwards done before either backward
            loss.backward()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            threads = [threading.Thread(target=work) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
        assert any(w.category is monet_opt.StepsInFlightWarning for w in seen)
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.StepsInFlightWarning)
        loss_fn(opt(x)).backward()  # nothing left counted as in flight
        loss_fn(opt(x)).backward()


def test_a_batch_made_in_inference_mode_says_what_to_do():
    """NOTE [Inference tensors kept]: the plan keeps the input, so it is refused before the
    step runs: no BatchNorm statistics updated, no random numbers drawn (they were, as
    autograd raised only once the forward had run)."""
    torch.manual_seed(0)
    model, x, loss_fn = small_cnn()
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    with torch.inference_mode():
        batch = x.clone()
    state, rng = copy.deepcopy(model.state_dict()), torch.get_rng_state()
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved.*torch.no_grad"):
        loss_fn(opt(batch)).backward()  # its first convolution keeps its input
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.StepsInFlightWarning)
        loss_fn(opt(x)).backward()  # the failed forward is in flight no more


def test_a_step_runs_while_another_thread_compiles():
    """Compiling on fakes sets a flag that makes compiled forwards stop; it was the process's,
    so a step run in another thread meanwhile raised capture._Compiled (CI, two threads
    stepping one module while one planned anew)."""
    torch.manual_seed(0)
    model, x, loss_fn = small_cnn()
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    entered, release = threading.Event(), threading.Event()

    def compiling(*fakes):
        entered.set()
        release.wait(timeout=30)
        raise capture._Compiled

    other = threading.Thread(target=capture._compile_on_fakes, args=(compiling, [x]))
    other.start()
    try:
        assert entered.wait(timeout=30)
        loss_fn(opt(x)).backward()  # runs, here, while the other thread compiles
    finally:
        release.set()
        other.join(timeout=30)
    assert all(p.grad is not None for p in model.parameters())
