"""optimize()'s own peak against a byte limit, on small HF transformers with dropout.

    PYTHONPATH=. python docs/benchmarks/optimize_peak.py [--tokens 96] [--shares 0.7,0.5,0.33]

For each model: the byte limit a share of its activations stands for (read from a first
optimize() with that share), then a fresh optimize() at that limit (profile_dir=None: it
profiles anew) measured as a whole by `measure_peak` (CPU allocation events; parameters,
buffers and the batch counted as resident), against the limit (NOTE [Profiling within the
limit] in monet_opt/profile_memory.py). Prints a markdown table.
"""
from __future__ import annotations

import argparse
import tempfile
import warnings

import torch
from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel,
                          LlamaConfig, LlamaForCausalLM)

import monet_opt

VOCAB = 300
MODELS = {
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(
        n_layer=3, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=128, resid_pdrop=0.1,
        embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False)),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=3, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=256, vocab_size=VOCAB, use_cache=False, attention_dropout=0.1)),
    "bert": lambda: BertForMaskedLM(BertConfig(
        num_hidden_layers=3, hidden_size=128, num_attention_heads=4, intermediate_size=256,
        vocab_size=VOCAB, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--shares", default="0.7,0.5,0.33")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, batch 2 x "
          f"{args.tokens} tokens\n")
    print("| model | limit | optimize() peak | under the limit by | plan's predicted peak |")
    print("|---|---|---|---|---|")
    cache = tempfile.mkdtemp()
    for name, make in MODELS.items():
        torch.manual_seed(0)
        model = make().train()
        ids = torch.randint(0, VOCAB, (2, args.tokens))
        batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
        resident = monet_opt.resident_tensors(model, batch)
        for share in map(float, args.shares.split(",")):
            limit = monet_opt.optimize(model, batch, f"{share:.0%} of activations",
                                       profile_dir=cache, time_limit_s=10).plan.memory_limit_bytes
            made = []
            peak = monet_opt.measure_peak(lambda: made.append(monet_opt.optimize(
                model, batch, limit, profile_dir=None, time_limit_s=10)), resident)
            print(f"| {name} | {limit:,} B ({share:.0%} of activations) | {peak:,} B | "
                  f"{limit - peak:,} B | {made[0].plan.predicted_peak_bytes:,} B |")


if __name__ == "__main__":
    main()
