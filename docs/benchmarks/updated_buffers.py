"""Models whose forward updates their own state: the weight normalizations (spectral_norm,
weight_norm, old hooks and parametrizations) on tests/models.py's SmallCNN, a quantization-aware
MLP and a MoCo (tests/test_weight_hooks.py, tests/test_data_assigned.py), with no limit and at
the least peak. For each plan: ops recomputed, predicted and measured peak, and whether three
SGD steps (zero_grad between them) were bitwise eager's, or the error raised (NOTE [Buffers the
step updates], NOTE [Attributes set before read], NOTE [Parameters assigned through .data]).

    PYTHONPATH=. .venv/bin/python docs/benchmarks/updated_buffers.py
"""
from __future__ import annotations

import copy
import warnings

import torch

import monet_opt
from monet_opt.bench.settings import git_commit
from tests import test_data_assigned, test_weight_hooks

HUGE = 1 << 40


def _qat():
    quant = torch.ao.quantization
    torch.manual_seed(0)
    model = torch.nn.Sequential(quant.QuantStub(), torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4), quant.DeQuantStub())
    model.qconfig = quant.get_default_qat_qconfig("fbgemm")
    quant.prepare_qat(model.train(), inplace=True)
    x = torch.randn(32, 16)
    model(x)
    return model, copy.deepcopy(model), (x,), lambda: (torch.randn(32, 16),)


def _moco():
    torch.manual_seed(0)
    model = test_data_assigned.MoCo()
    batch = lambda: (torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16))  # noqa: E731
    return model, copy.deepcopy(model), batch(), batch


def _normed(wrap: str):
    batch = lambda: (torch.randn(4, 3, 16, 16),)  # noqa: E731
    # two builds: the old weight_norm's module cannot be deep-copied
    return test_weight_hooks._net(wrap), test_weight_hooks._net(wrap), batch(), batch


def _loss(out):
    return out if out.dim() == 0 else out.square().mean()


def _steps(module, owner, batches) -> list:
    opt = torch.optim.SGD(owner.parameters(), lr=0.05)
    states = []
    for k, batch in enumerate(batches):
        torch.manual_seed(k)  # the same dropout masks for both
        _loss(module(*batch)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        states.append([t.clone() for t in owner.state_dict().values()])
    return states


def row(name: str, build, least: bool) -> str:
    model, eager, sample, batch = build()
    limit = HUGE
    if least:
        limit = monet_opt.optimize(build()[0], sample, HUGE, profile_dir=None,
                                   profile_repeats=1).plan.min_feasible_bytes
    opt = monet_opt.optimize(model, sample, limit, profile_dir=None, profile_repeats=1,
                             time_limit_s=10)
    plan = opt.plan
    batches = [batch() for _ in range(3)]
    try:
        ours, theirs = _steps(opt, model, batches), _steps(eager, eager, batches)
    except RuntimeError as exc:
        return (f"| {name} | {'least' if least else 'no limit'} | {plan.recomputed_ops} | "
                f"{plan.predicted_peak_bytes:,} | - | - | raised: "
                f"{str(exc).split('.')[0].split('(')[0][:70]} |")
    same = all(torch.equal(a, b) for s, t in zip(ours, theirs) for a, b in zip(s, t))
    model.zero_grad(set_to_none=True)
    measured = monet_opt.measure_peak(lambda: _loss(opt(*sample)).backward(),
                                      monet_opt.resident_tensors(model, sample))
    return (f"| {name} | {'least' if least else 'no limit'} | {plan.recomputed_ops} | "
            f"{plan.predicted_peak_bytes:,} | {measured:,} | "
            f"{plan.predicted_peak_bytes - measured:+,} | {'yes' if same else '**no**'} |")


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    print(f"`PYTHONPATH=. .venv/bin/python docs/benchmarks/updated_buffers.py` at "
          f"{git_commit()[:7]}, torch {torch.__version__}, CPU\n")
    print("| model | plan | ops recomputed | predicted peak B | measured B | predicted - "
          "measured B | three steps bitwise eager's |")
    print("|---|---|---|---|---|---|---|")
    builds = {**{f"SmallCNN, {w}": (lambda w=w: _normed(w)) for w in test_weight_hooks.WRAPS},
              "QAT MLP": _qat, "MoCo": _moco}
    for name, build in builds.items():
        for least in (False, True):
            print(row(name, build, least), flush=True)


if __name__ == "__main__":
    main()
