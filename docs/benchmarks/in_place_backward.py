"""The least peak "auto" reaches on a model, and the plan at that limit measured against its
prediction and against eager (gradients and BatchNorm statistics bitwise, seeded): the figures
of docs/benchmarks/in_place_backward.md (NOTEs [BatchNorm's gradient in place], [Elementwise
backward ops in place] in monet_opt/grad_in_place.py, [A ReLU's mask and its gradient in
place] in monet_opt/variants_bits.py, [In-place accumulation] in solvers/problem.py).

    .venv/bin/python docs/benchmarks/in_place_backward.py resnet18 16 112
    .venv/bin/python docs/benchmarks/in_place_backward.py resnet50 16 128
    .venv/bin/python docs/benchmarks/in_place_backward.py gpt2_narrow 4 256
"""
import copy
import sys
import tempfile
import time

import torch
import torchvision

import monet_opt
from monet_opt import zoo


def build(name: str, batch: int, size: int):
    torch.manual_seed(0)
    if name == "gpt2_narrow":
        return zoo.gpt2_narrow(batch, size)
    kw = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    model = getattr(torchvision.models, name)(num_classes=100, **kw).train()
    return model, torch.randn(batch, 3, size, size)


def step(module, x):
    """out.sum(), the output not held through the backward: its gradient is an expanded
    scalar, which the plan counts (a full-size one, as out.square().sum() makes, it does not:
    NOTE [The output's gradient] in monet_opt/lower.py; an output held through the backward
    is planned for from the next call on: NOTE [Outputs held through the backward])."""
    (module(**x) if isinstance(x, dict) else module(x)).sum().backward()


def main(name: str, batch: int, size: int) -> None:
    torch.set_num_threads(2)
    model, x = build(name, batch, size)
    eager = copy.deepcopy(model)
    folder = tempfile.mkdtemp()
    start = time.perf_counter()
    try:
        monet_opt.optimize(copy.deepcopy(model), x, 1, profile_dir=folder)
        raise SystemExit("a 1-byte limit was met")
    except monet_opt.InfeasibleBudgetError as err:
        least = err.min_feasible_bytes
    opt = monet_opt.optimize(model, x, least, profile_dir=folder)
    print(opt.plan.explain().split("\n\n")[0])
    grads = []
    for module, owner in ((opt, model), (eager, eager)):
        owner.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        step(module, x)
        grads.append([p.grad for p in owner.parameters()])
    same = all(torch.equal(a, b) for a, b in zip(*grads)) and \
        all(torch.equal(a, b) for a, b in zip(model.buffers(), eager.buffers()))
    model.zero_grad(set_to_none=True)
    measured = monet_opt.measure_peak(lambda: step(opt, x), monet_opt.resident_tensors(model, x))
    print(f"{name} b{batch} {size}: least {least / 2**20:.2f} MiB, predicted "
          f"{opt.plan.predicted_peak_bytes:,} B, measured {measured:,} B "
          f"({measured - opt.plan.predicted_peak_bytes:+,} B), bitwise eager's: {same}, "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
