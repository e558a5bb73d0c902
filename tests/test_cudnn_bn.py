"""NOTE [cuDNN's BatchNorm]'s wiring, without a GPU: where a training BatchNorm is to run other
kernels, the profiler times those and the executor's graphs call them, in the forward, in each
rerun and in the backward. Here the "other kernels" are stand-ins that count their calls and
run ATen's own, so the step stays bitwise eager's; tests/test_cuda.py runs cuDNN's."""
from __future__ import annotations

import collections
import copy

import torch
from torch import nn

import monet_opt
from monet_opt import cudnn_bn
from tests.test_executor import HUGE, assert_same, run_steps


def _stand_ins(monkeypatch) -> collections.Counter:
    calls: collections.Counter = collections.Counter()

    def counted(name, op):
        def run(*args, **kwargs):
            calls[name] += 1
            return op(*args, **kwargs)
        return run

    for target, name in ((cudnn_bn.TRAIN, "forward"), (cudnn_bn.RECOMPUTE, "rerun"),
                         (cudnn_bn.BACKWARD, "backward")):
        monkeypatch.setitem(cudnn_bn._KERNELS, target, counted(name, target))
    # NOTE [Statistics updated in place]: the forward's BatchNorms update their buffers
    monkeypatch.setitem(cudnn_bn._IN_PLACE, cudnn_bn.TRAIN,
                        counted("forward", torch.ops.aten._native_batch_norm_legit.default))
    monkeypatch.setattr(cudnn_bn, "runs_cudnn", lambda *args: True)
    return calls


def test_the_swapped_kernels_are_profiled_and_run(monkeypatch):
    calls = _stand_ins(monkeypatch)
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    x = torch.randn(4, 3, 16, 16)
    loss_fn = lambda out: out.sum()  # noqa: E731
    eager = copy.deepcopy(base)
    eager_run = run_steps(eager, eager, x, loss_fn)
    # variants off: no BatchNorm is split (NOTE [BatchNorm recomputed from its statistics]), so
    # a rerun is the no-stats form's
    full = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, variants=False,
                              profile_dir=None)
    assert calls["forward"] > 0 and calls["backward"] > 0, calls  # the profiler's runs
    calls.clear()
    assert_same(run_steps(full, full.model, x, loss_fn), eager_run, exact=True,
                what="store-all plan vs eager")
    steps = len(eager_run[0])
    assert calls == {"forward": 2 * steps, "backward": 2 * steps}, calls
    least = monet_opt.optimize(copy.deepcopy(base), x, full.plan.min_feasible_bytes,
                               profile_repeats=1, variants=False, profile_dir=None)
    assert least.plan.recomputed_ops > 0
    calls.clear()
    assert_same(run_steps(least, least.model, x, loss_fn), eager_run, exact=True,
                what="least plan vs eager")
    assert calls["forward"] == 2 * steps and calls["backward"] == 2 * steps, calls
    assert calls["rerun"] > 0, calls


def test_only_cuda_batchnorms_are_swapped():
    """On CPU, eager runs ATen's kernels, and so does every graph."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        x, w = mode.from_tensor(torch.randn(4, 8, 5, 5)), mode.from_tensor(torch.ones(8))
    assert not cudnn_bn.runs_cudnn(x, w, w, w, w, 1e-5)
    assert not cudnn_bn.runs_cudnn(torch.randn(4, 8, 5, 5), None, None, None, None, 1e-5)
