"""How long solver="auto" takes against the time limit it is asked for (NOTE [Short limits] in
solvers/timeshare.py; the README's Solvers section): a 2-layer GPT-2 profiled here (195 ops)
and the kept CPU problems of GoogLeNet (655 ops) and ResNet-50 (555 ops), at half and a third
of their store-all activations. Run from the checkout's root: `python
docs/benchmarks/time_limits.py [--limits 0.5,2,5,30] [--models gpt2_2l,googlenet,resnet50]`; it
prints markdown. Wall-clock times: run it alone on the machine."""
from __future__ import annotations

import argparse
import os
import platform
import time

import torch

import solvers
from remat import problem  # docs/benchmarks/remat.py: a kept problem by model and file

MODELS = ("gpt2_2l", "googlenet", "resnet50")
SHARES = (0.5, 1 / 3)


def gpt2_2l() -> tuple[solvers.Problem, str]:
    """A 2-layer GPT-2 (HF's, random init), batch 4 of 128 tokens, profiled here."""
    from transformers import GPT2Config, GPT2LMHeadModel

    import monet_opt
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=8000,
                                       n_positions=128, use_cache=False)).train()
    p = monet_opt.lower_problem(model, torch.randint(0, 8000, (4, 128)), profile_repeats=3)
    return p, "GPT-2 2 layers, 256 wide, batch 4 x 128 tokens (profiled now)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limits", default="0.5,2,5,30", help="seconds asked, comma-separated")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    limits = [float(s) for s in args.limits.split(",")]
    chosen = args.models.split(",")
    print(f"Command: `python docs/benchmarks/time_limits.py --limits {args.limits} --models "
          f"{args.models}`; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f} at start\n")
    print("| problem | ops | budget | asked s | took s | solver | predicted overhead |")
    print("|---|---|---|---|---|---|---|")
    for name in chosen:
        p, key = gpt2_2l() if name == "gpt2_2l" else problem(name, "cpu")
        store = solvers.simulate(p, solvers.schedule_from_kept(p, p.saved_for_backward))
        floor = p.fixed_bytes + sum(p.tensors[t].bytes for t in p.backward_outputs)
        for share in SHARES:
            budget = int(floor + share * (store.peak_bytes - floor))
            for limit in limits:
                begun = time.perf_counter()
                r = solvers.solve(p, budget, "auto", time_limit_s=limit)
                took = time.perf_counter() - begun
                overhead = f"{r.objective_s / store.time_s - 1:+.1%}" if r.feasible else "-"
                print(f"| {key} | {len(p.ops)} | {share:.0%} of activations | {limit:g} | "
                      f"{took:.1f} | {r.solver} | {overhead} |", flush=True)


if __name__ == "__main__":
    main()
