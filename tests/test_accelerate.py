"""accelerate's mixed precision around an optimized module (NOTE [Outputs accelerate makes
float32] in monet_opt/outputs_fp32.py)."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import monet_opt
from tests import models
from tests.test_executor import HUGE

accelerate = pytest.importorskip("accelerate")


def _prepared(base, batch, limit):
    opt = monet_opt.optimize(base, batch, limit, profile_repeats=1, profile_dir=None)
    return opt, accelerate.Accelerator(mixed_precision="bf16", cpu=True).prepare(opt)


def _step(module, batch):
    outputs = module(**batch)  # held through the backward, as accelerate's examples do
    outputs.loss.backward()
    assert outputs.logits.dtype == torch.float32


def test_float32_outputs_held_through_the_backward_are_planned():
    """Prepared after optimize(), accelerate copied the bfloat16 outputs to float32 after the
    step, and the loop held the copies through the backward, unplanned: 90,932 B over a limit
    on GPT-2, unwarned. The copies are the step's now: within the limit, eager's gradients."""
    torch.manual_seed(0)
    base, x, _ = models.gpt2_tiny(dropout=0.0)
    batch = {"input_ids": x["input_ids"], "labels": x["input_ids"].clone()}
    eager = copy.deepcopy(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        warnings.simplefilter("ignore", monet_opt.OutputsHeldWarning)
        probe, prepared = _prepared(copy.deepcopy(base), batch, HUGE)
        prepared(**batch)
        logits = batch["input_ids"].numel() * base.config.vocab_size * 4
        limit = list(probe.plans.values())[-1].predicted_peak_bytes + logits // 2
        opt, prepared = _prepared(base, batch, limit)
        for _ in range(2):  # planned for autocast, then with the outputs held
            _step(prepared, batch)
            base.zero_grad(set_to_none=True)
    measured = monet_opt.measure_peak(lambda: _step(prepared, batch),
                                      monet_opt.resident_tensors(base, batch))
    assert measured <= limit
    _step(accelerate.Accelerator(mixed_precision="bf16", cpu=True).prepare(eager), batch)
    for (name, p), q in zip(base.named_parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_a_module_around_it_prepared_is_warned_about():
    """Prepared around the optimized module (or torch.compile(opt) prepared), accelerate's
    conversion is no step's: said (it passed a limit by 90,924 B on GPT-2, unwarned)."""
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(8, 16)
    opt = monet_opt.optimize(net, x, HUGE, profile_repeats=1, profile_dir=None)
    around = accelerate.Accelerator(mixed_precision="bf16", cpu=True).prepare(
        torch.nn.Sequential(opt))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.ReplanWarning)
        with pytest.warns(monet_opt.OutputsHeldWarning, match="a module around the optimized"):
            around(x).sum().backward()
