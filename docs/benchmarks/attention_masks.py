"""What NOTE [Constant attention masks] is worth: HF GPT-2 without dropout (its attention then
runs one fused kernel, forward and backward), eager against our store-all step with the traced
mask kept (as before the note) and dropped, steps interleaved in a shuffled order each round.
With --kv-heads, what NOTE [Grouped-query attention] is worth: HF Llama with that many
key/value heads, our step with the keys and values repeated (as before the note; the mask
dropped) and grouped.

    python docs/benchmarks/attention_masks.py [--device cpu] [--batch 2] [--seq 512] [--rounds 7]
        [--width 768] [--heads 12] [--vocab 50257] [--kv-heads N --layers 12]

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
from monet_opt import attention_masks, grouped_attention
from monet_opt.bench.run import device_name
from monet_opt.bench.settings import git_commit


def build(batch: int, seq: int, device: str, width: int, heads: int, vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=seq, n_embd=width, n_head=heads, vocab_size=vocab,
                     use_cache=False, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).to(device).train()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    return model, {"input_ids": ids}


def build_llama(batch: int, seq: int, device: str, width: int, heads: int, vocab: int,
                kv_heads: int, layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=4 * width,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=seq, use_cache=False)
    model = LlamaForCausalLM(cfg).to(device).train()
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    return model, {"input_ids": ids}


def optimized(model, x, module, rewrite: str, on: bool):
    """Our store-all step with `module.rewrite` as it is (on) or doing nothing (off)."""
    keep = getattr(module, rewrite)
    if not on:
        setattr(module, rewrite, lambda gm, *args: [] if module is attention_masks else 0)
    try:
        return monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None)
    finally:
        setattr(module, rewrite, keep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--kv-heads", type=int, help="HF Llama with this many key/value heads")
    ap.add_argument("--layers", type=int, default=12, help="with --kv-heads")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    commit = git_commit()
    shape = (args.batch, args.seq, args.device, args.width, args.heads, args.vocab)
    if args.kv_heads:
        model, x = build_llama(*shape, args.kv_heads, args.layers)
        rewrite = (grouped_attention, "use_grouped_keys")
        kinds = ("keys repeated", "keys grouped")
        title = (f"HF Llama ({args.layers} layers, {args.width} wide, {args.heads} heads, "
                 f"{args.kv_heads} key/value heads, vocabulary {args.vocab}, batch {args.batch} "
                 f"x {args.seq}): the traced repeat of keys and values kept or not")
    else:
        model, x = build(*shape)
        rewrite = (attention_masks, "drop_constant_masks")
        kinds = ("mask kept", "mask dropped")
        title = (f"HF GPT-2 ({args.width} wide, {args.heads} heads, vocabulary {args.vocab}, "
                 f"batch {args.batch} x {args.seq}, no dropout): the traced causal mask kept or "
                 "dropped")
    methods = {"eager": model, **{f"store-all, {kind}": optimized(model, x, *rewrite, on=on)
                                  for kind, on in zip(kinds, (False, True))}}
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
    llama = f" --kv-heads {args.kv_heads} --layers {args.layers}" if args.kv_heads else ""
    print(f"# {title}\n")
    print(f"`python docs/benchmarks/attention_masks.py --device {args.device} --batch "
          f"{args.batch} --seq {args.seq} --rounds {args.rounds} --width {args.width} --heads "
          f"{args.heads} --vocab {args.vocab}{llama}`; {device_name(torch.device(args.device))}, "
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
