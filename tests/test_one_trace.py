"""NOTE [One trace at a time] (monet_opt/capture.py): two threads' optimize() calls trace one
after the other, and the process's settings are as they were once both are done."""
from __future__ import annotations

import copy
import gc
import threading

import torch

import monet_opt
from tests.models import small_cnn


class _Announcing(torch.nn.Module):
    """`inner`, calling `first` before its first forward (the trace's)."""

    def __init__(self, inner: torch.nn.Module, first):
        super().__init__()
        self.inner, self.first, self.called = inner, first, threading.Event()

    def forward(self, x):
        if not self.called.is_set():
            self.called.set()
            self.first()
        return self.inner(x)


def test_two_threads_optimize_one_after_the_other():
    """Each thread saved the other's collector and compiling flag as the settings outside the
    trace and put those back: the collector stayed off for good after two threads' optimize()
    calls, and a patch of torch's could stay in place."""
    torch.manual_seed(0)
    base, x, loss_fn = small_cnn()
    a_in, b_in, overlapped, done = threading.Event(), threading.Event(), [], {}
    models = {"a": _Announcing(copy.deepcopy(base), lambda: (a_in.set(), overlapped.append(
                  b_in.wait(timeout=3)))),
              "b": _Announcing(copy.deepcopy(base), b_in.set)}
    collector = gc.isenabled()

    def plan(name):
        done[name] = monet_opt.optimize(models[name], x, 1 << 40, profile_dir=None,
                                        profile_repeats=1)

    first = threading.Thread(target=plan, args=("a",))
    first.start()
    assert a_in.wait(timeout=120)  # a traces; b's trace starts meanwhile and waits for it
    second = threading.Thread(target=plan, args=("b",))
    second.start()
    first.join(timeout=300)
    second.join(timeout=300)
    assert sorted(done) == ["a", "b"] and overlapped == [False]
    assert gc.isenabled() == collector and not torch.compiler.is_compiling()
    torch.manual_seed(1)
    loss_fn(base(x)).backward()
    for opt in done.values():
        torch.manual_seed(1)  # the same dropout masks
        loss_fn(opt(x)).backward()
        for p, q in zip(base.parameters(), opt.model.inner.parameters()):
            assert torch.equal(p.grad, q.grad)
