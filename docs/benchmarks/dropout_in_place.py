"""A transformer's plans with and without dropout's gradient written in place (NOTE [Dropout's
gradient in place] in monet_opt/grad_in_place.py): the figures of
docs/benchmarks/dropout_in_place.md. One profile per run (a fresh profile directory); at each
limit the plan's predicted peak and step time, one step measured against the prediction, and
gradients bitwise eager's (seeded: the same dropout masks).

    .venv/bin/python docs/benchmarks/dropout_in_place.py gpt2_narrow 4 256
    .venv/bin/python docs/benchmarks/dropout_in_place.py bert_base 4 128
"""
import copy
import sys
import tempfile

import torch

import monet_opt
from monet_opt import zoo

LIMITS = ("store-all", "50% of activations", "33% of activations", "least")


def step(module, x):
    """out.sum(), the output not held through the backward (as docs/benchmarks/
    in_place_backward.py)."""
    module(**x).sum().backward()


def least_peak(model, x, folder) -> int:
    try:
        monet_opt.optimize(copy.deepcopy(model), x, 1, profile_dir=folder)
    except monet_opt.InfeasibleBudgetError as err:
        return err.min_feasible_bytes
    raise SystemExit("a 1-byte limit was met")


def main(name: str, batch: int, size: int) -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model, x = getattr(zoo, name)(batch, size)
    folder = tempfile.mkdtemp()
    in_place = sum(1 for op in monet_opt.lower_problem(copy.deepcopy(model), x).ops
                   if op.name.startswith("native_dropout_backward") and op.inplace_bytes)
    print(f"{name} b{batch} {size}: {in_place} dropout backwards in place")
    for limit in LIMITS:
        asked = {"store-all": 1 << 40, "least": None}.get(limit, limit)
        if asked is None:
            asked = least_peak(model, x, folder)
        mine, eager = copy.deepcopy(model), copy.deepcopy(model)
        opt = monet_opt.optimize(mine, x, asked, profile_dir=folder)
        grads = []
        for module, owner in ((opt, mine), (eager, eager)):
            torch.manual_seed(1)
            step(module, x)
            grads.append([p.grad for p in owner.parameters()])
        same = all(torch.equal(a, b) for a, b in zip(*grads))
        mine.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        measured = monet_opt.measure_peak(lambda: step(opt, x),
                                          monet_opt.resident_tensors(mine, x))
        plan = opt.plan
        print(f"  {limit:>20}: predicted {plan.predicted_peak_bytes / 2**20:.2f} MiB, "
              f"{plan.predicted_step_time_s * 1e3:.0f} ms ({plan.predicted_overhead:+.1%}), "
              f"measured {measured - plan.predicted_peak_bytes:+,} B off, "
              f"bitwise eager's: {same}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
