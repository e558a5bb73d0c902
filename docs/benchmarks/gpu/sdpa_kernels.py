"""Which attention kernel eager runs and which our traced step runs, on HF GPT-2 under bfloat16
autocast, with attention dropout on and off, and whether the gradients then agree bitwise.

Seen on CUDA before (session 41's note): with the traced causal mask dropped (NOTE [Constant
attention masks]) our step keeps the kernel chosen while tracing with a mask, the memory-efficient
one, where eager, given no mask, may pick flash; with dropout the two kernels draw their masks
differently, so the step would not train like eager's. This prints what each runs. Run by
next_run.sh from the checkout's root; `--device cpu` is a dry run here.
"""
from __future__ import annotations

import argparse
import copy

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import monet_opt
from tests.test_executor import HUGE


class _AttentionOps(TorchDispatchMode):
    """Counts the attention ops dispatched (forward and backward kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if "attention" in name:
            self.seen[name] = self.seen.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _model(dropout: float, device: str):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=512, vocab_size=2048,
                     use_cache=False, attn_pdrop=dropout, resid_pdrop=dropout,
                     embd_pdrop=dropout, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).to(device).train()
    ids = torch.randint(0, 2048, (4, 512), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids.to(device)}


def _step(module, x, device: str, seed: int) -> dict[str, int]:
    torch.manual_seed(seed)
    with _AttentionOps() as ops:
        with torch.autocast(device, dtype=torch.bfloat16):
            out = module(**x)
        out.logits.float().sum().backward()
    return ops.seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    device = ap.parse_args().device
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {where}")
    for dropout in (0.0, 0.1):
        model, x = _model(dropout, device)
        eager = copy.deepcopy(model)
        with torch.autocast(device, dtype=torch.bfloat16):
            opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None,
                                     time_limit_s=5)
        ours_ops = _step(opt, x, device, seed=7)
        eager_ops = _step(eager, x, device, seed=7)
        pairs = list(zip(model.parameters(), eager.parameters()))
        diff = max((a.grad.float() - b.grad.float()).abs().max().item() for a, b in pairs)
        rel = max(((a.grad.float() - b.grad.float()).abs().max()
                   / b.grad.float().abs().max()).item() for a, b in pairs)
        print(f"dropout {dropout}: eager {eager_ops}; ours {ours_ops}; "
              f"max |grad difference| {diff:.3g}, relative to the largest gradient {rel:.3g}")


if __name__ == "__main__":
    main()
