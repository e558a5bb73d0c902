"""NOTE [Attention kernels are traced] in monet_opt/kernels.py: steps under sdpa_kernel(...) run
the kernel eager runs there."""
from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import monet_opt


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 64, 3, 4, 8).permute(2, 0, 3, 1, 4)
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        .transpose(1, 2).reshape(2, 64, 32))


def test_a_step_under_other_attention_kernels_is_eager_s():
    """Under sdpa_kernel(MATH) the step ran the kernel traced outside it: outputs 1.2e-7,
    a gradient 2.9e-6 from eager's, silently."""
    torch.manual_seed(0)
    model, x = _Attention(), torch.randn(2, 64, 32)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    with sdpa_kernel(SDPBackend.MATH):
        with pytest.warns(monet_opt.ReplanWarning, match="attention kernels math"):
            ours = opt(x)
        theirs = eager(x)
        ours.square().sum().backward()
        theirs.square().sum().backward()
    assert torch.equal(ours, theirs)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           eager.parameters()))


def test_a_step_with_cudnn_turned_off_is_planned_for_it():
    """A BatchNorm's kernel is chosen as the step is traced (cuDNN's on CUDA): under
    cudnn.flags(enabled=False) the step ran cuDNN's where eager runs ATen's. The flag is part
    of the step's key where torch sees a GPU (on CPU nothing changes: no plan for it, a
    needless one before)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    x = torch.randn(2, 3, 12, 12)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    cuda = torch.cuda.is_available()  # without a GPU the flag changes nothing: no new plan
    with torch.backends.cudnn.flags(enabled=not torch.backends.cudnn.enabled):
        with pytest.warns(monet_opt.ReplanWarning, match="cuDNN o") if cuda else \
                warnings.catch_warnings():
            if not cuda:
                warnings.simplefilter("error", monet_opt.ReplanWarning)
            ours = opt(x)
        theirs = eager(x)
    assert torch.equal(ours, theirs)
    assert len(opt.plans) == 1 + cuda


def test_a_step_with_onednn_turned_off_is_planned_for_it():
    """A CPU convolution without oneDNN keeps an unfolded copy of its input: the plan made with
    it on did not hold the step's peak. Under mkldnn.flags(enabled=False) the step is planned
    again, on a profile measured so (NOTE [Backend settings in the key]), and trains as eager."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
    x = torch.randn(2, 3, 12, 12)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    with torch.backends.mkldnn.flags(enabled=not torch.backends.mkldnn.enabled):
        with pytest.warns(monet_opt.ReplanWarning, match="oneDNN off here"):
            ours = opt(x)
        theirs = eager(x)
        ours.square().sum().backward()
        theirs.square().sum().backward()
    assert torch.equal(ours, theirs) and len(opt.plans) == 2
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           eager.parameters()))


def test_a_step_under_deterministic_algorithms_is_planned_for_it():
    """AOTAutograd refuses a backward made under the other use_deterministic_algorithms: every
    step after turning it on raised, where eager trains. The step is planned for it now, and
    the first plan serves again once it is turned off."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(not was)
    try:
        with pytest.warns(monet_opt.ReplanWarning, match="deterministic algorithms o"):
            opt(x).square().sum().backward()
        eager(x).square().sum().backward()
    finally:
        torch.use_deterministic_algorithms(was)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           eager.parameters()))
    model.zero_grad(set_to_none=True)
    eager.zero_grad(set_to_none=True)
    opt(x).square().sum().backward()
    eager(x).square().sum().backward()
    assert len(opt.plans) == 2
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           eager.parameters()))


@pytest.mark.parametrize("setting", ["threads", "matmul"])
def test_a_step_under_settings_that_pick_other_kernels_is_planned_for_them(setting):
    """oneDNN's convolution backward keeps scratch per thread, and a float32 matmul precision
    of "medium" runs bfloat16 kernels: a plan made before either changed measured 29,952 B and
    3 % over its limit, stepping on with the old plan. The step is planned again now, for the
    memory measured under the setting (NOTE [Backend settings in the key])."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 4))
    x = torch.randn(4, 3, 12, 12)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    if setting == "threads":
        torch.set_num_threads(threads + 1)
    else:
        torch.set_float32_matmul_precision("medium")
    try:
        with pytest.warns(monet_opt.ReplanWarning, match=f"{threads + 1} threads here"
                          if setting == "threads" else "matmul precision medium here"):
            opt(x).sum().backward()
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)
    assert len(opt.plans) == 2


def test_precisions_set_per_backend_train_and_are_told_apart():
    """NOTE [Two precision APIs]: with the per-backend float32 precisions set, torch's legacy
    getter raises; monet_opt read it at import and at every step, so neither ran. In a process
    of its own, as the setting is global: set before import, the step trains as eager does;
    set after optimize() (oneDNN's matmul in bfloat16), the step is planned again."""
    code = textwrap.dedent("""
        import copy, warnings, torch
        from torch import nn
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        import monet_opt
        torch.manual_seed(0)
        model, x = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), torch.randn(8, 16)
        eager = copy.deepcopy(model)
        opt = monet_opt.optimize(model, x, "100% of peak", profile_dir=None, profile_repeats=1)
        opt(x).sum().backward(); eager(x).sum().backward()
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                                 eager.parameters()))
        model.zero_grad(set_to_none=True)
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            opt(x).sum().backward()
        said = [str(w.message) for w in seen if issubclass(w.category, monet_opt.ReplanWarning)]
        assert len(said) == 1 and "mkldnn.matmul bf16" in said[0], said
        print("trained")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0 and "trained" in run.stdout, run.stderr[-2000:]
