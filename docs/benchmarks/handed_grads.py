"""Gradients against eager's under losses that hand the step an expanded output gradient (NOTE
[Output gradients as handed] in monet_opt/handed_grads.py): the figures of
docs/benchmarks/handed_grads.md. Per model and loss: the store-all plan's one step from the
same weights and buffers as eager's, the largest relative difference of any gradient or
buffer (0: bitwise), and the step's measured peak less the plan's prediction.

    .venv/bin/python docs/benchmarks/handed_grads.py
"""
import copy

import torch

import monet_opt
from monet_opt import zoo

MODELS = {"resnet50": (8, 64), "mobilenet_v2": (8, 64), "densenet121": (8, 64),
          "googlenet": (8, 64), "unet": (3, 64), "vgg16": (8, 32), "gpt2_narrow": (3, 64),
          "bert_base": (3, 32)}
LOSSES = {"out.sum()": lambda out: out.sum(), "out.sum() * 1.3": lambda out: out.sum() * 1.3,
          "out.sum(0).sum() / 3": lambda out: out.sum(0).sum() / 3}


def output(out):
    return out if isinstance(out, torch.Tensor) else out[0]


def call(module, x):
    return module(**x) if isinstance(x, dict) else module(x)


def differences(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """The largest relative difference between a's and b's gradients and buffers."""
    pairs = [(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters())]
    pairs += [(u, v) for u, v in zip(a.buffers(), b.buffers()) if u.is_floating_point()]
    return max(((u.double() - v.double()).abs().max() /
                v.double().abs().max().clamp_min(1e-30)).item() for u, v in pairs)


def main() -> None:
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, CPU, one step of the store-all plan\n")
    print("| model (batch, size) | loss | gradients and buffers vs eager (max relative) | "
          "measured - predicted peak |")
    print("|---|---|---|---|")
    for name, (batch, size) in MODELS.items():
        torch.manual_seed(0)
        model, x = getattr(zoo, name)(batch, size)
        opt = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                                 profile_repeats=1)
        for label, loss in LOSSES.items():
            eager = copy.deepcopy(opt.model)
            opt.model.zero_grad(set_to_none=True)
            resident = monet_opt.resident_tensors(opt.model, x)
            torch.manual_seed(1)
            peak = monet_opt.measure_peak(lambda: loss(output(call(opt, x))).backward(),
                                          resident)
            torch.manual_seed(1)
            loss(output(call(eager, x))).backward()
            diff = differences(opt.model, eager)
            print(f"| {name} ({batch}, {size}) | `{label}` | {diff:.2g} | "
                  f"{peak - opt.plan.predicted_peak_bytes:+,} B |", flush=True)
            opt.model.load_state_dict(eager.state_dict())  # buffers as eager's again


if __name__ == "__main__":
    main()
