"""Our plans under CPU bfloat16 autocast against eager under the same autocast: the largest
gradient difference after one step, at the store-all plan and at the least peak, for small
torchvision and HF models (dropout left at each model's default; the Llama-family ones, with
grouped-query attention, given attention dropout 0.1). `--without-dropout-scale` turns NOTE
[Dropout's scale] off, `--without-grouped-math` NOTE [Grouped keys on the math path], for the
figures before them. Writes markdown to stdout.

    python docs/benchmarks/autocast_sweep.py [--without-dropout-scale] [--without-grouped-math]
        [--models a,b]
"""
from __future__ import annotations

import argparse
import copy

import torch

import monet_opt
from monet_opt import dropout_scale, grouped_math

HUGE = 1 << 40


def _torchvision(name: str, **kwargs):
    def build():
        import torchvision
        return (getattr(torchvision.models, name)(num_classes=10, **kwargs).train(),
                torch.randn(2, 3, 64, 64))
    return build


def _hf(kind: str):
    def build():
        import transformers as T
        ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(1))
        small = dict(num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                     vocab_size=300)
        if kind == "bert":
            return T.BertForMaskedLM(T.BertConfig(hidden_size=64, **small)).train(), \
                {"input_ids": ids}
        if kind == "t5":
            cfg = T.T5Config(d_model=64, num_layers=2, num_heads=4, d_ff=128, d_kv=16,
                             vocab_size=300, use_cache=False)
            return T.T5ForConditionalGeneration(cfg).train(), \
                {"input_ids": ids, "decoder_input_ids": ids}
        if kind == "vit":
            cfg = T.ViTConfig(hidden_size=64, image_size=32, patch_size=8,
                              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                              **{k: v for k, v in small.items() if k != "vocab_size"})
            return T.ViTForImageClassification(cfg).train(), torch.randn(2, 3, 32, 32)
        if kind == "gpt2":
            cfg = T.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=300,
                               use_cache=False)
            return T.GPT2LMHeadModel(cfg).train(), {"input_ids": ids}
        if kind in ("llama", "mistral", "qwen2"):  # 4 query heads, 2 key/value heads
            name = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}[kind]
            cfg = getattr(T, f"{name}Config")(hidden_size=64, num_key_value_heads=2,
                                                attention_dropout=0.1, use_cache=False,
                                                **small)
            return getattr(T, f"{name}ForCausalLM")(cfg).train(), {"input_ids": ids}
        raise ValueError(kind)
    return build


MODELS = {"resnet18": _torchvision("resnet18"), "mobilenet_v2": _torchvision("mobilenet_v2"),
          "efficientnet_b0": _torchvision("efficientnet_b0"), "swin_t": _torchvision("swin_t"),
          "convnext_tiny": _torchvision("convnext_tiny"),
          "googlenet": _torchvision("googlenet", aux_logits=False, init_weights=True),
          "gpt2": _hf("gpt2"), "bert": _hf("bert"), "t5": _hf("t5"), "hf_vit": _hf("vit"),
          "llama": _hf("llama"), "mistral": _hf("mistral"), "qwen2": _hf("qwen2")}


def _step(module, x) -> None:
    torch.manual_seed(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(**x) if isinstance(x, dict) else module(x)
    getattr(out, "logits", out).float().square().sum().backward()


def worst_difference(build, least: bool) -> tuple[float, int]:
    """(largest |gradient difference| from eager's, op runs recomputed) after one step."""
    torch.manual_seed(0)
    base, x = build()
    eager = copy.deepcopy(base)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1,
                                 profile_dir=None, time_limit_s=3)
        if least:
            opt = monet_opt.optimize(opt.model, x, opt.plan.min_feasible_bytes,
                                     profile_repeats=1, profile_dir=None, time_limit_s=3)
    _step(opt, x)
    _step(eager, x)
    worst = max((p.grad.float() - q.grad.float()).abs().max().item()
                for p, q in zip(opt.model.parameters(), eager.parameters())
                if p.grad is not None)
    return worst, opt.plan.recomputed_ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--without-dropout-scale", action="store_true")
    ap.add_argument("--without-grouped-math", action="store_true")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    if args.without_dropout_scale:
        dropout_scale.round_dropout_scales = lambda gm: 0
    if args.without_grouped_math:
        grouped_math.cast_before_repeat = lambda gm: 0
    torch.set_num_threads(1)
    print("| model | store-all: max abs gradient difference | least peak: max abs gradient "
          "difference (op runs recomputed) |\n|---|---|---|")
    for name in args.models.split(","):
        full, _ = worst_difference(MODELS[name], least=False)
        least, runs = worst_difference(MODELS[name], least=True)
        print(f"| {name} | {full:.3g} | {least:.3g} ({runs}) |", flush=True)


if __name__ == "__main__":
    main()
