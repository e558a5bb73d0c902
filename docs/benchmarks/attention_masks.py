"""What NOTE [Constant attention masks] is worth: HF GPT-2 without dropout (its attention then
runs one fused kernel, forward and backward), eager against our store-all step with the traced
mask kept (as before the note) and dropped, steps interleaved in a shuffled order each round.

    python docs/benchmarks/attention_masks.py [--device cpu] [--batch 2] [--seq 512] [--rounds 7]
        [--width 768] [--heads 12] [--vocab 50257]

Prints markdown (docs/benchmarks/attention_masks.md)."""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
import warnings

import torch

import monet_opt
from monet_opt import attention_masks
from monet_opt.bench.run import device_name, git_commit


def build(batch: int, seq: int, device: str, width: int, heads: int, vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=seq, n_embd=width, n_head=heads, vocab_size=vocab,
                     use_cache=False, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).to(device).train()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    return model, {"input_ids": ids}


def optimized(model, x, drop: bool):
    keep = attention_masks.drop_constant_masks
    if not drop:
        attention_masks.drop_constant_masks = lambda gm: 0
    try:
        return monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None)
    finally:
        attention_masks.drop_constant_masks = keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    commit = git_commit()
    model, x = build(args.batch, args.seq, args.device, args.width, args.heads, args.vocab)
    methods = {"eager": model, "store-all, mask kept": optimized(model, x, drop=False),
               "store-all, mask dropped": optimized(model, x, drop=True)}
    cuda = args.device.startswith("cuda")

    def step(m):
        (m if m is model else m.model).zero_grad(set_to_none=True)
        m(**x).logits.sum().backward()
        if cuda:
            torch.cuda.synchronize()

    for m in methods.values():
        step(m)
    times: dict[str, list[float]] = {name: [] for name in methods}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(methods)
        rng.shuffle(order)
        for name in order:
            start = time.perf_counter()
            step(methods[name])
            times[name].append(time.perf_counter() - start)
    eager = statistics.median(times["eager"])
    print(f"# HF GPT-2 ({args.width} wide, {args.heads} heads, vocabulary {args.vocab}, batch "
          f"{args.batch} x {args.seq}, no dropout): the traced causal mask kept or dropped\n")
    print(f"`python docs/benchmarks/attention_masks.py --device {args.device} --batch "
          f"{args.batch} --seq {args.seq} --rounds {args.rounds} --width {args.width} --heads "
          f"{args.heads} --vocab {args.vocab}`; {device_name(torch.device(args.device))}, "
          f"torch {torch.__version__}, commit {commit}.\n")
    print("| method | step s (median) | vs eager | predicted peak MiB | steps (s) |")
    print("|---|---|---|---|---|")
    for name, m in methods.items():
        median = statistics.median(times[name])
        plan = getattr(m, "plan", None)
        peak = "-" if plan is None else f"{plan.predicted_peak_bytes / 2**20:,.1f}"
        print(f"| {name} | {median:.3f} | {median / eager - 1:+.1%} | {peak} | "
              f"{' '.join(f'{t:.2f}' for t in times[name])} |")


if __name__ == "__main__":
    main()
